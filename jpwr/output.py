"""public: for code that writes results (records, tables, settings files) and prints numbers.

Writing results safely and legibly: atomic JSON, UTC timestamps, numbers with "n/a" for missing.

Readers (JUBE patterns, reports, a second process) must never see a half-written file, and a
missing value must never print as 0. Reading a result back takes the fields its type knows.
"""

from __future__ import annotations

import codecs
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

__all__ = ["atomic_path", "atomic_paths", "fmt", "json_text", "printable", "readable", "utc_now", "write_atomic",
           "write_json_atomic"]

# The error handler that writes a file name's bytes that are not UTF-8 (Python holds them as lone surrogates,
# os.fsdecode's surrogateescape) as \xNN: such a name is shown, escaped, never a UnicodeEncodeError (an internal
# error) in the middle of a report. jpwr.errors.exit_code_of sets it on stdout and stderr of every command.
ESCAPED = "jpwr.escaped"


def _escaped(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    chars = exc.object[exc.start:exc.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                   else c.encode("ascii", "backslashreplace").decode() for c in chars), exc.end


codecs.register_error(ESCAPED, _escaped)


def printable(text: str) -> str:
    """`text` with the undecodable bytes of a file name in it (lone surrogates) written as \\xNN: a page or a line
    that shows a path whose name is not UTF-8 can be written and read."""
    return text.encode("utf-8", ESCAPED).decode("utf-8")


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


def _read_umask() -> int:
    """The process's umask, on Linux read without changing it: os.umask can only read it by setting it, which
    races with threads that create files meanwhile (a sampler's); elsewhere it is set and restored."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_paths(*paths: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """Temporary files beside `paths`, for writers that open the files themselves (h5py, savefig, a builder, a
    subprocess): when the block ends, every one is flushed to disk, then each is renamed onto its path in the order
    given (the one that makes the set valid last); when the block or a flush fails, they are removed and the paths
    keep what they held. The one way every final file is written, so a reader, a full disk or a crash never leaves
    a half-written one under a final name; only a crash between two renames leaves the earlier ones renamed. An
    OSError that names no file, or a temporary one, is made to name the final file(s)."""
    targets = [Path(path) for path in paths]
    temporaries: list[Path] = []
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            # The same directory (a rename within one file system is atomic); a hidden name ending in .tmp, which no
            # reader's pattern (*.json, *.h5) matches. A writer that infers the format from the name must be told it.
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            temporaries.append(Path(name))
            os.chmod(name, 0o666 & ~_read_umask())  # mkstemp's 0600 would hide results from other users
        yield temporaries
        for tmp in temporaries:
            flushed = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(flushed)  # the data is on disk before a name points at it: a crash leaves old or new
            finally:
                os.close(flushed)
        for tmp, target in zip(temporaries, targets, strict=True):
            os.replace(tmp, target)
    except BaseException as exc:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # "No space left on device: '<the file>'", not an empty or removed name
            finals = {str(tmp): str(target) for tmp, target in zip(temporaries, targets, strict=False)}
            exc.filename = finals.get(exc.filename, exc.filename) if exc.filename is not None else \
                ", ".join(str(target) for target in targets)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """`atomic_paths` for one file: the temporary file's path."""
    with atomic_paths(path) as (tmp,):
        yield tmp


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


def readable(value: float | None) -> str:
    """A figure for people: whole numbers from 100 up (1980 MHz, 65612 tokens/s, not 1.98e+03), 4 digits below;
    n/a for None."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else fmt(value, 4)
