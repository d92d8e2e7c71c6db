"""NVIDIA GPUs through NVML (the `pynvml` module of nvidia-ml-py).

Per GPU (identity: UUID and PCI bus id, plus NVML's index):

* energy counter, `nvmlDeviceGetTotalEnergyConsumption` (mJ since driver load, Volta+): the anchor for
  window totals. Reading it cost ~4 ms on an H100 VM, so the sampler decides how often to ask for it.
* `POWER_INSTANT` (field 186) and `POWER_AVERAGE` (field 185, trailing 1 s mean), read together in one
  `nvmlDeviceGetFieldValues` call per device; the field's own timestamp (µs, wall clock) is kept.
* `nvmlDeviceGetPowerUsage` only when neither field works, labelled by its sensor id suffix
  `:getpowerusage`. On Ampere and newer, except GA100 (A100/A800/A30), it is a 1 s trailing average
  (reference §2), so it is declared POWER_AVERAGE with avg_window_s=1; older GPUs and GA100 report
  instant power. Architecture comes from `nvmlDeviceGetArchitecture`, GA100 from the model name.

Grace Hopper (GH200): the counter and the default power cover the whole module (ml-energy/zeus#172), so they
go to a MODULE domain `nvml:<UUID>:module` that `contains` the GPU domain; the GPU domain keeps the GPU-scope
fields where the driver supports them. MIG: NVML has no per-instance power, so a MIG id selects the parent
GPU, flagged `shared_with=("mig",)` (so does a GPU with MIG mode on, whoever else uses it). With MIG on,
CUDA_VISIBLE_DEVICES should hold MIG ids (Slurm writes them); a bare index is taken as an NVML GPU index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from jpwr.backends._base import failed, unavailable
from jpwr.clock import Clock
from jpwr.device_state import DeviceState
from jpwr.domains import Discovery, Domain, Kind, MetricReading, Reading, Sensor, Signal, Status
from jpwr.errors import ValidationError
from jpwr.extras import install_hint
from jpwr.selectors import selector_kind

NAME = "nvml"
FI_POWER_AVERAGE = 185  # NVML_FI_DEV_POWER_AVERAGE
FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT
SCOPE_GPU = 0  # NVML_POWER_SCOPE_GPU
SCOPE_MODULE = 1  # NVML_POWER_SCOPE_MODULE
ARCH_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # nvidia-ml-py maps it to None; older versions pass it through
UPDATE_S = 0.1  # counter and power fields refresh every ~100 ms on H100 (reference §7)
_GA100 = re.compile(r"\bA(100|800|30)\b")  # GA100 parts: GetPowerUsage is still instantaneous there
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _text(value: str | bytes) -> str:
    """Older nvidia-ml-py versions return bytes for strings."""
    return value.decode() if isinstance(value, bytes) else value


def _used_bytes(process: Any) -> int | None:
    """A process's GPU memory; None where NVML does not know it (NVML_VALUE_NOT_AVAILABLE, some containers)."""
    used = getattr(process, "usedGpuMemory", None)
    return None if used is None or used >= NVML_VALUE_NOT_AVAILABLE else int(used)


def _field_value(fv: Any) -> float:
    return float(getattr(fv.value, _VALUE_MEMBER.get(int(fv.valueType), "uiVal")))


def resolve_gpus(nv: Any, selectors: Sequence[str] | None) -> tuple[list[tuple[int, Any, bool]], list[str]]:
    """Selectors (None = every GPU) -> (NVML index, handle, shared with MIG instances), each GPU once, in NVML order,
    and why a selector matched no single GPU. `nv` is the initialised pynvml module."""
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
    chosen: dict[int, bool] = {}
    problems: list[str] = []
    if selectors is None:
        chosen = dict.fromkeys(range(count), False)
    for selector in selectors or ():
        try:
            kind = selector_kind(selector)
        except ValidationError as exc:
            problems.append(str(exc))
            continue
        if kind == "index" and int(selector) < count:
            chosen[int(selector)] = chosen.get(int(selector), False)
        elif kind == "uuid" and len(match := [i for i, u in enumerate(uuids) if u.startswith(selector)]) == 1:
            chosen[match[0]] = chosen.get(match[0], False)
        elif kind in ("mig", "pci"):
            try:
                if kind == "mig":
                    handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nv.nvmlDeviceGetHandleByUUID(selector))
                else:
                    handle = nv.nvmlDeviceGetHandleByPciBusId(selector)
                index = uuids.index(_text(nv.nvmlDeviceGetUUID(handle)))
            except (nv.NVMLError, ValueError) as exc:
                problems.append(f"device {selector!r} not found: {exc}")
                continue
            chosen[index] = chosen.get(index, False) or kind == "mig"
        else:
            problems.append(f"device {selector!r} matches no single GPU of {count}")
    for index in chosen:
        chosen[index] = chosen[index] or _mig_enabled(nv, handles[index])
    return [(i, handles[i], chosen[i]) for i in sorted(chosen)], problems


