"""The training loop: model, megatron DDP + distributed optimizer, schedule, windows, run record.

The windows and the stop at a step boundary are joulebench.loop's (`warmup`: --warmup-iterations for JIT,
allocator growth and the first NCCL calls; `steady`: --iterations measured iterations, or as many as the bound
rule plans); statuses, signals, the record and the exit code are joulebench.lifecycle's, as in every driver.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.full_cuda_graph import FullCudaGraphWrapper
from megatron.core.optimizer import MegatronOptimizer, OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.module import Float16Module

from joulebench.compile_cache import CompileCache, compile_seconds
from joulebench.launch import LaunchEnv
from joulebench.lifecycle import Lifecycle, Run, StopRequest
from joulebench.loop import STEP_TIMES_BASIS, LoopResult, Progress, TrainSteps, run_loop
from joulebench.peaks import peak_flops
from joulebench.phases import OPTIMIZER, Replay, replay_phases
from joulebench.record import RunRecord, steady_metrics
from joulebench.record_types import SteadyFigures, TrainingMetrics
from joulebench.torch_device import hardware_info
from jpwr.phases import DeviceEventStamps, PhaseRecorder
from llm_training import cpu_compat, data, distributed, memory
from llm_training.config import CUDA_GRAPH_WARMUP, TrainConfig, on_for_cuda
from llm_training.flops import caraml_nvidia_flops_per_token, model_flops_per_token, parameter_count
from llm_training.model import build_gpt, compiled_rope_active, transformer_config, use_compiled_rope
from llm_training.phases import MegatronPhaseTimers

T = TypeVar("T")  # a value every rank gathers

DATASET_ITERATIONS = 1000  # dataset size (in global batches) of a run sized by time


def _log(launch: LaunchEnv, text: str) -> None:
    if launch.is_global_zero:
        print(f"[llm_training] {text}", flush=True)


def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    losses = output_tensor.float().view(-1)
    mask = loss_mask.float().view(-1)
    loss = torch.sum(losses * mask) / mask.sum().clamp(min=1.0)
    # clone: the schedule divides `loss` in place by the number of micro-batches afterwards
    return loss, {"lm loss": loss.detach().clone()}


def _forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, functools.partial]:
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, functools.partial(_loss_func, batch["loss_mask"])


def _torch_optimizers(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers megatron wraps: one per member of a ChainedOptimizer, or the single one."""
    return [member.optimizer for member in getattr(optimizer, "chained_optimizers", [optimizer])]


def use_fused_adam(optimizer: MegatronOptimizer) -> None:
    """Switch the torch AdamW inside megatron's optimizer from the foreach kernels to the fused one.

    Without TE or apex, megatron builds `torch.optim.AdamW` with torch's default, the foreach
    implementation: several multi-tensor passes over the fp32 master weights, gradients and both
    moments per step. The fused kernel makes one pass with the same update rule. torch reads
    `fused`/`foreach` from each parameter group at every step and creates the step counters on the
    first one, so switching before the first step is what passing `fused=True` would have done.
    """
    for inner in _torch_optimizers(optimizer):
        if not isinstance(inner, torch.optim.Adam):  # AdamW subclasses Adam in torch >= 2.7
            raise TypeError(f"expected torch's Adam/AdamW inside megatron's optimizer, got {type(inner).__name__}")
        for group in inner.param_groups:
            group["foreach"], group["fused"] = False, True


