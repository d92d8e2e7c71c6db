"""Pieces the GPU benchmark scripts share: which GPUs a run may use, the printed table, argv splitting, the
independent read of the energy counter and a record's steady window beside it."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, SupportsFloat

from jpwr.output import fmt, write_atomic, write_json_atomic


def first_gpus_env(processes: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default os.environ) with CUDA_VISIBLE_DEVICES limited to `processes` devices.

    jpwr meters every device the job may use; without a restriction a 1-GPU run on a 2-GPU machine
    counts the idle second GPU in its energy (seen on nvidia-h200-x2, 2026-11-22: +80 W).

    A restriction the caller already set is kept, so sites and schedulers stay in control.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(processes)))
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's index order = NVML's, so jpwr meters the same GPUs
    return env


def gpu_uuids() -> list[str]:
    """Every GPU of this machine by NVML's index (PCI bus order)."""
    import pynvml

    pynvml.nvmlInit()
    return [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())]


def first_gpu_uuid(env: Mapping[str, str] | None = None) -> str:
    """The UUID of the one device a single-GPU script runs on and reads the counter of: the first entry of
    CUDA_VISIBLE_DEVICES in `env` (default os.environ; a UUID or its unique prefix, or an NVML index: PCI bus
    order), else NVML's first GPU. A script given its own GPU of a multi-GPU host (benchmarks/gpu_pool.py) reads
    that GPU's counter."""
    uuids = gpu_uuids()
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return uuids[0]
    first = visible.split(",")[0].strip()
    if first.isdigit() and int(first) < len(uuids):
        return uuids[int(first)]
    matches = [u for u in uuids if first and u.startswith(first)]
    if len(matches) != 1:
        raise SystemExit(f"CUDA_VISIBLE_DEVICES={visible!r}: its first entry names {len(matches)} of this machine's "
                         f"{len(uuids)} GPU(s) (indices 0-{len(uuids) - 1}, or {', '.join(uuids)})")
    return matches[0]


def steady_against_counter(record: Mapping[str, Any], poller: CounterPoller | None) -> dict[str, Any]:
    """A record's steady window (length, energy, relative bound) beside the independent counter read of the devices
    that window metered (n/a without a poller, or where the poller did not read those devices)."""
    steady = next((w for w in record.get("windows") or [] if w.get("name") == "steady"), None) or {}
    energy = steady.get("energy") or {}
    measured, bound = energy.get("energy_j"), energy.get("error_bound_j")
    row: dict[str, Any] = {"steady s": steady.get("duration_s"), "energy J": measured,
                           "bound %": None if not measured or bound is None else 100 * bound / measured}
    uuids = [d.get("uuid") for d in energy.get("per_device") or ()]
    if poller is None or not measured:
        return row
    if not uuids or not all(u in poller.reads for u in uuids):
        row["deviation %"] = "not compared: the record's devices were not read"
        return row
    try:
        independent, _ = poller.energy_j(steady["t_start_ns"], steady["t_end_ns"], uuids)
    except ValueError as exc:
        row["deviation %"] = f"not compared: {exc}"
    else:
        row["deviation %"] = 100 * (measured / independent - 1.0)
    return row


def markdown_table(rows: Sequence[Mapping[str, object]], header: Sequence[str], digits: int = 6) -> str:
    """Rows as a Markdown table; numbers through jpwr.output.fmt, so missing values print as n/a."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [_cell(row.get(label), digits) for label in header]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object, digits: int) -> str:
    """A table cell: a text as it is, a number through fmt (None is n/a), a numpy scalar as its float."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, int | float):
        return fmt(value, digits)
    if isinstance(value, SupportsFloat):
        return fmt(float(value), digits)
    return str(value)


QUEUE_AHEAD_CYCLES = 20_000_000  # the GPU spins ~10 ms before timed calls while the host queues them


