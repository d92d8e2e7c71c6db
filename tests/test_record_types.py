"""The typed record blocks (joulebench.record_types) against every shipped run record: reading and writing a record
keeps its JSON, and every key a shipped record's metrics, meter and requests block holds is declared in its TypedDict,
so the types cannot drift from what the drivers write (issue 42)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from joulebench import figures
from joulebench.card_state import Conditions
from joulebench.launch import LaunchEnv
from joulebench.record import (
    SCHEMA_VERSION,
    RunRecord,
    driver_metrics,
    parse_record,
    read_run_record,
    steady_metrics,
)
from joulebench.record_shape import RecordShapeError, checked_block, problems
from joulebench.record_types import (
    WORK_UNITS,
    CardConditions,
    DisturbedBlock,
    EnergySplitDocument,
    FaultDocument,
    FootprintBlock,
    HardwareBlock,
    IdleBaselineBlock,
    InferenceRunMetrics,
    JobBlock,
    JobDevice,
    LaunchBlock,
    LoadMetrics,
    MeterBlock,
    Metrics,
    RecordDocument,
    RequestEnergyBlock,
    RequestsBlock,
    ResNetMetrics,
    SteadyFigures,
    SteadyPlanBlock,
    TrainingMetrics,
    WindowLengthBlock,
    metrics_type,
)
from joulebench.sizing import SteadyPlan, WindowLength
from jpwr import IdleBaseline, Window
from jpwr.device_energy import Fault
from jpwr.energy import EnergySplit
from jpwr.output import write_json_atomic
from jpwr.summary import JobAccelerator

REPO = Path(__file__).resolve().parents[1]
SHIPPED_UNDER = (REPO / "tests", REPO / "benchmarks" / "results")
RECORD_KIND = "joulebench.run_record"
BLOCKS = {"meter": MeterBlock, "requests": RequestsBlock, "launch": LaunchBlock,
          "hardware": HardwareBlock, "job": JobBlock, "disturbed": DisturbedBlock,
          "footprint": FootprintBlock}
NESTED = {("meter", "idle_baseline"): IdleBaselineBlock, ("meter", "steady_plan"): SteadyPlanBlock,
          ("meter", "steady_seconds"): WindowLengthBlock, ("requests", "energy"): RequestEnergyBlock}
# What writing a record of an earlier schema changes (docs/run-record.md, "Versions 1 and 2"): its version, and the
# blocks it did not have, written empty. `windows` are jpwr's Window: they gain the fields added since (below).
UPGRADED = ("schema_version", "warnings", "job")
# ... and a version 3 record's engine detail, in version 4's words (docs/run-record.md, "Versions 1, 2 and 3")
RENAMED = {"slot_bucket": "position_bucket", "request_slots": "rows", "cache_slots": "cache_positions"}


def _in_current_words(shipped: dict[str, Any]) -> dict[str, Any]:
    """The shipped record's config as the reader gives it: an earlier version's engine detail keys renamed in place."""
    config = shipped.get("config", {})
    detail = config.get("engine_detail")
    if shipped["schema_version"] >= 4 or not isinstance(detail, dict):
        return config
    return {**config, "engine_detail": {RENAMED.get(key, key): value for key, value in detail.items()}}


def _shipped() -> list[Path]:
    found = []
    for root in SHIPPED_UNDER:
        for path in sorted(root.rglob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(data, dict) and data.get("kind") == RECORD_KIND:
                found.append(path)
    return found


SHIPPED = _shipped()


def _declared(block: Any) -> frozenset[str]:
    """A TypedDict's keys, its bases' included."""
    return frozenset(block.__required_keys__ | block.__optional_keys__)


def _only_added(shipped: Any, written: Any, where: str) -> list[str]:
    """Where `written` differs from `shipped` other than by keys it adds: each such path, in words."""
    if isinstance(shipped, dict) and isinstance(written, dict):
        return [p for key, value in shipped.items()
                for p in (_only_added(value, written[key], f"{where}.{key}") if key in written else [f"{where}.{key}"])]
    if isinstance(shipped, list) and isinstance(written, list) and len(shipped) == len(written):
        return [p for i, (a, b) in enumerate(zip(shipped, written, strict=True))
                for p in _only_added(a, b, f"{where}[{i}]")]
    return [] if shipped == written and type(shipped) is type(written) else [where]


def test_the_shipped_records_are_found_in_each_place() -> None:
    for root in SHIPPED_UNDER:
        assert any(root in path.parents for path in SHIPPED), root
    assert {json.loads(p.read_text())["schema_version"] for p in SHIPPED} >= {SCHEMA_VERSION}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_a_shipped_record_reads_and_writes_back_to_the_same_json(path: Path, tmp_path: Path) -> None:
    shipped = json.loads(path.read_text())
    written = RunRecord.from_dict(shipped).to_dict()
    assert list(written) == [key for key in written if key in shipped or key in UPGRADED]  # nothing else added
    for key, value in {**shipped, "config": _in_current_words(shipped)}.items():
        if key not in (*UPGRADED, "windows"):
            assert json.dumps(written[key]) == json.dumps(value), key  # the same values in the same order
    assert written["schema_version"] == SCHEMA_VERSION
    assert written["warnings"] == shipped.get("warnings", []) and written["job"] == (shipped.get("job") or {})
    assert _only_added(shipped["windows"], written["windows"], "windows") == []
    # a record written by this version is a fixed point: read from its file, it writes the same text
    again = write_json_atomic(tmp_path / "run_record.json", written)
    assert json.dumps(read_run_record(again).to_dict()) == json.dumps(written)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_key_of_a_shipped_block_is_declared_in_its_type(path: Path) -> None:
    shipped = json.loads(path.read_text())
    own = metrics_type(shipped["benchmark"], shipped["metrics"])  # the metrics: its driver's type declares each key
    for name, block in {"metrics": own, **BLOCKS}.items():
        undeclared = sorted(set(shipped.get(name) or {}) - _declared(block))
        assert undeclared == [], f"{name} keys not declared in joulebench.record_types.{block.__name__}"
    for (name, key), block in NESTED.items():
        undeclared = sorted(set((shipped.get(name) or {}).get(key) or {}) - _declared(block))
        assert undeclared == [], f"{name}.{key} keys not declared in joulebench.record_types.{block.__name__}"
    assert shipped["metrics"].get("work_unit", WORK_UNITS[0]) in WORK_UNITS


def _undeclared(value: Any, annotation: Any, where: str) -> list[str]:
    """The keys of `value`, at any depth, that the type `annotation` does not declare (of a union: the option that
    fits its shape and declares the most)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        fits = [_undeclared(value, a, where) for a in typing.get_args(annotation)
                if a is not type(None) and not problems(value, a, where)]
        return min(fits, key=len, default=[])
    if typing.is_typeddict(annotation) and isinstance(value, dict):
        hints = typing.get_type_hints(annotation)
        return [f"{where}.{key}" if key not in hints else p for key, entry in value.items()
                for p in ([None] if key not in hints else _undeclared(entry, hints[key], f"{where}.{key}"))]
    if origin in (list, dict) and isinstance(value, origin):
        item = typing.get_args(annotation)[-1]
        pairs = enumerate(value) if origin is list else value.items()
        return [p for key, entry in pairs for p in _undeclared(entry, item, f"{where}[{key}]")]
    return []


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_key_of_a_shipped_record_is_declared_at_every_depth(path: Path) -> None:
    """Nested blocks too (a check's rows, a window's energy): the document's type declares every key it holds;
    `config` and `software` are the open blocks, and `windows` declares only what a reader relies on (jpwr.Window
    is theirs)."""
    shipped = json.loads(path.read_text())
    assert _undeclared({k: v for k, v in shipped.items() if k not in ("metrics", "windows")}, RecordDocument, "") == []
    assert _undeclared(shipped["metrics"], metrics_type(shipped["benchmark"], shipped["metrics"]), "metrics") == []


