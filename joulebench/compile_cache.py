"""Where torch.compile keeps what it built between runs: inductor's FX-graph and AOTAutograd caches, Triton's kernels.

Why: a cold compile of the README's ResNet-50 took 255 s on an H100 before its first measured step (issue 58). A
second process that finds the first one's caches loads the compiled graphs and kernels instead of building them.
One directory holds both caches, DIR/inductor (TORCHINDUCTOR_CACHE_DIR) and DIR/triton (TRITON_CACHE_DIR), so that
one option moves them together and JUBE jobs on one node share them (jube/job.sh exports JOULEBENCH_COMPILE_CACHE).

`--compile-cache DIR` (default: $JOULEBENCH_COMPILE_CACHE, else $XDG_CACHE_HOME/joulebench/compile, i.e.
~/.cache/joulebench/compile); `none`: a fresh empty directory for this process, removed at its exit (a cold compile:
nothing reused, nothing left behind). The run record's `metrics.compile_cache` says which and what was reused.

Where a compile's seconds go (FirstStepCompile): torch times its own compile phases (torch._dynamo.utils'
`compilation_time_metrics`, seconds of each timed call, per process); read around the first training step, where the
compile happens, they split `metrics.first_step_s` into dynamo's tracing, AOTAutograd, inductor, the cache loads,
Triton's autotuning and the rest (the step's execution, cuDNN's benchmark search, allocator growth), so that a
record alone tells which part a warm run still pays (issue 58: 75 s warm of 233 s cold on an H100).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from jpwr import ValidationError

ENV = "JOULEBENCH_COMPILE_CACHE"
NONE = "none"
INDUCTOR_ENV, TRITON_ENV = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"
# torch._dynamo.utils.counters: (group, key) of each cache's hits and misses, as torch 2.14 counts them
COUNTERS = {"fx_graph_hits": ("inductor", "fxgraph_cache_hit"), "fx_graph_misses": ("inductor", "fxgraph_cache_miss"),
            "autograd_hits": ("aot_autograd", "autograd_cache_hit"),
            "autograd_misses": ("aot_autograd", "autograd_cache_miss")}


class CompileCacheFigures(TypedDict):
    """The record's `metrics.compile_cache`: the directory (null for `none`) and this process's cache lookups."""

    dir: str | None
    fx_graph_hits: int
    fx_graph_misses: int
    autograd_hits: int
    autograd_misses: int


def default_dir() -> str:
    """$JOULEBENCH_COMPILE_CACHE, else the per-user cache directory of the XDG convention."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "joulebench" / "compile")


def add_compile_cache_argument(group: Any) -> None:
    """`--compile-cache DIR|none` on a parser or argument group (the drivers that torch.compile)."""
    group.add_argument("--compile-cache", default=None, metavar="DIR",
                       help=f"directory of inductor's and Triton's compile caches, reused by later runs (default: "
                            f"${ENV}, else ~/.cache/joulebench/compile; {NONE}: a fresh one removed at exit)")


@dataclasses.dataclass(frozen=True)
class CompileCache:
    """The caches of one process: `directory` None for `none` (then `root` is a temporary directory)."""

    directory: Path | None
    root: Path

    def activate(self) -> None:
        """Point inductor and Triton at `root` and turn inductor's persistent caches on. Before the first compile:
        torch reads the directories when it first compiles, and its compile workers inherit them."""
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        os.environ[INDUCTOR_ENV] = str(self.root / "inductor")
        os.environ[TRITON_ENV] = str(self.root / "triton")
        inductor_config.fx_graph_cache = True
        functorch_config.enable_autograd_cache = True
        _BASELINE.clear()
        _BASELINE.update(_lookups())

    def figures(self) -> CompileCacheFigures:
        """Hits and misses since `activate` (the counters are per process), for the record."""
        now = _lookups()
        counts = {name: now[name] - _BASELINE.get(name, 0) for name in COUNTERS}
        return CompileCacheFigures(dir=None if self.directory is None else str(self.directory),
                                   fx_graph_hits=counts["fx_graph_hits"], fx_graph_misses=counts["fx_graph_misses"],
                                   autograd_hits=counts["autograd_hits"], autograd_misses=counts["autograd_misses"])


