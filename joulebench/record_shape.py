"""The shape of a run record as read from its file: every block an object where the schema has an object, a list
where it has a list, a text where it has a text (joulebench.record_types.RecordDocument and the blocks it names).

Why: a record edited by hand, truncated by a full disk or written by a foreign tool reaches every analysis verb;
an object where a list belongs must be refused naming the field, not end in an AttributeError deep inside a chart.
Numbers are not judged here beyond null where the schema has no null (a window's edges): a figure that is not a
number or impossible is a value, and joulebench.figures (the one check of the figures) rejects the record's
figures naming it, so that the rest of the record (what identifies it) still shows as a rejected row. Keys the types
do not declare (a newer writer's, the open `config`/`hardware` blocks) are kept and not checked.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

from joulebench.record_types import Metrics, RecordDocument, metrics_type
from jpwr.energy import HEADLINE_DOMAINS

NUMBERS = (int, float)  # figures: judged by joulebench.figures, not here
SHOWN_CHARS = 40  # how much of a wrong value a problem quotes
Block = TypeVar("Block")


class RecordShapeError(ValueError):
    """A run record document in the wrong shape: the text names the field(s) and what each should be."""


def checked_block(kind: type[Block], value: object, field: str) -> Block:
    """`value` as the record block `kind` declares (a TypedDict of joulebench.record_types), once its shape is
    checked: the one way a dict read from a file or built from computed keys becomes a typed block, instead of a
    cast that would check nothing. A RecordShapeError naming every field in the wrong shape otherwise."""
    found = problems(value, kind, field)
    if found:
        raise RecordShapeError("; ".join(found))
    checked: Any = value  # its shape is what `kind` declares: the check above, which mypy cannot follow
    return checked


def checked_metrics(benchmark: str, block: Mapping[str, object]) -> Metrics:
    """A record's `metrics` as its driver's type (record_types.metrics_type, by the record's benchmark), checked."""
    return checked_block(metrics_type(benchmark, block), block, "metrics")


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({type(value).__name__})"


def _expected(annotation: Any) -> str:
    """The kind of value an annotation asks for, in words."""
    origin = get_origin(annotation) or annotation
    if is_typeddict(annotation) or origin is dict:
        return "an object"
    return {list: "a list", str: "a text", bool: "true or false"}.get(origin, "a number")


def problems(value: Any, annotation: Any, field: str) -> list[str]:
    """Where `value` does not have the shape `annotation` declares: '<field> is <value>, not <kind>' per place."""
    if annotation in NUMBERS:  # a number's value is a figure; only null where no null belongs is a shape
        return [f"{field} is None, not a number"] if value is None else []
    if annotation is Any:
        return []
    if get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if value is None and len(options) < len(get_args(annotation)):
            return []
        found = [problems(value, option, field) for option in options]
        return [] if any(not f for f in found) else found[0]
    if is_typeddict(annotation):
        return _object_problems(value, annotation, field)
    origin = get_origin(annotation) or annotation
    if origin is list:
        if not isinstance(value, list):
            return [f"{field} is {shown(value)}, not {_expected(annotation)}"]
        (item,) = get_args(annotation) or (Any,)
        return [p for i, entry in enumerate(value) for p in problems(entry, item, f"{field}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{field} is {shown(value)}, not {_expected(annotation)}"]
        _, item = get_args(annotation) or (str, Any)
        return [p for key, entry in value.items() for p in problems(entry, item, f"{field}.{key}")]
    if not isinstance(value, origin) or (origin is not bool and isinstance(value, bool)):
        return [f"{field} is {shown(value)}, not {_expected(annotation)}"]
    return []


def _object_problems(value: Any, annotation: Any, field: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{field} is {shown(value)}, not {_expected(annotation)}"]
    hints = _hints(annotation)
    prefix = f"{field}." if field else ""
    found = [f"{prefix}{key} is missing" for key in sorted(annotation.__required_keys__) if key not in value]
    return found + [p for key, entry in value.items() if key in hints for p in problems(entry, hints[key],
                                                                                          f"{prefix}{key}")]


_HINTS: dict[Any, dict[str, Any]] = {}


def _hints(annotation: Any) -> dict[str, Any]:
    """The resolved field types of a TypedDict (read once: get_type_hints evaluates the postponed annotations)."""
    if annotation not in _HINTS:
        _HINTS[annotation] = {key: _strip(hint) for key, hint in get_type_hints(annotation).items()}
    return _HINTS[annotation]


def _strip(hint: Any) -> Any:
    """Required[X] / NotRequired[X] as X (get_type_hints keeps them on some Python versions)."""
    return get_args(hint)[0] if get_origin(hint) in (typing.Required, typing.NotRequired) else hint


def record_shape_problems(data: Any) -> list[str]:
    """Every place where a run record document has the wrong shape, else every value it cannot hold
    (record_value_problems); empty when it can be read."""
    return problems(data, RecordDocument, "") or record_value_problems(data)


def record_value_problems(data: dict[str, Any]) -> list[str]:
    """What a document of the right shape still cannot mean (checked after its shape): two windows of one name
    (every reader takes the first: the second would be dropped without a word) and an energy domain no meter writes
    (a ranking keeps domains apart by name: an unknown one would join nothing, or anything)."""
    found = []
    seen: dict[str, int] = {}
    for i, window in enumerate(data.get("windows") or []):
        name = window.get("name")
        if name in seen:
            found.append(f"windows[{i}] is a second {name!r} window (the first is windows[{seen[name]}]): one window "
                         "per name")
        seen.setdefault(name, i)
        energy = window.get("energy") or {}
        found += _domain_problems(energy.get("domain"), f"windows[{i}].energy.domain")
    return found + _domain_problems(data.get("energy_domain"), "energy_domain")


def _domain_problems(domain: Any, field: str) -> list[str]:
    if domain is None or domain in HEADLINE_DOMAINS:
        return []
    return [f"{field} {shown(domain)} is not a known energy domain ({', '.join(map(repr, HEADLINE_DOMAINS))})"]
