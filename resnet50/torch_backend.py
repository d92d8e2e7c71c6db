"""PyTorch backend: torchvision `resnet50` (v1.5), AMP, channels-last, torch.compile (default on GPUs), DDP.

One process per device, under torchrun or srun (LaunchEnv.export_torch_env makes env://
work under both); NCCL on GPUs, gloo on CPUs. The step never waits for the device: the loss
stays on the device, gradients are dropped with set_to_none, SGD is fused on GPUs (which also
lets GradScaler skip its per-step host check of inf/NaN for fp16).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

from joulebench.launch import LaunchEnv
from joulebench.phases import BACKWARD, FORWARD, GRAD_REDUCE, OPTIMIZER, Replay
from joulebench.record_types import HardwareBlock
from jpwr import ValidationError
from jpwr.phases import DeviceEventStamps, PhaseRecorder
from resnet50.config import MOMENTUM, WEIGHT_DECAY, TrainConfig, resolve_compile
from resnet50.torch_data import Batch, jpeg_batches, synthetic_batch

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def discover(config: TrainConfig, launch: LaunchEnv) -> tuple[int, str]:
    """One replica per process; CUDA (or ROCm) when visible and not refused with --device cpu."""
    use_cuda = config.device != "cpu" and torch.cuda.is_available()
    if use_cuda and launch.local_world_size > torch.cuda.device_count():
        raise ValidationError(
            f"{launch.local_world_size} processes on this node but only {torch.cuda.device_count()} GPUs visible",
            "start one process per GPU (torchrun --nproc-per-node / srun --ntasks-per-node = GPUs per node)",
        )
    return launch.world_size, "cuda" if use_cuda else "cpu"


def build_model(bn_kernels: str) -> torch.nn.Module:
    """torchvision's ResNet-50 v1.5; with "triton" the same network (same weights for a seed) whose batch norms run
    our Triton kernels with the residual add and ReLU fused, with "triton-conv" also its 1x1 convolutions as our GEMM
    that measures their norms' statistics (imported here: it loads Triton)."""
    if bn_kernels != "inductor":
        from resnet50.fused_bn import fused_resnet50

        return fused_resnet50(conv_stats=bn_kernels == "triton-conv")
    return torchvision.models.resnet50(weights=None)


def create(config: TrainConfig, launch: LaunchEnv) -> TorchBackend:
    return TorchBackend(config, launch)


