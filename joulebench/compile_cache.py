"""Where torch.compile keeps what it built between runs: inductor's FX-graph and AOTAutograd caches, Triton's kernels.

Why: a cold compile of the README's ResNet-50 took 255 s on an H100 before its first measured step (issue 58). A
second process that finds the first one's caches loads the compiled graphs and kernels instead of building them.
One directory holds both caches, DIR/inductor (TORCHINDUCTOR_CACHE_DIR) and DIR/triton (TRITON_CACHE_DIR), so that
one option moves them together and JUBE jobs on one node share them (jube/job.sh exports JOULEBENCH_COMPILE_CACHE).

`--compile-cache DIR` (default: $JOULEBENCH_COMPILE_CACHE, else $XDG_CACHE_HOME/joulebench/compile, i.e.
~/.cache/joulebench/compile); `none`: a fresh empty directory for this process, removed at its exit (a cold compile:
nothing reused, nothing left behind). The run record's `metrics.compile_cache` says which and what was reused.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, TypedDict

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

