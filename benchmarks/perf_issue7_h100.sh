#!/usr/bin/env bash
# Issue 7 lever sweep on one H100 in one device call: ResNet-50 compile modes, GPT-800M levers side by side
# under jpwr (short runs), optionally kernel-time profiles of one GPT and one ResNet-50 configuration. From the
# repository root:
#   OUT=/tmp/perf bash benchmarks/perf_issue7_h100.sh WHEEL_GLOB [LLM_CONFIGS] [RESNET_RUNS|none] [PROFILE_ARGS|none] \
#     [RESNET_PROFILE_ARGS|none]
# e.g. WHEEL_GLOB='.whl/megatron_core-0.16.1-*.whl'. PROFILE_ARGS are `python -m llm_training train` options added
# to --model 800M, RESNET_PROFILE_ARGS `python -m resnet50 train` options (e.g. '--compile --global-batch-size 256
# --precision bf16'); both profiles are benchmarks/kernel_profile.py. Writes under $OUT: gpu.txt, sweep.log,
# llm_results.md, llm.tgz (run records, jpwr summaries), resnet.tgz, prof.txt, prof_resnet.txt.
set -u
WHEEL=${1:?megatron-core wheel glob}
LLM_CONFIGS=${2:-bf16-mbs8,bf16-mbs16,bf16-mbs8-norope-fusion}
RESNET_RUNS=${3:-compile-cudagraphs}
PROFILE_ARGS=${4:-none}
RESNET_PROFILE_ARGS=${5:-none}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
python3 -m pip install -q --no-deps --target /tmp/site $WHEEL >>"$OUT/sweep.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
if [ "$RESNET_RUNS" != none ]; then
  timeout 130 python3 benchmarks/resnet50_h100.py --out /tmp/rn --only ${RESNET_RUNS//,/ } --warmup 30 \
    --iterations 200 >>"$OUT/sweep.log" 2>&1
  (cd /tmp && find rn -name trace.h5 -prune -o -type f -print | tar czf "$OUT/resnet.tgz" -T -)
fi
python3 benchmarks/llm_h100.py --configs "$LLM_CONFIGS" --iterations 10 --warmup-iterations 3 --log-interval 5 \
  --timeout-s 100 --out-dir /tmp/llm --tag issue7 >>"$OUT/sweep.log" 2>&1
cp /tmp/llm/results.md "$OUT/llm_results.md"
(cd /tmp && find llm -name trace.h5 -prune -o -type f \( -name '*.json' -o -name '*.md' \) -print \
  | tar czf "$OUT/llm.tgz" -T -)
if [ "$PROFILE_ARGS" != none ]; then
  timeout 90 python3 benchmarks/kernel_profile.py --workload llm --out "$OUT/prof.txt" -- --model 800M $PROFILE_ARGS \
    >>"$OUT/sweep.log" 2>&1
fi
if [ "$RESNET_PROFILE_ARGS" != none ]; then
  timeout 150 python3 benchmarks/kernel_profile.py --workload resnet50 --out "$OUT/prof_resnet.txt" -- \
    $RESNET_PROFILE_ARGS >>"$OUT/sweep.log" 2>&1
fi
grep -h "img/s\|images_per_s\|JOULEBENCH_RESULT" "$OUT/sweep.log" | cut -c1-300; cat "$OUT/llm_results.md"