_BASELINE: dict[str, int] = {}


def _lookups() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: int(counters[group][key]) for name, (group, key) in COUNTERS.items()}


T = TypeVar("T")
# torch's dynamo_timed keys (compilation_time_metrics), as torch 2.14 names them; its phase names in the comments
FRAME = "_compile.compile_inner"  # entire_frame_compile: dynamo's compile of a frame, its backend call included
BACKEND = "OutputGraph.call_user_compiler"  # backend_compile: AOTAutograd and inductor on the forward, from dynamo
BACKWARD = "backward._backward_impl"  # entire_backward_compile: the backward graph's lazy compile at the first backward
INDUCTOR = "compile_fx_inner"  # inductor_compile: one graph's lowering, code generation and kernel compiles
CACHE_LOAD = "AOTAutogradCache.inductor_load"  # an AOTAutograd cache hit: the compiled graphs and kernels loaded
BENCHMARK_ALL, COORDESC = "CachingAutotuner.benchmark_all_configs", "CachingAutotuner.coordinate_descent_tuning"
# runtime_triton_autotune: a Triton kernel's tuning at its first launch, where no cached winner exists
AUTOTUNE = (BENCHMARK_ALL, COORDESC, "CachingAutotuner.combo_sequential_autotune")
TIMED = (FRAME, BACKEND, BACKWARD, INDUCTOR, CACHE_LOAD, *AUTOTUNE)


def frame_compiles() -> int:
    """Frames dynamo compiled in this process so far (every compile, any caller's): read at the end of a set-up and
    again later, the difference says whether anything compiled inside a window."""
    from torch._dynamo.utils import compilation_time_metrics

    return len(compilation_time_metrics.get(FRAME, []))


class CompilePhases(TypedDict):
    """The record's `metrics.compile_phases_s`: the first step's seconds by what torch timed (docs/run-record.md);
    disjoint, so they sum to `first_step_s` with `rest`."""

    dynamo: float
    aot_autograd: float
    inductor: float
    cache_load: float
    triton_autotune: float | None  # None where inductor generates no Triton kernels (the CPU)
    rest: float


class CompileAutotune(TypedDict):
    """The record's `metrics.compile_autotune`: the first step's Triton autotuning, what the autotune cache spared."""

    kernels_benchmarked: int  # kernels whose launch configs were benchmarked (no cached winner)
    kernels_coordesc_tuned: int  # kernels tuned by coordinate descent (no cached coordinate-descent winner)
    coordesc_benchmarks: int  # launch configs coordinate descent benchmarked


@dataclasses.dataclass(frozen=True)
class _TorchTimers:
    """torch's compile timers at one moment: seconds and calls per TIMED key, coordinate descent's benchmarks."""

    seconds: dict[str, float]
    calls: dict[str, int]
    coordesc_benchmarks: int

    @classmethod
    def now(cls) -> _TorchTimers:
        from torch._dynamo.utils import compilation_time_metrics, counters

        timed = {key: compilation_time_metrics.get(key, []) for key in TIMED}
        seconds = {key: sum(values, 0.0) for key, values in timed.items()}
        calls = {key: len(values) for key, values in timed.items()}
        return cls(seconds, calls, int(counters["inductor"]["coordesc_tuning_bench"]))

    def minus(self, before: _TorchTimers) -> _TorchTimers:
        return _TorchTimers({key: self.seconds[key] - before.seconds[key] for key in TIMED},
                            {key: self.calls[key] - before.calls[key] for key in TIMED},
                            self.coordesc_benchmarks - before.coordesc_benchmarks)


