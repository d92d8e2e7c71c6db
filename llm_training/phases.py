"""Phase marks inside megatron's forward_backward_func, through megatron's own timer hooks.

megatron runs forward and backward of all micro-batches inside one call, so the driver cannot wrap
them. It does call `config.timers(name).start()/.stop()` around each part when `config.timers` is set;
this adapter turns those calls into phase marks. What each phase covers exactly (megatron-core 0.16):

* forward: `forward-compute`, per micro-batch: fetching the micro-batch (host-to-device copy), the
  model's forward including the loss (cross-entropy runs inside the model), and the loss function.
* backward: `backward-compute`, per micro-batch: the loss scaling and autograd backward. With
  --overlap-grad-reduce (the default when DP > 1) the bucketed reduce-scatter launched during backward
  runs concurrently and is counted here: the device does both at once.
* grad_reduce (DP > 1 only): `all-grads-sync` in finalize_model_grads: the gradient reduction that is
  not hidden behind backward (waiting for the overlapped buckets, or the whole reduce-scatter without
  overlap). With DP = 1 there is nothing to reduce and the phase is absent.
* pipeline_p2p (PP > 1): megatron's send/receive timers between pipeline stages.

The optimizer phase is marked by the Trainer around `optimizer.step()` (with the distributed optimizer
that includes the parameter all-gather). Other timers (`forward-backward`, embedding and layer-norm
all-reduces) are not phases: their time stays in the phase around them, or unmarked.
"""

from __future__ import annotations

from joulebench.phases import BACKWARD, FORWARD, GRAD_REDUCE, PIPELINE_P2P
from jpwr.phases import PhaseRecorder

P2P_TIMERS = ("forward-recv", "backward-recv", "forward-send", "backward-send", "forward-send-backward-recv",
              "backward-send-forward-recv", "forward-send-forward-recv", "backward-send-backward-recv",
              "forward-backward-send-forward-backward-recv")


class _Timer:
    """megatron's timer interface (start/stop with an optional barrier, which phase marks never take)."""

    __slots__ = ("phase", "recorder")

    def __init__(self, recorder: PhaseRecorder, phase: str | None) -> None:
        self.recorder, self.phase = recorder, phase

    def start(self, barrier: bool = False) -> None:
        if self.phase is not None:
            self.recorder.begin(self.phase)

    def stop(self, barrier: bool = False) -> None:
        if self.phase is not None:
            self.recorder.end(self.phase)


class MegatronPhaseTimers:
    """Set as `config.timers`: megatron's timer names mapped to phases, the rest ignored."""

    def __init__(self, recorder: PhaseRecorder, data_parallel: int) -> None:
        phases = {"forward-compute": FORWARD, "backward-compute": BACKWARD, **dict.fromkeys(P2P_TIMERS, PIPELINE_P2P)}
        if data_parallel > 1:
            phases["all-grads-sync"] = GRAD_REDUCE
        self._timers: dict[str, _Timer] = {name: _Timer(recorder, phase) for name, phase in phases.items()}
        self._ignored = _Timer(recorder, None)

    def __call__(self, name: str, log_level: int | None = None) -> _Timer:
        return self._timers.get(name, self._ignored)
