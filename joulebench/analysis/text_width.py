"""Text for people: lines of at most 160 columns (a terminal beside an editor), the one rule every verb's default
output follows; wider output only where a verb is asked for it, and machine-readable files (JSON, CSV) as they are."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from jpwr.errors import WIDTH  # the error boundary's, too: one width for everything a person reads

CONTINUATION = "    "  # a wrapped line's continuation: indented further than the line it continues


def wrapped(line: str, width: int = WIDTH) -> list[str]:
    """A line cut at spaces into lines of at most `width` (a word longer than that stays whole), the continuations
    indented by the line's own indent and CONTINUATION."""
    if len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip())]
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + CONTINUATION,
                         break_long_words=False, break_on_hyphens=False) or [line]


def fitted(lines: Sequence[str], width: int = WIDTH) -> str:
    """`lines` joined, each wrapped to `width` (wrapped)."""
    return "\n".join(part for line in lines for part in wrapped(line, width))


def table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH, indent: str = "",
          separator: str = " | ") -> list[str]:
    """Columns padded to their widest cell, `separator` between them, the last one unpadded; a last cell that would
    pass `width` goes on under its own column (its words on as many lines as it needs)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def row(cells: Sequence[str]) -> list[str]:
        start = indent + separator.join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False))
        start += separator if len(cells) > 1 else ""
        room = max(width - len(start), 20)
        parts = textwrap.wrap(cells[-1], room, break_long_words=False, break_on_hyphens=False) or [""]
        return [(start + parts[0]).rstrip(), *((" " * len(start) + part).rstrip() for part in parts[1:])]

    full = len(indent) + sum(widths) + len(separator) * (len(widths) - 1)
    return [*row(header), indent + "-" * (min(full, width) - len(indent)), *(x for r in rows for x in row(r))]
