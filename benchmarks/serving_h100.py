"""The continuous-batching engine against the static engine on one GPU, every window against an independent counter.

    python benchmarks/serving_h100.py --out /tmp/serving --runs static,max8,max256 --batch-sizes 8,256
    python benchmarks/serving_h100.py --out /tmp/serving --runs tokens,static,c1 --batch-sizes 1
    python benchmarks/serving_h100.py --out /tmp/serving --runs sweep --rates 2,4,8,16,max
    python benchmarks/serving_h100.py --out $OUT/issue60 --runs sweep --rates 4,8,16,32,max --window-s default \
        --no-slo     # issue 60's sweep: the driver's default windows, exactly `load ... --energy-methods nvml`

Runs (each a separate `python -m llm_inference` process metering in-process with NVML, llama-8b, chat):
* tokens: the captured, compiled decode steps of the continuous engine on CUDA (gpt2 shape, fp32) against the
  static engine generating each request alone: how many requests get identical greedy tokens;
* static: `run --batch-sizes 1,8,256` (the static engine, one record per batch size);
* max8 / max256 / c1 / maxN: `load --rate max --max-concurrency 8 | 256 | 1 | N`;
* sweep: `load --rates ... --max-concurrency 256` (Poisson arrivals), one record per rate.
A thread of this process reads the GPU's energy counter throughout (benchmarks.common.CounterPoller); each
record's `steady` window is compared with it. Prints one `SERVING {json}` line per record and a Markdown table;
the same lines go to <out>/serving_rows.jsonl as each run ends, and the counter's reads (monotonic ns before and
after each read, mJ) to <out>/independent_counter.npz, so the comparison can be redone from the files. A sweep's
records, request tables and in-process traces under <out>/sweep are what benchmarks/joint_fit_replay.py reads.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from a checkout

from benchmarks.common import (  # noqa: E402 (needs REPO on sys.path)
    CounterPoller,
    exit_status,
    first_gpu_uuid,
    first_gpus_env,
    markdown_table,
)
from joulebench.bounded_run import run_bounded  # noqa: E402

MODEL = ["--preset", "llama-8b", "--task", "chat", "--energy-methods", "nvml"]  # + --steady-seconds (--window-s)
ROWS_FILE, READS_FILE = "serving_rows.jsonl", "independent_counter.npz"
HEADER = ("run", "status", "slots/batch", "rate", "tokens/s", "J/output token", "bound %", "deviation %",
          "TPOT p50 ms", "TTFT p90 ms", "mean rows", "window s")


def window_seconds(text: str) -> float | None:
    """--window-s: seconds, or `default` (None: no --steady-seconds, the driver sizes each window itself)."""
    return None if text == "default" else float(text)


def save_reads(poller: CounterPoller, path: Path) -> None:
    """The independent counter's reads, per device (its UUID): read start and end (monotonic ns) and the value (mJ)."""
    import numpy as np

    arrays = {uuid: np.array(reads, dtype=np.int64).reshape(-1, 3) for uuid, reads in poller.reads.items()}
    # numpy's stub checks a `**` mapping against its keyword `allow_pickle: bool` as well (numpy >= 2.1; passing it
    # would store an array of that name on 1.x, which pyproject allows): the names here are device UUIDs
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    model = [*MODEL, *([] if args.window_s is None else ["--steady-seconds", str(args.window_s)])]
    load = ["-m", "llm_inference", "load", *model]
    slo = [] if args.no_slo else ["--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms)]
    runs = {"static": ["-m", "llm_inference", "run", *model, "--batch-sizes", args.batch_sizes],
            "c1": [*load, "--rate", "max", "--max-concurrency", "1"],
            "sweep": [*load, "--rates", args.rates, "--max-concurrency", str(args.sweep_slots), *slo]}
    for slots in (8, 256, *args.max_slots):
        runs[f"max{slots}"] = [*load, "--rate", "max", "--max-concurrency", str(slots)]
    return runs


def token_check() -> dict[str, Any]:
    """Greedy tokens of the captured continuous engine vs the static engine alone (gpt2 shape, fp32, CUDA)."""
    import torch

    from llm_inference.arrivals import Request
    from llm_inference.continuous_engine import ContinuousEngine
    from llm_inference.engine import build_model, request_prompt
    from llm_inference.presets import PRESETS
    from llm_inference.serve_loop import ServeLoop
    from llm_inference.static_engine import StaticEngine
    from llm_inference.tasks import Batch
    from llm_inference.window_rules import ArrivalWindow

    cuda, shape = torch.device("cuda"), PRESETS["gpt2"]
    items = [Request(i, 0.0, 20 + 13 * i % 90, 5 + 17 * i % 70) for i in range(24)]
    engine = ContinuousEngine.from_transformers(build_model(shape, None, "fp32", "sdpa", cuda, 3), cuda)
    setup = engine.prepare(6, max(r.input_tokens + r.output_tokens for r in items))
    loop = ServeLoop(engine, 6, lambda r: request_prompt(r, shape.vocab_size, 3), keep_tokens=True, log=print)
    log = loop.run(iter(items), ArrivalWindow(0.0, 0.0), lambda: None, lambda _: None, lambda: None, len(items))
    static = StaticEngine.from_transformers(build_model(shape, None, "fp32", "sdpa", cuda, 3), cuda)
    same = 0
    for r in items:
        prompt = request_prompt(r, shape.vocab_size, 3).to(cuda)
        static.prepare([Batch((r.input_tokens,), r.output_tokens)])
        alone = static.generate({"input_ids": prompt[None], "attention_mask": torch.ones_like(prompt)[None]},
                                r.output_tokens)[0].tolist()
        same += log.tokens is not None and log.tokens[r.id] == alone
    return {"run": "tokens", "status": f"{same}/{len(items)} requests identical", "identical": same == len(items),
            "setup_s": setup,
            "graphs": engine.describe()["captured_graphs"]}


def rows_of(name: str, run_dir: Path, uuid: str, poller: CounterPoller) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(run_dir.rglob("run_record.json")):
        record = json.loads(path.read_text())
        m = record["metrics"]
        steady = next((w for w in record["windows"] if w["name"] == "steady"), None)
        row: dict[str, Any] = {"run": f"{name}/{path.parent.name}", "status": record["status"],
                               "reason": record.get("status_reason"), "record": str(path)}
        if steady is None:
            rows.append(row)
            continue
        energy = steady["energy"] or {}
        independent, uncertainty = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], [uuid])
        measured = energy.get("energy_j")
        tokens = steady["work"].get("output_tokens")
        row.update({
            "slots/batch": m.get("max_concurrency") or m.get("batch_size"), "rate": m.get("rate"),
            "tokens/s": m.get("output_tokens_per_s"),
            "J/output token": measured / tokens if measured and tokens else None,
            "bound %": 100 * energy["error_bound_j"] / measured if measured else None,
            "deviation %": 100 * (measured / independent - 1) if measured else None,
            "independent_j": independent, "independent_uncertainty_j": uncertainty, "record_j": measured,
            "TPOT p50 ms": 1e3 * (m.get("tpot_p50_s") or m.get("per_token_latency_median_s") or float("nan")),
            "TTFT p90 ms": 1e3 * (m.get("ttft_p90_s") or float("nan")), "mean rows": m.get("mean_decode_rows"),
            "window s": steady["duration_s"], "metrics": {k: v for k, v in m.items() if not isinstance(v, dict | list)},
            "requests": record.get("requests"), "engine": record["config"].get("engine_detail")})
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="serving")
    parser.add_argument("--runs", default="tokens,static,max8,max256,c1")
    parser.add_argument("--rates", default="2,4,8,16,max")
    parser.add_argument("--batch-sizes", default="1,8,256", help="of the static run")
    parser.add_argument("--window-s", type=window_seconds, default=20.0,
                        help="--steady-seconds of every run; `default`: none given (the driver's own window rule)")
    parser.add_argument("--sweep-slots", type=int, default=256)
    parser.add_argument("--max-slots", type=lambda t: [int(x) for x in t.split(",") if x], default=[])
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    parser.add_argument("--no-slo", action="store_true", help="the sweep without --slo-ttft-ms/--slo-tpot-ms")
    parser.add_argument("--timeout-s", type=float, default=540.0,
                        help="per run: a run still going is stopped, the records it finished compared and kept")
    args = parser.parse_args(argv)
    uuid = first_gpu_uuid()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    table = commands(args)
    rows: list[dict[str, Any]] = []
    with CounterPoller([uuid]) as poller:
        for name in args.runs.split(","):
            started = time.monotonic()
            if name == "tokens":
                found = [token_check()]
            else:
                env = {**first_gpus_env(1), "CUDA_VISIBLE_DEVICES": uuid, "PYTHONUNBUFFERED": "1"}
                command = [sys.executable, *table[name], "--out-dir", str(out / name)]
                with open(out / f"{name}.log", "w") as log:
                    code = run_bounded(command, args.timeout_s, env=env, cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT)
                if isinstance(code, str):  # stopped: the records it finished are still compared
                    print(f"{name}: {code} (--timeout-s)", flush=True)
                found = rows_of(name, out / name, uuid, poller) or [{"run": name, "status": "no record"}]
                for row in found:
                    row["command"] = " ".join(command)
            for row in found:
                row["wall_s"] = time.monotonic() - started
                print("SERVING " + json.dumps(row), flush=True)
                with open(out / ROWS_FILE, "a") as kept:
                    kept.write(json.dumps(row) + "\n")
            rows.extend(found)
        save_reads(poller, out / READS_FILE)
    print(markdown_table(rows, HEADER, digits=4))
    return exit_status(rows, lambda row: row.get("status") == "OK" or row.get("identical") is True)


if __name__ == "__main__":
    sys.exit(main())