class FirstStepCompile:
    """torch's compile timers around the first training step, where torch.compile traces, compiles or loads from the
    caches, and tunes: `wrap` the step; `phases` and `autotune` for the record. `triton`: inductor generates Triton
    kernels (CUDA), so their runtime autotuning applies (n/a on the CPU). Read once the first step returns: a later
    recompile (a phase replay's) is not the compile a user waits for."""

    def __init__(self, triton: bool) -> None:
        self.triton = triton
        self._spent: _TorchTimers | None = None

    def wrap(self, step: Callable[[], T]) -> Callable[[], T]:
        """`step`, with torch's timers read before and after its first call (host work: the compile and autotune
        are done when the call returns; the device's queue runs on, inside first_step_s's sync)."""
        def timed_first() -> T:
            if self._spent is not None:
                return step()
            before = _TorchTimers.now()
            handle = step()
            self._spent = _TorchTimers.now().minus(before)
            return handle
        return timed_first

    def phases(self, first_step_s: float | None) -> CompilePhases | None:
        """`first_step_s` split by torch's timers; None before a first step ended, or where torch timed no frame
        compile in it (n/a, not 0). Each torch phase's seconds less those of the phases it calls: dynamo's frame
        compile less its backend call; AOTAutograd's (the forward's backend call and the lazy backward compile) less
        inductor's compiles and the cache loads inside it."""
        spent = self._spent
        if spent is None or first_step_s is None or not spent.calls[FRAME]:
            return None
        sec = spent.seconds
        dynamo = sec[FRAME] - sec[BACKEND]
        aot_autograd = sec[BACKEND] + sec[BACKWARD] - sec[INDUCTOR] - sec[CACHE_LOAD]
        autotune = sum(sec[key] for key in AUTOTUNE) if self.triton else None
        rest = first_step_s - dynamo - aot_autograd - sec[INDUCTOR] - sec[CACHE_LOAD] - (autotune or 0.0)
        return CompilePhases(dynamo=round(dynamo, 3), aot_autograd=round(aot_autograd, 3),
                             inductor=round(sec[INDUCTOR], 3), cache_load=round(sec[CACHE_LOAD], 3),
                             triton_autotune=None if autotune is None else round(autotune, 3), rest=round(rest, 3))

    def autotune(self) -> CompileAutotune | None:
        """The first step's Triton autotuning; None without Triton kernels or before a first step ended."""
        if self._spent is None or not self.triton:
            return None
        calls = self._spent.calls
        return CompileAutotune(kernels_benchmarked=calls[BENCHMARK_ALL], kernels_coordesc_tuned=calls[COORDESC],
                               coordesc_benchmarks=self._spent.coordesc_benchmarks)


def check(value: str | None) -> CompileCache:
    """Resolve `--compile-cache` (None: the default) and refuse, before any work, a path that cannot hold the caches:
    a file, or a directory that cannot be created or written. Creates the directory. $JOULEBENCH_COMPILE_CACHE may say
    `none` too (a JUBE profile's cold run)."""
    value = value or default_dir()
    if value == NONE:
        root = Path(tempfile.mkdtemp(prefix="joulebench-compile-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        return CompileCache(None, root)
    path = Path(value).expanduser().absolute()
    fix = f"pass --compile-cache with a writable directory (or {NONE} for a fresh one), or set {ENV}"
    if path.exists() and not path.is_dir():
        raise ValidationError(f"--compile-cache {path} is a file, not a directory", fix)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValidationError(f"--compile-cache {path} cannot be created ({exc.strerror})", fix) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValidationError(f"--compile-cache {path} is not writable by this user", fix)
    return CompileCache(path, path)


def compile_seconds(warmup_duration_s: float | None, compiled: bool) -> float | None:
    """What a user waits for the compile: the warm-up window, from the loop's start to the first measured step (the
    first calls trace and compile, CUDA graphs record, cuDNN tunes); None when nothing compiles or there is no
    warm-up window (the compile then lies inside the measured window)."""
    return warmup_duration_s if compiled else None

