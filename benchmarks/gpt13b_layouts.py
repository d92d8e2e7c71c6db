"""GPT-13B on one 4-GPU node in three layouts, each metered by jpwr against an independent read of every GPU (issue 43).

    python benchmarks/gpt13b_layouts.py --out $OUT/gpt13b --device-memory-gib 79.6 -- --iterations 6 \\
        --warmup-iterations 2

A layout TPxPP (default 2x2, 4x1 and 2x1, i.e. TP=2×PP=2, TP=4 and DP=2×TP=2 on 4 GPUs) first goes through
`llm_training validate` with --device-memory-gib: one the memory estimate refuses is a row `refused` with the
refusal's text (estimate and capacity) and is not launched. The others run `llm_training train --model 13B` under
`jpwr --methods nvml` with torchrun (one process per GPU), one after another, all at the same --global-batch-size
(128: one 4-GPU node's weak-scaling share of the JUBE profile's 5632 on 44 nodes) and the preset's MBS 2. A thread of
this process reads every GPU's energy counter on its own (benchmarks.common.CounterPoller) and NVML's used memory
of each GPU (its peak per rank, beside the record's rank-0 peak allocated and the estimate). Arguments after `--` go
to every validate and run. Prints one `LAYOUT {json}` line per layout and one Markdown table (also table.md in
--out); exit 1 if a launched layout fails or its energy deviates beyond --target.
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

from benchmarks.common import (  # noqa: E402
    CounterPoller,
    Poller,
    first_gpus_env,
    markdown_table,
    split_at_double_dash,
    unless_given,
)
from joulebench.bounded_run import run_bounded  # noqa: E402

MODEL = "13B"
ARGPARSE_USAGE = 2  # validate could not parse the options: no estimate either
HEADER = ("layout", "status", "tokens/s", "MFU", "tokens/Wh", "loss first", "loss last", "estimate GiB",
          "peak allocated GiB (rank 0)", "peak used GiB per GPU", "record J", "independent J", "deviation %", "note")


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """'2x2,4x1' -> [(2, 2), (4, 1)]: tensor x pipeline parallel sizes; the data-parallel size is what is left."""
    layouts = []
    for part in text.split(","):
        tp, sep, pp = part.strip().partition("x")
        if not sep or not tp.isdigit() or not pp.isdigit() or int(tp) < 1 or int(pp) < 1:
            raise argparse.ArgumentTypeError(f"layout {part!r} is not TPxPP (e.g. 2x2)")
        layouts.append((int(tp), int(pp)))
    return layouts


def layout_name(tp: int, pp: int, gpus: int) -> str:
    return f"DP{gpus // (tp * pp)}-TP{tp}-PP{pp}"


def layout_options(tp: int, pp: int, args: argparse.Namespace) -> list[str]:
    """The driver options every command of a layout shares."""
    return unless_given(["--model", MODEL, "--tensor-parallel", str(tp), "--pipeline-parallel", str(pp),
                         "--global-batch-size", str(args.global_batch_size)], args.driver_args)


def validate_command(tp: int, pp: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "llm_training", "validate", *layout_options(tp, pp, args), "--nodes", "1",
            "--devices-per-node", str(args.gpus), "--device-memory-gib", str(args.device_memory_gib)]


def train_command(tp: int, pp: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "jpwr", "--methods", "nvml", "--out", str(run_dir / "jpwr"), "--",
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.gpus),
            "-m", "llm_training", "train", *layout_options(tp, pp, args), "--out-dir", str(run_dir / "run")]


class MemoryPoller(Poller):
    """NVML's used memory of each GPU (context, allocator cache and all), its peak kept per GPU: every rank's peak,
    where the record has only rank 0's allocated peak. A thread of its own, apart from the energy reads."""

    def __init__(self, handles: dict[str, Any], gap_s: float = 0.5) -> None:
        import pynvml

        super().__init__("memory-used", gap_s)
        self._nv, self._handles = pynvml, handles
        self.peak_gib: dict[str, float] = {}

    def reset(self) -> None:
        self.peak_gib = {}

    def read_once(self) -> None:
        for uuid, handle in self._handles.items():
            used = self._nv.nvmlDeviceGetMemoryInfo(handle).used / 1024**3
            self.peak_gib[uuid] = max(used, self.peak_gib.get(uuid, 0.0))


