#!/usr/bin/env bash
# Issue 59's closing rows on one warm H100: main at the issue's start (8e6ef02) against this tree, side by side through
# benchmarks/perf33_h100.py, in three calls that fit a 10-minute device command each (docs/perf-notes.md "Issue 59, the
# closing table on one machine"). Kept in the repository because ignored helper files do not survive a session.
#
#   bash benchmarks/issue59_closing_h100.sh prepare      # here, once: the base tree into .carry/base (.gitignore has it)
#   bash benchmarks/issue59_closing_h100.sh f59i         # on the device, carry [".carry/base"]; likewise f59j, f59k
#   bash benchmarks/issue59_closing_h100.sh f59n         # what session 11 left: f59n, then f59o on the same warm
#                                                        # machine, each with carry [".carry/base"]
#
# f59i: the fused decode kernels' logits check (llama-1b, llama-8b) and llama-1b batch 1 base/final (≈ 7 min);
# f59j: llama-8b batch 512 base/final, batch 1 fused and coordinate-descent pinned on the final (≈ 9 min);
# f59k: llama-8b batch 8 and 64 base/final (≈ 7 min).
# f59n, f59o: what session 11's run of the three left (docs/BENCHMARKS.md "Wave 5, session 11"). f59n: the fused
# kernels' logits check on llama-1b (its llama-8b check passed) and llama-1b batch 1 under `auto` on this tree (≈ 5
# min); f59o: llama-1b batch 1 on the base (the same card's baseline) and llama-8b batch 1 coordinate-descent pinned on
# this tree (≈ 5 min). Each step's limit plus the harness's grace after SIGTERM (joulebench.bounded_run, 60 s) fits
# the device's 600 s.
# Since session 12 the tracked tree plus .carry/base passes the 64 MiB a device call carries: move benchmarks/results
# outside the checkout for the calls and back after them (no call reads it; docs/BENCHMARKS.md "Wave 5, session 12").
# Each call writes its logs straight to $OUT (they come back even if the call is stopped at its limit), then
# $OUT/CALL.tgz (the harness's tables and records; no megatron data cache), and prints the harness's results.md.
set -euo pipefail
BASE_COMMIT=8e6ef02
CALL=${1:?prepare, f59i, f59j, f59k, f59n or f59o}

if [ "$CALL" = prepare ]; then
    rm -rf .carry/base && mkdir -p .carry/base
    git archive "$BASE_COMMIT" -- . ':!benchmarks/results' ':!docs' ':!tests' | tar -x -C .carry/base
    du -sb .carry/base
    exit 0
fi

: "${OUT:?set by the device tool}"
case "$CALL" in f59i | f59j | f59k | f59n | f59o) ;; *) echo "unknown call $CALL: prepare, f59i, f59j, f59k, f59n or f59o" >&2; exit 2 ;; esac
[ -d .carry/base ] || { echo "no .carry/base: run '$0 prepare' here and carry .carry/base" >&2; exit 2; }
export PYTHONUNBUFFERED=1
O=/tmp/$CALL
rm -rf "$O" && mkdir -p "$O"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv >"$OUT/$CALL-gpu.txt" 2>&1 || true

# A driver stopped by `timeout` finishes its record after SIGTERM: the next measurement waits for the GPU to be free.
gpu_free() {
    local waited=0
    while [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && [ $waited -lt 60 ]; do
        sleep 1
        waited=$((waited + 1))
    done
}

perf33=(python3 benchmarks/perf33_h100.py --out "$O/p" --trees base=.carry/base,final=.)
status=0
case "$CALL" in
    f59i)
        # llama-8b first: its logits check is the one a late timeout would cut
        timeout 220 python3 benchmarks/inference_engine_h100.py --presets llama-8b,llama-1b --engines static \
            --batch-sizes 1 --decode-tunings fused --steady-seconds 2 --out-dir "$O/logits-fused" \
            >"$OUT/$CALL-logits.log" 2>&1 || status=$?
        gpu_free
        timeout 320 "${perf33[@]}" --runs llama-1b-bs1 --timeout-s 150 >"$OUT/$CALL-perf33.log" 2>&1 || status=$?
        ;;
    f59j)
        timeout 560 "${perf33[@]}" --runs llama-8b-512,llama-8b-bs1-fused@final,llama-8b-bs1-coordinate-descent@final \
            --timeout-s 200 >"$OUT/$CALL-perf33.log" 2>&1 || status=$?
        ;;
    f59k)
        timeout 560 "${perf33[@]}" --runs llama-8b-8-64 --timeout-s 270 >"$OUT/$CALL-perf33.log" 2>&1 || status=$?
        ;;
    f59n)
        timeout 150 python3 benchmarks/inference_engine_h100.py --presets llama-1b --engines static \
            --batch-sizes 1 --decode-tunings fused --steady-seconds 2 --out-dir "$O/logits-fused" \
            >"$OUT/$CALL-logits.log" 2>&1 || status=$?
        gpu_free
        # `auto` at llama-1b batch 1 times three variants: 150 s did not hold it in session 11
        timeout 300 "${perf33[@]}" --runs llama-1b-bs1@final --timeout-s 230 >"$OUT/$CALL-perf33.log" 2>&1 || status=$?
        ;;
    f59o)
        timeout 560 "${perf33[@]}" --runs llama-1b-bs1@base,llama-8b-bs1-coordinate-descent@final --timeout-s 215 \
            >"$OUT/$CALL-perf33.log" 2>&1 || status=$?
        ;;
esac
gpu_free
(cd /tmp && find "$CALL" -name data_cache -prune -o -type f -print | tar czf "$OUT/$CALL.tgz" -T -)
tail -n 30 "$OUT/$CALL"-*.log
cat "$O/p/results.md" 2>/dev/null || true
exit "$status"