class Trainer:
    """Owns the model, optimizer and data stream of one rank."""

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.config = transformer_config(cfg, device.type)
        use_compiled_rope(on_for_cuda(cfg.rope_fusion, device.type))
        self.fused_cross_entropy = on_for_cuda(cfg.cross_entropy_fusion, device.type)
        model = build_gpt(
            cfg, self.config, pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(), fused_cross_entropy=self.fused_cross_entropy,
        )
        model = model.to(device)
        if cfg.precision != "fp32":
            model = Float16Module(self.config, model)  # megatron raises a dtype error on half inputs otherwise
        overlap = cfg.overlap_grad_reduce if cfg.overlap_grad_reduce is not None else cfg.data_parallel > 1
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=overlap, use_distributed_optimizer=True,
        )
        self.model = DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=model)
        self.optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=cfg.lr, min_lr=cfg.min_lr, weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps, clip_grad=cfg.clip_grad,
            bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16", params_dtype=self.config.params_dtype,
            initial_loss_scale=cfg.initial_loss_scale, loss_scale_window=cfg.loss_scale_window,
            hysteresis=cfg.loss_scale_hysteresis, min_loss_scale=cfg.min_loss_scale,
            use_distributed_optimizer=True,
        ), [self.model])
        if on_for_cuda(cfg.fused_optimizer, device.type):
            use_fused_adam(self.optimizer)
        # CARAML's schedule: warm-up and cosine decay counted in samples, stepped by the global batch.
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=0.0, max_lr=cfg.lr, min_lr=cfg.min_lr,
            lr_warmup_steps=cfg.lr_warmup_samples, lr_decay_steps=cfg.lr_decay_samples, lr_decay_style="cosine",
            start_wd=cfg.weight_decay, end_wd=cfg.weight_decay, wd_incr_steps=cfg.lr_decay_samples,
            wd_incr_style="constant",
        )
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.grad_scale_func = self.optimizer.scale_loss
        if overlap:
            # As Megatron-LM: no reduction during gradient accumulation; the last micro-batch's
            # backward starts the bucketed reduce-scatter, finalize_model_grads waits for it.
            self.config.no_sync_func = self.model.no_sync
            self.config.grad_sync_func = self.model.start_grad_sync
        self.forward_backward = get_forward_backward_func()
        if cfg.cuda_graphs == "step":  # megatron records forward-backward once, then replays it (static data buffers)
            self.forward_backward = FullCudaGraphWrapper(self.forward_backward,
                                                         cuda_graph_warmup_steps=CUDA_GRAPH_WARMUP)
        # A steady window sized by time has no count yet: the stream wraps around the dataset if it runs longer.
        steps = cfg.warmup_iterations + cfg.iterations if cfg.iterations else DATASET_ITERATIONS
        samples = cfg.global_batch_size * (1 if cfg.overfit_batch else steps)
        dataset = data.build_train_dataset(cfg, samples)
        self.batches = data.micro_batches(dataset, cfg, parallel_state.get_data_parallel_rank(), device)
        self.skipped_updates = 0
        self.phases = PhaseRecorder(enabled=False)

    def mark_phases(self, recorder: PhaseRecorder) -> None:
        """Forward, backward, grad_reduce through megatron's timer hooks (llm_training.phases); the optimizer here."""
        self.phases = recorder
        if self.cfg.cuda_graphs != "step":  # one replayed graph has no forward/backward boundary to mark
            self.config.timers = MegatronPhaseTimers(recorder, self.cfg.data_parallel)

    def active_fusions(self) -> dict[str, bool]:
        """Which optional kernels this run really uses, read from the built objects (the options may be unset)."""
        groups = [group for inner in _torch_optimizers(self.optimizer) for group in inner.param_groups]
        return {
            "bias_activation": self.config.bias_activation_fusion,
            "bias_dropout": self.config.bias_dropout_fusion,
            "rope_compiled": compiled_rope_active(),
            "cross_entropy": self.fused_cross_entropy,
            "fused_adam": bool(groups) and all(g.get("fused") for g in groups),
            "cuda_graphs": self.config.cuda_graph_impl == "local",
        }

    def _forward_backward(self, forward_only: bool = False, micro_batches: int | None = None
                          ) -> list[dict[str, torch.Tensor]]:
        return self.forward_backward(
            forward_step_func=_forward_step, data_iterator=self.batches, model=[self.model],
            num_microbatches=micro_batches or self.cfg.num_microbatches, seq_length=self.cfg.seq_length,
            micro_batch_size=self.cfg.micro_batch_size, forward_only=forward_only,
        )

    def _forward_only(self) -> None:
        """Forward of one global batch, its graphs kept as in training but never more micro-batches' at once than
        training holds (`micro_batches_in_flight`): a forward-only pass over all micro-batches keeps every graph
        alive until it returns, and at the MBS chosen by memory (800M: 16, four micro-batches) that ran out of
        memory on an H100 where training fits."""
        chunk, left = self.cfg.micro_batches_in_flight, self.cfg.num_microbatches
        while left > 0:
            self._forward_backward(forward_only=True, micro_batches=min(chunk, left))
            left -= chunk

    def _gradients(self) -> list[dict[str, torch.Tensor]]:
        """Forward and backward of one global batch into freshly zeroed gradient buffers."""
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        return self._forward_backward()

    def step(self) -> torch.Tensor | None:
        """One global batch; returns the mean micro-batch loss (on the last pipeline stage, else None)."""
        losses = self._gradients()
        with self.phases.phase(OPTIMIZER):
            update_successful, _grad_norm, _zeros = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=self.cfg.global_batch_size)
        else:
            self.skipped_updates += 1  # fp16 loss-scale overflow: megatron skips the update
        if not losses:
            return None
        return torch.stack([item["lm loss"] for item in losses]).mean()

    def phase_replays(self) -> list[Replay]:
        """The replay estimator's parts: forward of all micro-batches (graphs kept, as in training, then
        dropped: `_forward_only`), forward + backward (with DP > 1 the gradient reduction too: it needs backward's
        buckets), the optimizer step alone on the real gradients, and the whole step for comparison."""
        return [Replay("forward", self._forward_only),
                Replay("forward+backward", self._gradients),
                Replay("optimizer", self.optimizer.step, setup=self._gradients),
                Replay("step", self.step)]


