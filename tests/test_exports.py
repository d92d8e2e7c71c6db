"""`--log-to tensorboard,mlflow,wandb` with the real libraries, offline: a tiny ResNet-50 run on the CPU metered by
the fake NVML logs to all three, and what each tool stored is read back with the tool's own reader and checked
against the run record: the window figures equal the record's, with their method and window beside them; the
energy per log interval adds up to the loop's windows within the stated bounds."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import pytest

from joulebench.record import read_run_record

pytest.importorskip("torchvision")
tensorboard = pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")

ITERATIONS, WARMUP = 5, 1


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.resnet50.conftest import metered_run

    out = tmp_path_factory.mktemp("run")
    assert metered_run(out, "--warmup-iterations", str(WARMUP), "--iterations", str(ITERATIONS), "--no-idle-baseline",
                       "--log-to", "tensorboard,mlflow,wandb",
                       env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": None}) == 0
    return out


def _tensorboard(out: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    (run_dir,) = (out / "tensorboard").iterdir()
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    facts = {tag.removeprefix("facts/"): tensor_util.make_ndarray(acc.Tensors(tag)[-1].tensor_proto).item().decode()
             for tag in acc.Tags()["tensors"]}
    return scalars, facts


def _mlflow(out: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "joulebench-resnet50"]
    (run,) = client.search_runs([experiment.experiment_id])
    series = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
              for key in run.data.metrics}
    return series, dict(run.data.tags)


def _wandb_records(path: Path) -> list[object]:
    """The offline run file's records, parsed with W&B's own protobuf: it is LevelDB's log format (32 KiB blocks;
    each chunk a 7-byte header: checksum, length, type 1 full / 2 first / 3 middle / 4 last) after W&B's 7-byte file
    header; the W&B library itself no longer ships a reader."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunks, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def _wandb(out: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, float], dict[str, str]]:
    (path,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[str, list[tuple[int, float]]] = {}
    summary: dict[str, float] = {}
    config: dict[str, str] = {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, []).append((items["_step"], value))
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.config.update})
    return history, summary, config


def test_every_tool_holds_the_records_window_figures_with_method_and_window(logged_run: Path) -> None:
    record = read_run_record(logged_run / "run_record.json")
    m = record.metrics
    assert record.status == "OK" and m["images_per_wh"] > 0
    tb, tb_facts = _tensorboard(logged_run)
    ml, ml_tags = _mlflow(logged_run)
    wb_history, wb_summary, wb_config = _wandb(logged_run)
    for key in ("images_per_wh", "energy_wh", "energy_error_bound_j", "mean_power_w_per_device", "images_per_s"):
        assert tb[f"window/{key}"][-1][1] == pytest.approx(m[key], rel=1e-6)  # TensorBoard keeps float32
        assert ml[f"window/{key}"][-1][1] == wb_summary[f"window/{key}"] == m[key]
    for facts in (tb_facts, ml_tags, wb_config):
        assert facts["window/energy_method"] == m["energy_method"] == "counter+power"
        assert facts["window/window"] == "steady" and facts["status"] == "OK"
        assert facts["interval/method"] == "counter+power"
    assert "window/energy_unavailable_reason" not in ml_tags  # a figure's reason only where it is n/a
    assert wb_history["interval/energy_j"] == ml["interval/energy_j"]


def test_energy_per_log_interval_adds_up_to_the_windows_within_the_bounds(logged_run: Path) -> None:
    record = read_run_record(logged_run / "run_record.json")
    series, tags = _mlflow(logged_run)
    energy, bound = series["interval/energy_j"], series["interval/energy_error_bound_j"]
    steps = [step for step, _ in energy]
    assert steps == sorted(set(steps)) and steps[-1] == WARMUP + ITERATIONS and 1 < len(steps) <= WARMUP + ITERATIONS
    period = float(tags["interval/update_period_s"])
    seconds = dict(series["interval/seconds"])
    assert all(seconds[s] >= 2 * period for s in steps[:-1])  # shorter ones were merged with the next
    loop_j = sum(w.energy.energy_j for w in record.windows if w.name in ("warmup", "steady"))
    loop_bound = sum(w.energy.error_bound_j for w in record.windows if w.name in ("warmup", "steady"))
    assert abs(sum(v for _, v in energy) - loop_j) <= sum(v for _, v in bound) + loop_bound
    power = dict(series["interval/mean_power_w"])
    assert all(power[s] == pytest.approx(v / seconds[s]) for s, v in energy)
    per_image = dict(series["interval/j_per_image"])
    first = 0
    for step, joules in energy:  # 8 images per step (SMALL: global batch 8)
        assert per_image[step] == pytest.approx(joules / ((step - first) * 8))
        first = step


