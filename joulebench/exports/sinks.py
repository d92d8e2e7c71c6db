"""One writer per tool, with the same three calls: a time series point, figures of the whole run, and text facts
(method, bound, window, scope) beside them. Each imports its library only when built (an optional extra).

    TensorBoard  event files in <out>/tensorboard/<run id> (scalars; facts as text summaries under facts/)
    MLflow       a local SQLite store, <out>/mlflow.db, unless MLFLOW_TRACKING_URI names another (metrics; tags)
    W&B          offline run files under <out>/wandb unless WANDB_MODE says otherwise (history; summary; config)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def series(self, step: int, values: Mapping[str, float]) -> None: ...
    def figures(self, step: int, values: Mapping[str, float]) -> None: ...
    def facts(self, values: Mapping[str, str]) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    """TensorBoard's own event writer (no torch or TensorFlow needed)."""

    def __init__(self, out_dir: Path, run_id: str, _experiment: str) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._pb = (event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2)
        self._writer = EventFileWriter(str(out_dir / "tensorboard" / run_id))
        self._last_step = 0

    def _write(self, step: int, values: list[Any]) -> None:
        event_pb2, summary_pb2, *_ = self._pb
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                               summary=summary_pb2.Summary(value=values)))
        self._last_step = max(self._last_step, step)

    def series(self, step: int, values: Mapping[str, float]) -> None:
        _e, summary_pb2, *_ = self._pb
        self._write(step, [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])

    def figures(self, step: int, values: Mapping[str, float]) -> None:
        self.series(step, values)

    def facts(self, values: Mapping[str, str]) -> None:
        _e, summary_pb2, tensor_pb2, shape_pb2, types_pb2 = self._pb
        text = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        self._write(self._last_step, [summary_pb2.Summary.Value(
            tag=f"facts/{k}", metadata=text,
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[v.encode()],
                                          tensor_shape=shape_pb2.TensorShapeProto()))
            for k, v in values.items()])

    def close(self) -> None:
        self._writer.close()


class MlflowSink:
    """MLflow's client on a local SQLite store (MLflow's default kind of store), one MLflow run per record."""

    def __init__(self, out_dir: Path, run_id: str, experiment: str) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, RunTag

        self._types = (Metric, RunTag)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_id).info.run_id

    def series(self, step: int, values: Mapping[str, float]) -> None:
        metric, _tag = self._types
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[metric(k, v, now, step) for k, v in values.items()])

    def figures(self, step: int, values: Mapping[str, float]) -> None:
        self.series(step, values)

    def facts(self, values: Mapping[str, str]) -> None:
        _metric, tag = self._types
        self.client.log_batch(self.run_id, tags=[tag(k, v) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbSink:
    """A W&B run, offline by default (WANDB_MODE wins): history for the series, summary and config at the end."""

    def __init__(self, out_dir: Path, run_id: str, experiment: str) -> None:
        import wandb

        # offline unless WANDB_MODE is set: then wandb reads it itself (it knows its modes, some beyond its stubs')
        self.run = wandb.init(mode=None if os.environ.get("WANDB_MODE") else "offline", dir=str(out_dir),
                              project=experiment, name=run_id, reinit="create_new",
                              settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True))

    def series(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def figures(self, _step: int, values: Mapping[str, float]) -> None:
        self.run.summary.update(dict(values))

    def facts(self, values: Mapping[str, str]) -> None:
        self.run.config.update(dict(values), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


SINKS: dict[str, type[TensorBoardSink] | type[MlflowSink] | type[WandbSink]] = {
    "tensorboard": TensorBoardSink, "mlflow": MlflowSink, "wandb": WandbSink}