def _pipeline_loss(loss: torch.Tensor | None, device: torch.device) -> float:
    """Loss averaged over DP, sent from the last pipeline stage to the others (collective; log steps only)."""
    value = torch.zeros(1, device=device) if loss is None else loss.detach().float().reshape(1).clone()
    if loss is not None:
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
        value /= parallel_state.get_data_parallel_world_size()
    dist.broadcast(value, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                   group=parallel_state.get_pipeline_model_parallel_group())
    return float(value.item())


def _any_rank(flag: bool, device: torch.device) -> bool:
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _train(cfg: TrainConfig, launch: LaunchEnv, device: torch.device, stop: StopRequest, run: Run) -> LoopResult:
    """Build the model, take the idle baseline, run the windows (joulebench.loop), replay phases if asked."""
    record = run.record
    cuda = device.type == "cuda"
    meter = run.open_meter(sync=torch.cuda.synchronize if cuda else None, methods=cfg.energy_methods,
                           phase_stamps=DeviceEventStamps(torch) if cuda else None)
    trainer = Trainer(cfg, device)
    trainer.mark_phases(meter.phases)
    fusions = trainer.active_fusions()
    record.config["active_fusions"] = fusions
    _log(launch, f"model built: {cfg.model}, TP={cfg.tensor_parallel} PP={cfg.pipeline_parallel} "
                 f"DP={cfg.data_parallel}, {cfg.precision}, MBS={cfg.micro_batch_size} "
                 f"({cfg.micro_batch_size_from}) GBS={cfg.global_batch_size} "
                 f"({cfg.num_microbatches} micro-batch{'es' if cfg.num_microbatches != 1 else ''} per replica), "
                 f"recompute={cfg.recompute}, device={device}, "
                 f"fusions: {', '.join(name for name, on in fusions.items() if on) or 'none'}")
    run.idle_baseline(cfg.idle_baseline, cuda, _all_gather)
    spec = cfg.loop_spec()
    steps = TrainSteps(step=trainer.step, loss=lambda loss: _pipeline_loss(loss, device),
                       any_rank=lambda flag: _any_rank(flag, device), gather=_all_gather, sync=meter.sync)
    loop = run_loop(steps, meter, spec, stop, device.type, Progress("llm_training", spec, launch.is_global_zero),
                    run.intervals(spec.work_unit, spec.work_per_step, cfg.world_size))
    record.meter["steady_plan"] = loop.plan.to_dict() if loop.plan else None
    run.step_times(loop.step_times_s, STEP_TIMES_BASIS)
    record.metrics = TrainingMetrics(loss_curve=[{"iteration": step, "loss": loss} for step, loss in loop.losses],
                                     skipped_updates=trainer.skipped_updates)  # the body's figures: only these
    if loop.stop_reason:
        run.stopped_early(loop.completed, loop.planned, cfg.warmup_iterations)
    elif cfg.replay_phases_s:  # a stopped run has no time to spare
        agree = None if launch.world_size == 1 else (lambda count: max(int(n) for n in _all_gather(count)))
        replay_phases(meter, trainer.phase_replays(), cfg.replay_phases_s, agree, lambda text: _log(launch, text),
                      stop.local_reason)
    return loop