def test_the_depth_check_names_a_nested_key_its_type_lacks() -> None:
    planted = {"requests": {"energy": {"cross_rate": [{"fitted_at": "1", "bogus": 1}],
                                       "clock_term": {"adopted": False, "held_out_rates": [{"rate": "2", "x": 0}]}}}}
    assert _undeclared(planted, RecordDocument, "") == [".requests.energy.cross_rate[0].bogus",
                                                        ".requests.energy.clock_term.held_out_rates[0].x"]


@pytest.mark.parametrize("unit", WORK_UNITS)
def test_the_steady_figures_of_every_work_unit_are_declared(unit: str) -> None:
    window = Window(name="steady", first_step=0, last_step=2, t_start_ns=0, t_end_ns=2_000_000_000,
                    work={unit: 10.0})
    keys = set(steady_metrics(window, unit, devices=1))
    assert {f"{unit}_per_s", f"{unit}_per_wh"} <= keys
    assert sorted(keys - _declared(SteadyFigures)) == []


def test_the_figures_analysis_reads_by_name_are_declared() -> None:
    """Readers that take metrics keys from lists (the figure checks, the serving section) ask for declared keys."""
    named = [*figures.POSITIVE_METRICS, *figures.BOUND_METRICS, *figures.WHOLE_METRICS, *figures.SERVING_POSITIVE,
             *figures.SERVING_ZERO_ALLOWED, *figures.SERVING_FRACTIONS,
             *(key for key, _ in figures.J_PER_UNIT_METRICS)]
    read = {key.format(unit=unit) for key in named for unit in WORK_UNITS}
    assert sorted(read - set().union(*(_declared(kind) for kind in DRIVERS.values()))) == []