def queued_seconds(call: Callable[[], object], repeats: int, warmup: int) -> float:
    """Mean seconds of one GPU call: `warmup` calls, then `repeats` queued behind a spinning kernel and timed by CUDA
    events, so the host's launch cost (a Triton launch from Python: tens of µs) is not counted as the kernels'
    (a CUDA graph replays the training step: launches are not the kernels' time there)."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


ROTATE_BYTES = 512 * 2**20  # matrices a timing cycles through: ten times an H100's 50 MB L2


def weight_copies(rows: int, columns: int) -> list[Any]:
    """Random bf16 (rows, columns) matrices on the GPU, enough of them (ROTATE_BYTES) that a timing cycling through
    them finds none in L2 from its previous read: a weight read is then timed from memory, as in a model's step."""
    import torch

    copies = max(1, -(-ROTATE_BYTES // (rows * columns * 2)))
    return [torch.randn(rows, columns, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def write_results(out: Path, markdown: str, payload: Mapping[str, object] | Sequence[object]) -> None:
    """results.md and results.json under `out`, each written whole by an atomic rename: a script that rewrites them
    after every step loses nothing already written when a later step fails. The payload is the script's own JSON: an
    object, or the list of its rows where that is what results.json holds (benchmarks/scaling_h200x2.py reads
    llm_h100's as a list)."""
    write_atomic(out / "results.md", markdown)
    write_json_atomic(out / "results.json", payload)


def exit_status(rows: Sequence[Any], ok: Callable[[Any], bool] = lambda row: row.get("status") == "OK") -> int:
    """The script's exit code: 0 when it has rows and every one succeeded (`ok`), else 1, so that a sweep whose only
    row failed does not end 0 (a shell's `&&`, gpu_pool.py and CI read the code; the table says which row)."""
    return 0 if rows and all(ok(row) for row in rows) else 1


def unless_given(defaults: Sequence[str], argv: Sequence[str]) -> list[str]:
    """`defaults` (a script's own options for a driver, `--option value` pairs and flags) less those `argv` gives
    itself, then `argv`: the drivers refuse an option given twice with different values (issue 61), so a value the
    user passes after `--` replaces the script's instead of following it."""
    given = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    kept: list[str] = []
    skipping = False
    for word in defaults:
        if word.startswith("--"):
            skipping = word.split("=", 1)[0] in given
        if not skipping:
            kept.append(word)
    return [*kept, *argv]


def split_at_double_dash(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the script's own options, the workload driver's options): argv split at its first `--`."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return argv[:split], argv[split + 1:]


class Poller:
    """A daemon thread of this process calling `read_once()` every `gap_s` seconds while the context is open: the
    scripts' own reads of NVML beside a run, no jpwr code involved."""

    def __init__(self, name: str, gap_s: float) -> None:
        import threading

        self.gap_s = gap_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def read_once(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.gap_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class CounterPoller(Poller):
    """An independent reference: NVML's energy counter read by a thread of this process, no jpwr code involved.

    Reads every device's `nvmlDeviceGetTotalEnergyConsumption` back to back (a read costs ~4 ms on the
    H100 VMs), each stamped with CLOCK_MONOTONIC before and after, the clock the run record's window
    edges use on the same host. `energy_j` interpolates the counter at two instants: each new value
    becomes a knot midway between the read that first showed it and the read before; between knots
    the counter is taken as linear. Its own uncertainty (the knots' half-widths times the power there)
    is returned beside the energy.
    """

    def __init__(self, uuids: Sequence[str] | None = None, gap_s: float = 0.002) -> None:
        import pynvml

        super().__init__("independent-counter", gap_s)
        self._nv = pynvml
        pynvml.nvmlInit()
        if uuids is None:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        self.handles = {uuid: pynvml.nvmlDeviceGetHandleByUUID(uuid) for uuid in uuids}
        self.reads: dict[str, list[tuple[int, int, int]]] = {uuid: [] for uuid in self.handles}  # t0, t1, mJ

    def read_once(self) -> None:
        for uuid, handle in self.handles.items():
            t0 = time.monotonic_ns()
            value = self._nv.nvmlDeviceGetTotalEnergyConsumption(handle)
            self.reads[uuid].append((t0, time.monotonic_ns(), int(value)))

    def energy_j(self, t0_ns: int, t1_ns: int, uuids: Sequence[str] | None = None) -> tuple[float, float]:
        """(energy over [t0, t1] summed over the devices, its uncertainty), both in J."""
        total = uncertainty = 0.0
        for uuid in uuids or list(self.reads):
            knots_t, knots_e, halves = [], [], []
            reads = self.reads[uuid]
            for (a0, a1, ea), (b0, b1, eb) in itertools.pairwise(reads):
                if eb != ea:
                    mid_a, mid_b = (a0 + a1) / 2, (b0 + b1) / 2
                    knots_t.append((mid_a + mid_b) / 2)
                    knots_e.append(eb / 1000.0)
                    halves.append((mid_b - mid_a) / 2)
            if len(knots_t) < 2 or not knots_t[0] <= t0_ns < t1_ns <= knots_t[-1]:
                raise ValueError(f"the independent counter reads of {uuid} do not span the window")
            for t, sign in ((t0_ns, -1.0), (t1_ns, 1.0)):
                j = max(i for i, k in enumerate(knots_t) if k <= t)
                j = min(j, len(knots_t) - 2)
                f = (t - knots_t[j]) / (knots_t[j + 1] - knots_t[j])
                total += sign * (knots_e[j] + f * (knots_e[j + 1] - knots_e[j]))
                power = (knots_e[j + 1] - knots_e[j]) / ((knots_t[j + 1] - knots_t[j]) / 1e9)
                uncertainty += power * max(halves[j], halves[j + 1]) / 1e9
        return total, uncertainty


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
