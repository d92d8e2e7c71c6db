"""Long reasons read once: a short form for each row, the full text once beside the table.

Why: a record's reasons and warnings can be long (the meter lists every sensor it could not read: about 460
characters on a machine without a GPU), and the same text on every row of a table buries the numbers and cuts off
what comes after it. A row shows each reason's head with a mark such as `[1]`; the full text is listed once under
that mark (the HTML report), or kept in the full table's Note (the JUBE workflows: their default table shows the heads).
"""

from __future__ import annotations

from collections.abc import Iterable

SHORT_CHARS = 48  # a reason's head in a row
MIN_HEAD_CHARS = 12  # a separator before this is part of the head: "energy n/a: ...", "local: no GPU found"
# Where a reason's detail starts: its list of sources, a parenthesis, a second clause
DETAIL_STARTS = (": ", "; ", " (")


def short_reason(text: str, limit: int = SHORT_CHARS) -> str:
    """The reason's head: the text before its first detail (past the first few characters), at most `limit`
    characters, cut at a word with `...` where longer."""
    text = " ".join(text.split())
    cuts = [i for sep in DETAIL_STARTS if (i := text.find(sep, MIN_HEAD_CHARS)) >= 0]
    return clip(text[: min(cuts)] if cuts else text, limit)


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word with `...` where longer."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 2)
    return text[: cut if cut > 0 else limit - 3].rstrip(" ;:,") + "..."


def short_note(reasons: Iterable[str], limit: int) -> str:
    """Several reasons' heads in one cell of at most `limit` characters, as many as fit in order; `+N` counts those
    left out (their full text is in the full table)."""
    heads = list(dict.fromkeys(short_reason(r) for r in reasons if r.strip()))
    for n in range(len(heads), 0, -1):
        more = f" +{len(heads) - n}" if n < len(heads) else ""
        if len(text := "; ".join(heads[:n]) + more) <= limit:
            return text
    more = f" +{len(heads) - 1}" if len(heads) > 1 else ""
    return short_reason(heads[0], limit - len(more)) + more if heads else "-"


class Footnotes:
    """Numbers distinct full texts in the order they are first seen: each row carries marks, the page the texts."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        """`head [n]` for a long text (n its number among the texts), the text itself where it is short already."""
        text = " ".join(text.split())
        head = short_reason(text)
        if head == text:
            return text
        if text not in self.texts:
            self.texts.append(text)
        return f"{head} [{self.texts.index(text) + 1}]"

    def numbered(self) -> list[tuple[int, str]]:
        return list(enumerate(self.texts, start=1))