DRIVERS = {"llm_training": TrainingMetrics, "resnet50": ResNetMetrics, "llm_inference run": InferenceRunMetrics,
           "llm_inference load": LoadMetrics}


def test_metrics_is_the_union_of_the_drivers_types_each_with_the_steady_figures() -> None:
    assert set(typing.get_args(Metrics)) == set(DRIVERS.values())
    assert all(_declared(SteadyFigures) <= _declared(kind) for kind in DRIVERS.values())


@pytest.mark.parametrize(("benchmark", "metrics", "kind"), [
    ("llm_training", {}, TrainingMetrics), ("resnet50", {}, ResNetMetrics), ("llm_inference", {}, InferenceRunMetrics),
    ("llm_inference", {"rate": "4"}, LoadMetrics), ("synthetic_training", {"work_unit": "images"}, ResNetMetrics),
    ("some_driver", {}, TrainingMetrics)])
def test_a_record_s_metrics_read_as_its_driver_s_type(benchmark: str, metrics: dict[str, Any], kind: Any) -> None:
    """By the record's benchmark (a load by its offered rate); a driver the core does not know by its work unit."""
    assert metrics_type(benchmark, metrics) is kind
    shipped = json.loads(SHIPPED[0].read_text())
    record = RunRecord.from_dict({**shipped, "benchmark": benchmark, "metrics": metrics})
    assert driver_metrics(record, kind) == metrics
    assert all(driver_metrics(record, other) is None for other in DRIVERS.values() if other is not kind)


def test_a_driver_s_key_in_the_wrong_shape_is_refused_as_its_driver_s() -> None:
    """A training record's loss curve is checked as training's; the same key in a ResNet record is not its own."""
    shipped = json.loads(SHIPPED[0].read_text())
    bad = {**shipped["metrics"], "loss_curve": "falling"}
    with pytest.raises(RecordShapeError, match=r"metrics\.loss_curve is 'falling', not a list"):
        RunRecord.from_dict({**shipped, "benchmark": "llm_training", "metrics": bad})
    assert RunRecord.from_dict({**shipped, "benchmark": "resnet50", "metrics": bad}).metrics["loss_curve"] == "falling"


def test_a_check_s_figure_the_fit_could_not_give_reads_as_null() -> None:
    """A NaN of the per-request fit is written null (a two-rate CPU sweep's cross-rate bound once was): the record
    still reads."""
    shipped = json.loads(next(p for p in SHIPPED if "requests" in json.loads(p.read_text())).read_text())
    row = {"fitted_at": "all but 40", "predicted": "40", "measured_j": None, "predicted_j": None, "bound_j": None,
           "passes": False}
    energy = {"cross_rate": [row], "held_out_halves": [{**row, "closes": False}],
              "controlled_split": [{"part": "prefill", "measured_j": None, "predicted_j": None, "passes": False}]}
    document = {**shipped, "requests": {**shipped["requests"], "energy": energy}}
    assert parse_record(document).requests["energy"]["cross_rate"] == [row]


def test_a_block_in_the_wrong_shape_is_refused_naming_the_field() -> None:
    with pytest.raises(RecordShapeError, match=r"meter\.clock is 'noon', not an object"):
        checked_block(MeterBlock, {"sampler": True, "clock": "noon"}, "meter")
    assert checked_block(MeterBlock, {"sampler": True, "newer": 1}, "meter") == {"sampler": True, "newer": 1}


@pytest.mark.parametrize(("block", "kind", "added"), [
    (LaunchBlock, LaunchEnv, set()), (SteadyPlanBlock, SteadyPlan, set()), (WindowLengthBlock, WindowLength, set()),
    (IdleBaselineBlock, IdleBaseline, {"measured"}), (FaultDocument, Fault, set()),
    (EnergySplitDocument, EnergySplit, set()), (CardConditions, Conditions, set())],
    ids=lambda x: getattr(x, "__name__", ""))
def test_a_block_written_from_a_dataclass_declares_its_fields_one_for_one(block: Any, kind: Any, added: set[str]
                                                                          ) -> None:
    """The dataclass is what the code holds, the TypedDict its record block: the two lists stay one."""
    assert _declared(block) == {field.name for field in dataclasses.fields(kind)} | added


def test_the_job_s_devices_are_declared_as_the_meter_writes_them() -> None:
    assert typing.get_type_hints(JobDevice) == typing.get_type_hints(JobAccelerator)


def test_the_launch_block_is_written_in_the_layout_s_order() -> None:
    assert list(LaunchEnv.from_env({}).to_dict()) == [field.name for field in dataclasses.fields(LaunchEnv)]


def test_a_hardware_block_of_the_wrong_shape_is_refused_at_reading() -> None:
    shipped = json.loads(SHIPPED[0].read_text())
    with pytest.raises(RecordShapeError, match=r"hardware\.device_name is 8, not a text"):
        RunRecord.from_dict({**shipped, "hardware": {**shipped.get("hardware", {}), "device_name": 8}})
