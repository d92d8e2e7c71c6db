"""Writing results safely and legibly: atomic JSON, UTC timestamps, numbers with "n/a" for missing.

Readers (JUBE patterns, reports, a second process) must never see a half-written file, and a
missing value must never print as 0. Reading a result back takes the fields its type knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _finite(value: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary file beside `path` for a writer that opens the file itself (h5py, savefig, a builder, a
    subprocess): when the block ends, its data is flushed to disk and it is renamed onto `path`; when the block
    or the flush fails, it is removed and `path` keeps what it held. The one way every final file is written,
    so a reader, a full disk or a crash never leaves a half-written one under the final name."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The same directory (a rename within one file system is atomic); the suffix ends in the target's own, which
    # writers that infer the format from the name (savefig) need.
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide results from other users of a shared directory
        yield tmp
        flushed = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(flushed)  # the data is on disk before the name points at it: a crash leaves old or new
        finally:
            os.close(flushed)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], content: str | bytes) -> Path:
    """Write text (UTF-8) or bytes through `atomic_path`: readers never see a half-written file."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(content.encode() if isinstance(content, str) else content)
    return Path(path)


def json_text(data: Any) -> str:
    """The JSON every result file holds: indented, NaN/inf as null, dataclasses and numpy scalars converted."""
    return json.dumps(_finite(json.loads(json.dumps(data, default=_json_default))), indent=2, sort_keys=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON through `atomic_path`, so readers never see a half-written file."""
    return write_atomic(path, json_text(data))


def known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `data` that are fields of dataclass `cls`: files written by other versions load (a key
    added later is dropped here, one missing takes the field's default)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def fmt(value: float | None, digits: int = 4) -> str:
    """Format a number for tables and summary lines: None is "n/a", never 0."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.{digits}g}"