def _mig_enabled(nv: Any, handle: Any) -> bool:
    try:
        return int(nv.nvmlDeviceGetMigMode(handle)[0]) == 1
    except nv.NVMLError:
        return False  # NOT_SUPPORTED on GPUs without MIG


@dataclasses.dataclass
class _Gpu:
    """One metered GPU and which NVML call feeds each of its sensors."""

    handle: Any
    domain: Domain
    counter: Sensor | None = None
    fields: list[tuple[Sensor, int, int]] = dataclasses.field(default_factory=list)  # sensor, field id, scope
    usage: Sensor | None = None


class NvmlBackend:
    name = NAME

    def __init__(self, clock: Clock, selectors: Sequence[str] | None = None) -> None:
        self._clock = clock
        self._selectors = None if selectors is None else list(selectors)
        self._nv: Any = None
        self._gpus: list[_Gpu] = []

    # ---- discovery -------------------------------------------------------------------------------
    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        self._gpus = []
        try:
            import pynvml
        except ImportError:
            missing = f"nvidia-ml-py (module pynvml) not installed: {install_hint('pynvml')}"
            disc.unavailable.append(unavailable(NAME, missing))
            return disc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            disc.unavailable.append(unavailable(NAME, f"nvmlInit failed: {exc} (no NVIDIA driver or GPU?)"))
            return disc
        self._nv = pynvml
        try:
            disc.info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            disc.info["nvml"] = _text(pynvml.nvmlSystemGetNVMLVersion())
            gpus, problems = resolve_gpus(pynvml, self._selectors)
            disc.unavailable += [unavailable(NAME, problem) for problem in problems]
            for index, handle, shared in gpus:
                self._add_gpu(disc, index, handle, shared)
        except Exception as exc:  # NVMLError, or a function this nvidia-ml-py lacks: discover() must not raise
            disc.unavailable.append(unavailable(NAME, f"NVML query failed during discovery: {exc!r}"))
        if not disc.sensors and not disc.unavailable:
            disc.unavailable.append(unavailable(NAME, "no GPUs selected"))
        return disc

    def _add_gpu(self, disc: Discovery, index: int, handle: Any, shared: bool) -> None:
        nv = self._nv
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        name = _text(nv.nvmlDeviceGetName(handle))
        attrs = [("architecture", str(self._try(lambda: nv.nvmlDeviceGetArchitecture(handle), "unknown")))]
        limit_mw = self._try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle), None)
        if limit_mw is not None:
            attrs.append(("power_limit_w", f"{limit_mw / 1000:g}"))
        gpu_domain = Domain(
            id=f"nvml:{uuid}", backend=NAME, kind=Kind.GPU, name=name, device_uuid=uuid,
            pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(handle).busId), index=index,
            shared_with=("mig",) if shared else (), attrs=tuple(attrs),
        )
        gpu = _Gpu(handle, gpu_domain)
        disc.domains.append(gpu_domain)
        whole = gpu_domain  # what the counter and GetPowerUsage cover
        if "GH200" in name:
            whole = dataclasses.replace(
                gpu_domain, id=f"{gpu_domain.id}:module", kind=Kind.MODULE, contains=(gpu_domain.id,)
            )
            disc.domains.append(whole)
        self._probe_counter(disc, gpu, whole)
        self._probe_fields(disc, gpu, whole)
        if not gpu.fields:
            self._probe_usage(disc, gpu, whole, name)
        self._gpus.append(gpu)

    def _probe_counter(self, disc: Discovery, gpu: _Gpu, domain: Domain) -> None:
        try:
            self._nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)
        except self._nv.NVMLError as exc:
            disc.unavailable.append(unavailable(NAME, f"{domain.id}/energy_counter: {exc} (pre-Volta GPU?)"))
            return
        gpu.counter = Sensor(f"{domain.id}/energy_counter", domain.id, Signal.ENERGY_COUNTER, UPDATE_S, None, 1e-3)
        disc.sensors.append(gpu.counter)

    def _probe_fields(self, disc: Discovery, gpu: _Gpu, whole: Domain) -> None:
        wanted = [(Signal.POWER_INSTANT, FI_POWER_INSTANT, SCOPE_GPU, gpu.domain),
                  (Signal.POWER_AVERAGE, FI_POWER_AVERAGE, SCOPE_GPU, gpu.domain)]
        if whole is not gpu.domain:
            wanted.append((Signal.POWER_INSTANT, FI_POWER_INSTANT, SCOPE_MODULE, whole))
        try:
            values = self._nv.nvmlDeviceGetFieldValues(gpu.handle, [(fid, scope) for _, fid, scope, _ in wanted])
        except (self._nv.NVMLError, TypeError) as exc:  # TypeError: nvidia-ml-py too old for (field, scope) pairs
            disc.unavailable.append(unavailable(NAME, f"{gpu.domain.id}: power fields: {exc}"))
            return
        for (signal, fid, scope, domain), fv in zip(wanted, values, strict=True):
            sensor_id = f"{domain.id}/{signal.value}"
            if int(fv.nvmlReturn) != 0:
                reason = str(self._nv.NVMLError(int(fv.nvmlReturn)))
                disc.unavailable.append(unavailable(NAME, f"{sensor_id}: field {fid} scope {scope}: {reason}"))
                continue
            avg = 1.0 if signal is Signal.POWER_AVERAGE else None
            sensor = Sensor(sensor_id, domain.id, signal, UPDATE_S, avg, 1e-3)
            gpu.fields.append((sensor, fid, scope))
            disc.sensors.append(sensor)

    def _probe_usage(self, disc: Discovery, gpu: _Gpu, domain: Domain, name: str) -> None:
        try:
            self._nv.nvmlDeviceGetPowerUsage(gpu.handle)
        except self._nv.NVMLError as exc:
            disc.unavailable.append(unavailable(NAME, f"{domain.id}: nvmlDeviceGetPowerUsage: {exc}"))
            return
        arch = self._try(lambda: int(self._nv.nvmlDeviceGetArchitecture(gpu.handle)), ARCH_AMPERE)
        averaged = arch >= ARCH_AMPERE and not _GA100.search(name)
        signal = Signal.POWER_AVERAGE if averaged else Signal.POWER_INSTANT
        gpu.usage = Sensor(f"{domain.id}/{signal.value}:getpowerusage", domain.id, signal, UPDATE_S,
                           1.0 if averaged else None, 1e-3)
        disc.sensors.append(gpu.usage)
        disc.info[gpu.usage.id] = "fallback: nvmlDeviceGetPowerUsage (POWER_INSTANT/POWER_AVERAGE fields unsupported)"

    def _try(self, call: Callable[[], Any], default: Any) -> Any:
        try:
            return call()
        except self._nv.NVMLError:
            return default

    # ---- reading ---------------------------------------------------------------------------------
    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        wanted = {s.id for s in sensors}
        readings: list[Reading] = []
        for gpu in self._gpus:
            if gpu.counter and gpu.counter.id in wanted:
                readings.append(self._read_scalar(gpu.counter.id, gpu.handle, "nvmlDeviceGetTotalEnergyConsumption"))
            fields = [f for f in gpu.fields if f[0].id in wanted]
            if fields:
                readings.extend(self._read_fields(gpu.handle, fields))
            if gpu.usage and gpu.usage.id in wanted:
                readings.append(self._read_scalar(gpu.usage.id, gpu.handle, "nvmlDeviceGetPowerUsage"))
        known = {r.sensor_id for r in readings}
        now = self._clock.monotonic_ns()
        readings.extend(failed(sid, now, now) for sid in sorted(wanted - known))
        return readings

    def _failed(self, sensor_id: str, t0: int, t1: int, exc: Exception | int) -> Reading:
        """A failed read, with NVML's own name for the error so that a fault report can say what happened."""
        code = exc if isinstance(exc, int) else getattr(exc, "value", None)
        status = Status.UNSUPPORTED if code == self._nv.NVML_ERROR_NOT_SUPPORTED else Status.ERROR
        return failed(sensor_id, t0, t1, status, self._error_name(code))

    def _error_name(self, code: int | None) -> str:
        names = [n for n in dir(self._nv) if n.startswith("NVML_ERROR_") and getattr(self._nv, n) == code]
        return names[0] if names else f"NVML error {code}"

    def _read_scalar(self, sensor_id: str, handle: Any, function: str) -> Reading:
        """Counter (mJ) or GetPowerUsage (mW): both are thousandths of the SI unit."""
        t0 = self._clock.monotonic_ns()
        try:
            value = getattr(self._nv, function)(handle)
        except self._nv.NVMLError as exc:
            return self._failed(sensor_id, t0, self._clock.monotonic_ns(), exc)
        return Reading(sensor_id, t0, self._clock.monotonic_ns(), value / 1000.0)

    def _read_fields(self, handle: Any, fields: list[tuple[Sensor, int, int]]) -> list[Reading]:
        t0 = self._clock.monotonic_ns()
        try:
            values = self._nv.nvmlDeviceGetFieldValues(handle, [(fid, scope) for _, fid, scope in fields])
        except self._nv.NVMLError as exc:
            t1 = self._clock.monotonic_ns()
            return [self._failed(sensor.id, t0, t1, exc) for sensor, _, _ in fields]
        t1 = self._clock.monotonic_ns()
        readings = []
        for (sensor, _, _), fv in zip(fields, values, strict=True):
            if int(fv.nvmlReturn) != 0:
                readings.append(self._failed(sensor.id, t0, t1, int(fv.nvmlReturn)))
                continue
            hw_ns = int(fv.timestamp) * 1000 if int(fv.timestamp) > 0 else None  # µs since the Unix epoch
            readings.append(Reading(sensor.id, t0, t1, _field_value(fv) / 1000.0, Status.OK, hw_ns))
        return readings

    def read_metrics(self) -> list[MetricReading]:
        nv = self._nv
        metrics: list[MetricReading] = []
        probes: list[tuple[str, Callable[[Any], float]]] = [  # each reads one GPU, given its handle
            ("utilization_gpu", lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            ("utilization_memory", lambda h: nv.nvmlDeviceGetUtilizationRates(h).memory / 100.0),
            ("sm_clock_hz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6),
            ("memory_clock_hz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) * 1e6),
            ("memory_used_bytes", lambda h: float(nv.nvmlDeviceGetMemoryInfo(h).used)),
            ("temperature_c", lambda h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            ("throttle_reasons", lambda h: float(self._clock_event_reasons(h))),
            ("power_limit_w", lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        ]
        for gpu in self._gpus:
            for metric, probe in probes:
                t0 = self._clock.monotonic_ns()
                try:
                    value = probe(gpu.handle)
                except nv.NVMLError:
                    continue  # not offered on this GPU: simply absent, never 0
                metrics.append(MetricReading(gpu.domain.id, metric, (t0 + self._clock.monotonic_ns()) // 2, value))
        return metrics

    def device_state(self) -> list[DeviceState]:
        """Each metered GPU's clock event reasons and the processes holding a context on it (compute and
        graphics): what tells a run disturbed by others. Read-only; a part NVML cannot give is None with why."""
        states = []
        for gpu in self._gpus:
            reasons = processes = None
            problems = []
            try:
                reasons = int(self._clock_event_reasons(gpu.handle))
            except (self._nv.NVMLError, AttributeError) as exc:
                problems.append(f"clock event reasons: {exc}")
            try:
                found = [*self._nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle),
                         *self._nv.nvmlDeviceGetGraphicsRunningProcesses(gpu.handle)]
                processes = {int(p.pid): _used_bytes(p) for p in found}
            except (self._nv.NVMLError, AttributeError) as exc:
                problems.append(f"running processes: {exc}")
            states.append(DeviceState(gpu.domain.id, reasons, processes, "; ".join(problems) or None))
        return states

    def _clock_event_reasons(self, handle: Any) -> int:
        """Bit mask of why clocks are held down; the 'Throttle' name is deprecated in newer NVML."""
        call = getattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        return (call or self._nv.nvmlDeviceGetCurrentClocksThrottleReasons)(handle)

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
            self._nv = None
            self._gpus = []
