"""Writing results safely and legibly: atomic JSON, UTC timestamps, numbers with "n/a" for missing.

Readers (JUBE patterns, reports, a second process) must never see a half-written file, and a
missing value must never print as 0. Reading a result back takes the fields its type knows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Mapping
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


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON via a temporary file and rename, so readers never see a half-written file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(json.loads(json.dumps(data, default=_json_default))), indent=2, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide results from other users of a shared directory
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


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