def _all_gather(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order (each rank passes the same kind of value)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def _metrics(cfg: TrainConfig, record: RunRecord, device: torch.device, cache: CompileCache | None
             ) -> TrainingMetrics:
    steady = record.window("steady")
    params = parameter_count(cfg.shape, cfg.padded_vocab_size)
    flops = model_flops_per_token(params, cfg.num_layers, cfg.hidden_size, cfg.seq_length)
    peak = peak_flops(str(record.hardware.get("device_name", "")), cfg.precision)
    headline: SteadyFigures = {"work_unit": "tokens"} if steady is None else steady_metrics(
        steady, work_unit="tokens", devices=cfg.world_size, flops_per_unit=flops, peak_flops_per_device=peak)
    caraml_flops = caraml_nvidia_flops_per_token(cfg.num_layers, cfg.hidden_size, cfg.seq_length,
                                                 cfg.padded_vocab_size)
    per_device = headline.get("tokens_per_s_per_device")
    warmup = record.window("warmup")
    return {
        **headline,
        "parameters": params,
        "flops_formula": "6N + 12*L*h*s per token (model FLOPs, recompute not counted)",
        "caraml_x4_flops_per_token": caraml_flops,
        "caraml_x4_tflops_per_device": None if per_device is None else per_device * caraml_flops / 1e12,
        "caraml_x4_note": "CARAML NVIDIA-patch count 96*L*h^2*(1+s/(6h)+V/(16*L*h)): comparison only, not MFU",
        "global_batch_size": cfg.global_batch_size, "tokens_per_iteration": cfg.tokens_per_iteration,
        "warmup_iterations": warmup.steps if warmup else 0,
        "warmup_duration_s": warmup.duration_s if warmup else None,
        "compile_s": compile_seconds(warmup.duration_s if warmup else None, cache is not None),
        "compile_cache": cache.figures() if cache else None,
        "memory_estimate_gib": memory.estimate_memory(cfg).total_gib,
        "peak_memory_allocated_gib": (torch.cuda.max_memory_allocated() / 1024**3) if device.type == "cuda" else None,
    }


def run(cfg: TrainConfig, launch: LaunchEnv, device: torch.device, cache: CompileCache | None = None) -> int:
    """Train and write the run record (rank 0); returns the process exit code. Config is already validated;
    `cache`: the checked compile caches where the run compiles (joulebench.compile_cache), None where it does not."""
    if cache is not None:
        cache.activate()
    with Lifecycle("llm_training", launch, cfg.exit_duration_mins) as life, contextlib.ExitStack() as stack:
        with life.run(cfg.run_id, Path(cfg.out_dir), cfg.to_dict(), gather=_all_gather,
                      metrics=lambda record: _metrics(cfg, record, device, cache), log_to=cfg.log_to) as run:
            if device.type == "cpu":
                stack.enter_context(cpu_compat.cpu_mode(device))
            distributed.init_distributed(launch, device, cfg)
            run.record.hardware = hardware_info(device, launch)
            warning = memory.fit_warning(cfg, run.record.hardware.get("device_memory_gib"))
            if warning:
                _log(launch, warning)
                run.record.warn(warning)
            _train(cfg, launch, device, life.stop, run)
        if run.record.status != "FAILED":  # after a failure the other ranks may never reach a collective
            distributed.shutdown_distributed()
        return life.exit_code()