def _estimate_gib(tp: int, pp: int, args: argparse.Namespace) -> float:
    """The driver's own memory estimate per GPU for the layout (its options already passed validate's parser)."""
    from llm_training.cli import build_parser
    from llm_training.config import resolve
    from llm_training.memory import estimate_memory

    cfg = resolve(build_parser().parse_args(["train", *layout_options(tp, pp, args)]), args.gpus)
    return estimate_memory(cfg).total_gib


def _record_row(record: dict[str, Any]) -> dict[str, Any]:
    metrics = record.get("metrics") or {}
    losses = [point["loss"] for point in metrics.get("loss_curve") or []]
    return {"status": record.get("status"), "tokens/s": metrics.get("tokens_per_s"), "MFU": metrics.get("mfu"),
            "tokens/Wh": metrics.get("tokens_per_wh"), "loss first": losses[0] if losses else None,
            "loss last": losses[-1] if losses else None,
            "peak allocated GiB (rank 0)": metrics.get("peak_memory_allocated_gib"),
            "note": record.get("status_reason") or ""}


def run_layout(tp: int, pp: int, args: argparse.Namespace, energy: CounterPoller, memory: MemoryPoller,
               uuids: list[str]) -> dict[str, Any]:
    name = layout_name(tp, pp, args.gpus)
    run_dir = args.out / name
    check = subprocess.run(validate_command(tp, pp, args), cwd=REPO, capture_output=True, text=True, check=False)
    said = check.stderr.strip().splitlines()[-1] if check.stderr.strip() else f"exit {check.returncode}"
    if check.returncode == ARGPARSE_USAGE:
        return {"layout": name, "status": "invalid options", "note": said}
    row: dict[str, Any] = {"layout": name, "estimate GiB": _estimate_gib(tp, pp, args)}
    if check.returncode != 0:
        return {**row, "status": "refused", "note": said}
    command = train_command(tp, pp, args, run_dir)
    env = first_gpus_env(args.gpus)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)  # the GPUs both pollers read, whatever their indices
    run_dir.mkdir(parents=True, exist_ok=True)
    memory.reset()
    started = time.monotonic()
    with open(run_dir / "log.txt", "w") as log:
        code = run_bounded(command, args.timeout_s, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    row.update({"exit": code, "wall_s": time.monotonic() - started, "command": " ".join(command),
                "peak used GiB per GPU": " / ".join(f"{memory.peak_gib.get(u, float('nan')):.1f}" for u in uuids)})
    paths = sorted((run_dir / "run").rglob("run_record.json"))
    if not paths:
        return {**row, "status": "no record"}
    record = json.loads(paths[0].read_text())
    row.update(_record_row(record))
    steady = next((w for w in record.get("windows", []) if w["name"] == "steady"), None)
    recorded = ((steady or {}).get("energy") or {}).get("energy_j")
    if steady is None or recorded is None:
        return row
    independent, uncertainty = energy.energy_j(steady["t_start_ns"], steady["t_end_ns"], uuids)
    return {**row, "record J": recorded, "independent J": independent, "independent_uncertainty_j": uncertainty,
            "deviation %": 100 * (recorded / independent - 1.0)}


def build_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpt13b_layouts"))
    parser.add_argument("--layouts", type=parse_layouts, default=parse_layouts("2x2,4x1,2x1"),
                        help="comma list of TPxPP on --gpus GPUs (default: TP=2xPP=2, TP=4, DP=2xTP=2)")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs of the node, all used by every layout")
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--device-memory-gib", type=float, default=79.6,
                        help="for validate's memory check (79.6: what torch reports for an 80 GB H100)")
    parser.add_argument("--target", type=float, default=0.5, help="largest |deviation| in %% of a launched layout")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="per layout")
    own, driver = split_at_double_dash(argv)
    args = parser.parse_args(own)
    args.driver_args = driver
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = build_arguments(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with CounterPoller() as energy:
        uuids = list(energy.handles)[:args.gpus]
        with MemoryPoller({u: energy.handles[u] for u in uuids}) as memory:
            for tp, pp in args.layouts:
                row = run_layout(tp, pp, args, energy, memory, uuids)
                rows.append(row)
                print("LAYOUT " + json.dumps(row, default=str), flush=True)
    table = markdown_table(rows, HEADER, digits=4)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    launched = [r for r in rows if r.get("status") != "refused"]
    good = all(r.get("status") == "OK" and r.get("deviation %") is not None and abs(r["deviation %"]) <= args.target
               for r in launched)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
