"""The software settings `joulebench recommend` may choose among, per driver: where a run record holds each one, the
driver option that sets it, the JUBE sweep dimension that varies it, and whether it changes what is computed.

A knob that changes what is computed (precision, global batch, model) is *semantic*: a setting that differs from
the default in one is never offered unless the user allows it (--allow-semantic-changes), and then it is named as
such. Free knobs (decode variant, objective, batch size of a static inference point, slots of a serving point,
micro-batch, compile mode, parallel layout) change how the same work is done, not the work. The knobs are the core's
table's (joulebench.sweep_settings, which the JUBE workflows read too); analysis imports no driver, so the drivers'
option names are checked against their parsers by the tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from joulebench.sweep_settings import SETTINGS, SweepSetting, knobs
from jpwr import ValidationError


@dataclasses.dataclass(frozen=True)
class Knob:
    key: str  # the run record's config key
    option: str  # the driver option that sets it
    default: str | None = None  # the driver's default, as text; None: none (the sweep's own value, or --default)
    semantic: bool = False  # changes what is computed: offered only with --allow-semantic-changes
    sweep: str | None = None  # the JUBE workflow's sweep parameter (JOULEBENCH_SWEEP_<NAME>); None: not a dimension
    flag: bool = False  # a --X / --no-X option

    def value(self, config: Mapping[str, Any]) -> str:
        """The knob's value in a record, as text; an absent or null key reads as the driver's default (records
        written before the option existed ran with it)."""
        raw = config.get(self.key)
        if raw is None:
            return self.default if self.default is not None else "n/a"
        if isinstance(raw, bool):
            return "true" if raw else "false"
        return str(raw)

    def as_option(self, value: str) -> list[str]:
        """The driver's command-line words that set this value."""
        if self.flag:
            return [self.option if value == "true" else self.option.replace("--", "--no-", 1)]
        return [self.option, value]


def knob_of(setting: SweepSetting) -> Knob:
    """A row of the core's table as recommend reads it."""
    return Knob(setting.key, setting.option, setting.default, setting.semantic, setting.key if setting.sweep else None,
                setting.flag)


# The knobs as the core's table held them at import (joulebench.sweep_settings); knobs_of reads the table itself.
KNOBS: dict[str, tuple[Knob, ...]] = {driver: tuple(map(knob_of, knobs(driver))) for driver in SETTINGS}
# What the work is: records that differ in one of these are different workloads, never settings of one.
WORKLOAD_KEYS = ("task", "rate", "arrivals", "output_length", "seq_length", "image_size", "data", "framework")
JUBE_WORKFLOWS = {"llm_inference": "jube/inference_benchmark.xml", "llm_training": "jube/llm_benchmark.xml",
                  "resnet50": "jube/resnet50_benchmark.xml"}

Setting = tuple[tuple[str, str], ...]  # (knob key, value) for every knob of the driver, in table order


def knobs_of(benchmark: str) -> tuple[Knob, ...]:
    if benchmark not in SETTINGS:
        raise ValidationError(f"no software settings are known for benchmark {benchmark!r}",
                              f"pass the run records of one of {', '.join(SETTINGS)}")
    return tuple(map(knob_of, knobs(benchmark)))


def setting_of(benchmark: str, config: Mapping[str, Any]) -> Setting:
    return tuple((k.key, k.value(config)) for k in knobs_of(benchmark))


def parse_defaults(texts: Sequence[str], benchmark: str) -> dict[str, str]:
    """--default KEY=VALUE[,KEY=VALUE]: the site's current setting where the driver has no default of its own."""
    known = {k.key for k in knobs_of(benchmark)}
    pairs: dict[str, str] = {}
    for part in (p.strip() for text in texts for p in text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in known or not value.strip():
            raise ValidationError(f"--default {part!r} is not KNOB=VALUE of a {benchmark} knob",
                                  f"write e.g. --default batch_size=1; knobs: {', '.join(sorted(known))}")
        key, value = key.strip(), value.strip()
        if pairs.get(key, value) != value:
            raise ValidationError(f"--default {key}={pairs[key]} and --default {key}={value} both given: only the last "
                                  "would count", f"give {key} once")
        pairs[key] = value
    return pairs


def default_setting(benchmark: str, settings: Sequence[Setting], given: Mapping[str, str]) -> Setting:
    """The baseline: a value given with --default, else the one every record shares, else the driver's default; a
    knob the sweep varies without a driver default must be named."""
    chosen = []
    for index, knob in enumerate(knobs_of(benchmark)):
        seen = sorted({s[index][1] for s in settings})
        value = given.get(knob.key) or (seen[0] if len(seen) == 1 else knob.default)
        if value is None:
            raise ValidationError(f"the sweep varies {knob.key} ({', '.join(seen)}), which has no driver default",
                                  f"name the site's current value: --default {knob.key}={seen[0]}")
        chosen.append((knob.key, value))
    return tuple(chosen)


def changes(benchmark: str, base: Setting, other: Setting) -> list[tuple[Knob, str, str]]:
    """(knob, default's value, other's value) where the two settings differ."""
    return [(k, a[1], b[1]) for k, a, b in zip(knobs_of(benchmark), base, other, strict=True) if a[1] != b[1]]


def label(benchmark: str, setting: Setting, varied: Sequence[str]) -> str:
    """The varied knobs as KEY=VALUE (the setting's name in tables)."""
    return " ".join(f"{key}={value}" for key, value in setting if key in varied) or "(the only setting)"


def apply_lines(benchmark: str, base: Setting, chosen: Setting, model: str | None,
                jube_tags: Sequence[str] = ()) -> list[str]:
    """How a site applies the chosen setting: the driver options that change, and the JUBE sweep values, a line that
    runs as printed from the repository root: the JUBE run's own tags (`jube_tags`, its records' job.tags), else the
    model's tag (JUBE reads a bare word after the file as another file: "Benchmark configuration file not found")."""
    changed = changes(benchmark, base, chosen)
    if not changed:
        return ["apply: nothing to change (the default setting)"]
    words = [w for knob, _, value in changed for w in knob.as_option(value)]
    lines = [f"apply (driver options): python -m {benchmark} ... {' '.join(words)}"]
    jube = [f"JOULEBENCH_SWEEP_{k.sweep.upper()}={v}" for k, _, v in changed if k.sweep]
    outside = [k.key for k, _, _ in changed if not k.sweep]
    if jube:
        tags = list(jube_tags) or ([model] if model and benchmark != "resnet50" else [])
        tag = f" --tag {' '.join(tags)}" if tags else ""
        lines.append(f"apply (JUBE): {' '.join(jube)} jube run {JUBE_WORKFLOWS[benchmark]}{tag}")
    if outside:
        lines.append(f"not a JUBE sweep dimension: {', '.join(outside)} (set it in the driver's options)")
    return lines