class TorchBackend:
    def __init__(self, config: TrainConfig, launch: LaunchEnv) -> None:
        self.devices, self.device_kind = discover(config, launch)
        self.launch = launch
        self.device = torch.device(f"cuda:{launch.local_rank}" if self.device_kind == "cuda" else "cpu")
        cuda = self.device_kind == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
        self.distributed = launch.world_size > 1
        if self.distributed:
            launch.export_torch_env()
            dist.init_process_group("nccl" if cuda else "gloo", device_id=self.device if cuda else None)
        torch.manual_seed(config.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
        memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
        model = build_model(config.bn_kernels).to(self.device, memory_format=memory_format)
        self.optimizer = torch.optim.SGD(
            model.parameters(), lr=config.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, fused=cuda or None
        )
        if self.distributed:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if cuda else None,
                gradient_as_bucket_view=True, broadcast_buffers=False,
            )
        resolve_compile(config, self.device_kind)  # done by the driver's checks already; here for direct use
        self.compiled = bool(config.compile)
        self._inductor_restore: tuple[Any, bool] | None = None
        if self.compiled:
            self._set_coordinate_descent_tuning(bool(config.coordinate_descent_tuning))
        self.model: Any = torch.compile(model, mode=config.compile_mode) if self.compiled else model
        self.model.train()
        self.amp_dtype = AMP_DTYPES.get(config.precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "fp16" else None
        batch = config.per_device_batch(self.devices)
        self.batches: Iterator[Batch] | None = None
        self.fixed: Batch | None = None
        if config.synthetic:
            self.fixed = synthetic_batch(config, batch, self.device, seed=config.seed + 1 + launch.rank)
        else:
            self.batches = jpeg_batches(config, batch, self.device, launch.rank, launch.world_size)
        self.phases = PhaseRecorder(enabled=False)

    def hardware(self) -> HardwareBlock:
        name = torch.cuda.get_device_name(self.device) if self.device_kind == "cuda" else "cpu"
        return {
            "device_kind": self.device_kind, "device_name": name, "devices": self.devices,
            "devices_per_node": self.launch.local_world_size, "nodes": self.launch.num_nodes,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            # Inductor's per-kernel tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1): +3 % img/s on
            # an H100 for minutes of warm-up; recorded because it changes the measured kernels.
            "inductor_coordinate_descent_tuning": self._coordinate_descent_tuning(),
        }

    def _set_coordinate_descent_tuning(self, value: bool) -> None:
        """Inductor reads its config when it compiles, at the first calls of the compiled model (the warm-up), so it
        is set here, before them, and put back at close() (several runs may share a process: the tests)."""
        from torch._inductor import config as inductor_config

        self._inductor_restore = (inductor_config, bool(inductor_config.coordinate_descent_tuning))
        inductor_config.coordinate_descent_tuning = value

    def _coordinate_descent_tuning(self) -> bool | None:
        """Whether torch.compile tunes each generated kernel's launch config (None without --compile)."""
        if not self.compiled:
            return None
        from torch._inductor import config as inductor_config

        return bool(inductor_config.coordinate_descent_tuning)

    def mark_phases(self, recorder: PhaseRecorder) -> None:
        """forward (model and loss under autocast), backward (autograd; DDP's all-reduce of the buckets that are
        ready early runs inside it), grad_reduce (with DDP only: from the last gradient computed, the input
        layer's, to the end of backward: the all-reduce not hidden behind backward), optimizer (step, zeroing)."""
        if self.device_kind == "cuda":
            recorder.set_stamps(DeviceEventStamps(torch))
        self.phases = recorder
        if self.distributed:
            first = next(p for p in self.model.parameters() if p.requires_grad)  # backward reaches it last
            first.register_post_accumulate_grad_hook(self._backward_done)

    def _backward_done(self, _param: torch.Tensor) -> None:
        if self.phases.current == BACKWARD:  # not in the replays, which run backward outside any phase
            self.phases.begin(GRAD_REDUCE)

    def _next_batch(self) -> Batch:
        """The fixed synthetic batch, else the next one read (the constructor sets one of the two)."""
        if self.fixed is not None:
            return self.fixed
        if self.batches is None:
            raise RuntimeError("the backend has neither a synthetic batch nor a reader")
        return next(self.batches)

    def _forward(self) -> torch.Tensor:
        images, labels = self._next_batch()
        amp = self.amp_dtype is not None
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=amp):
            return F.cross_entropy(self.model(images), labels)

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _update(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def train_step(self) -> torch.Tensor:
        with self.phases.phase(FORWARD):
            loss = self._forward()
        with self.phases.phase(BACKWARD):  # ending backward also ends grad_reduce begun inside it
            self._backward(loss)
        with self.phases.phase(OPTIMIZER):
            self._update()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def _gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._backward(self._forward())

    def phase_replays(self) -> list[Replay]:
        """forward (graph built, then dropped), forward + backward (with DDP its all-reduce too), the update alone
        on the last gradients (zeroing with set_to_none launches no kernel), and the whole step."""
        return [Replay("forward", self._forward), Replay("forward+backward", self._gradients),
                Replay("optimizer", self._update, setup=self._gradients), Replay("step", self.train_step)]

    def sync(self) -> None:
        if self.device_kind == "cuda":
            torch.cuda.synchronize(self.device)

    def loss_value(self, handle: torch.Tensor) -> float:
        loss = handle.float().reshape(1)
        if self.distributed:
            loss = loss.clone()
            dist.all_reduce(loss)  # gloo has no AVG: sum, then divide
            loss /= self.launch.world_size
        return float(loss.item())

    def any_rank(self, flag: bool) -> bool:
        if not self.distributed:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        gathered: list[Any] = [None] * self.launch.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def close(self) -> None:
        """Ranks leave together: rank 0 writes the record after the others are done, and a rank that tears its
        gloo connections down while a peer still holds them open was seen to abort the peer (SIGABRT, CI)."""
        if self.distributed and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        if self._inductor_restore is not None:
            inductor_config, value = self._inductor_restore
            inductor_config.coordinate_descent_tuning = value
            self._inductor_restore = None