def test_an_unknown_or_missing_tool_is_refused_when_the_command_line_is_parsed(capsys) -> None:
    from resnet50.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--framework", "pytorch", "--log-to", "tensorboard,neptune"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown --log-to target 'neptune': use a comma list of tensorboard, mlflow, wandb" in err


def _lifecycle_run(out: Path, metrics: dict[str, object]) -> tuple[int, list[str]]:
    """A run of the lifecycle with no body, logging to TensorBoard: its exit code and the record's warnings."""
    from joulebench.launch import LaunchEnv
    from joulebench.lifecycle import Lifecycle

    with (Lifecycle("resnet50", LaunchEnv.from_env({})) as life,
          life.run("r", out, {}, metrics=lambda _record: dict(metrics), log_to=("tensorboard",)) as run):
        pass
    return run.exit_code, read_run_record(out / "run_record.json").warnings


def test_a_tool_that_cannot_open_costs_the_run_nothing_and_is_a_warning(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tensorboard").write_text("a file where TensorBoard needs its directory")
    exit_code, warnings = _lifecycle_run(tmp_path, {})
    assert exit_code == 0
    assert any(w.startswith("--log-to: tensorboard could not be opened and was left out: ") and
               "not a directory" in w.lower() for w in warnings)  # TensorFlow's words or its stub's
    said = [line for line in capsys.readouterr().err.splitlines() if "--log-to: " in line]
    assert len(said) == 1  # on stderr as the run starts, once (not again when the tools close)
    assert said[0].startswith("[resnet50] warning: --log-to: tensorboard could not be opened and was left out: ")


class _FailsLogging:
    """A tool whose series call fails (a server gone mid-run)."""

    def series(self, step: int, values: Mapping[str, float]) -> None:
        raise ConnectionError("the tracking server went away")

    def figures(self, step: int, values: Mapping[str, float]) -> None: ...
    def facts(self, values: Mapping[str, str]) -> None: ...
    def close(self) -> None: ...


def test_a_tool_dropped_mid_run_is_said_once_when_it_happens(tmp_path: Path) -> None:
    from joulebench.exports.run import Exports

    said: list[str] = []
    exports = Exports([], tmp_path, "r", "resnet50", say=said.append)
    exports.sinks.append(_FailsLogging())
    exports.series(10, {"loss": 1.0})
    assert said == ["_FailsLogging failed logging step 10 and was dropped: ConnectionError: the tracking server went "
                    "away"]
    exports.series(20, {"loss": 0.5})
    assert exports.close() == said and len(said) == 1  # said once; the record gets the same words


def test_the_tools_get_the_status_the_record_is_written_with(tmp_path: Path) -> None:
    _exit, _warnings = _lifecycle_run(tmp_path, {"energy_wh": 1.0, "energy_untrusted_reason": "coverage 0.61 < 0.99"})
    assert read_run_record(tmp_path / "run_record.json").status == "PARTIAL"
    assert _tensorboard(tmp_path)[1]["status"] == "PARTIAL"


def test_a_last_interval_too_short_joins_the_one_before_else_it_is_n_a(tmp_path: Path, fake_pynvml) -> None:
    """IntervalLog on a virtual clock against an in-process sampler replaying the H100 trace: deterministic."""
    from joulebench.exports.intervals import IntervalLog
    from joulebench.exports.run import Exports
    from joulebench.launch import LaunchEnv
    from jpwr.clock import VirtualClock
    from jpwr.meter import WindowMeter
    from jpwr.sampler import LocalChannel, Sampler, open_backends
    from tests.conftest import H100_TRACE_DIR

    clock = VirtualClock()
    fake_pynvml.configure(H100_TRACE_DIR, clock, origin_ns=0)
    backends, discoveries = open_backends(["nvml"], clock, strict=True)
    sampler = Sampler(backends, discoveries, tmp_path / "jpwr", 0.1, 0.1, clock=clock, run_id="t", node="n1",
                      background=False).start()
    tick = 0

    def run_for(seconds: float) -> None:
        nonlocal tick
        for _ in range(round(seconds / 0.1)):
            tick += 1
            clock.set_ns(tick * 10**8)
            sampler.poll_once(tick)

    run_for(12)  # the sensor's update period is known; QUERY_EVERY_NS has passed
    meter = WindowMeter(LaunchEnv.from_env({}), LocalChannel(sampler), clock=clock)
    exports = Exports(("tensorboard",), tmp_path, "r", "resnet50")
    merged, alone = (IntervalLog(meter, exports, "images", 8.0, 1) for _ in range(2))
    gap = 3 * merged.min_ns / 1e9 / 2  # 1.5 times the merge threshold
    merged.begin(0)
    for step in (1, 2):
        run_for(gap)
        merged.log_point(step)  # closes log/0 (0-1), then log/1 (1-2) and logs log/0
    run_for(0.1)
    merged.log_point(3, last=True)  # too short: log/1 covers steps 1-3
    alone.begin(10)
    run_for(0.1)
    alone.log_point(11, last=True)  # the only interval, too short: n/a
    exports.finish("OK", {})
    assert exports.close() == []
    sampler.stop()
    scalars, facts = _tensorboard(tmp_path)
    energy = dict(scalars["interval/energy_j"])
    assert sorted(energy) == [1, 3]
    assert dict(scalars["interval/energy_j_per_step"])[3] == pytest.approx(energy[3] / 2, rel=1e-6)
    assert dict(scalars["interval/seconds"])[3] == pytest.approx(gap + 0.1, abs=0.01)
    last = {key: dict(points)[3] for key, points in scalars.items() if key.startswith("interval/")}
    joules, bound, work = last["interval/energy_j"], last["interval/energy_error_bound_j"], 2 * 8.0
    for name, divisor in (("mean_power_w", last["interval/seconds"]), ("energy_j_per_step", 2), ("j_per_image", work)):
        assert last[f"interval/{name}_error_bound"] == pytest.approx(bound / divisor, rel=1e-6)  # each with its bound
    assert 0 < bound < joules and last["interval/images_per_wh_error_bound"] == pytest.approx(
        work * 3600 / (joules - bound) - work * 3600 / joules, rel=1e-5)
    assert facts["interval/unavailable"] == ("steps 10-11: shorter than 2 sensor update periods, its bound as large "
                                             "as its energy: not logged")


@pytest.mark.parametrize(("domain", "energy_tag"), [("accelerators (replayed trace, not this machine)",
                                                      "replayed/window/energy_wh"),
                                                     ("accelerators", "window/energy_wh")])
def test_a_replayed_energy_keeps_its_label_in_the_tools(tmp_path: Path, domain: str, energy_tag: str) -> None:
    """A chart shows a figure's name, not the facts beside it: a replayed trace's energy figures are named so."""
    from joulebench.exports.run import Exports

    exports = Exports(("tensorboard", "mlflow"), tmp_path, "r", "resnet50")
    exports.finish("OK", {"energy_wh": 1.5, "images_per_wh": 20.0, "mean_power_w_per_device": 300.0,
                          "images_per_s": 30.0, "energy_method": "counter+power"}, domain)
    assert exports.close() == []
    for scalars, facts in (_tensorboard(tmp_path), _mlflow(tmp_path)):
        prefix = energy_tag.removesuffix("window/energy_wh")
        assert {f"{prefix}window/energy_wh", f"{prefix}window/images_per_wh",
                f"{prefix}window/mean_power_w_per_device", "window/images_per_s"} == set(scalars)
        assert facts["energy_domain"] == domain and facts["window/energy_method"] == "counter+power"
