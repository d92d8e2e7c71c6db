"""AMD Instinct GPUs through ROCm's `amdsmi` Python bindings.

* Energy: `amdsmi_get_energy_count` gives ticks (`energy_accumulator`, called `power` before amdsmi 6.2.1)
  of `counter_resolution` µJ each; ticks × resolution = µJ (treating ticks as µJ is a known bug class).
* Power: `amdsmi_get_power_info` in whole watts: `current_socket_power` (MI300+, instantaneous) or
  `average_socket_power` (MI200 and older; AMD does not document its averaging window, so avg_window_s
  is left unknown). "N/A" strings and UINT32_MAX mean unsupported, never 0 W.
* MI250/MI250X: the two GCDs of a package share one sensor; GCD 1 reports "N/A (Secondary die)" or 0.
  Both become ONE PACKAGE domain whose `shared_with` names both GCDs, metered through the die that reports.
  GCDs are paired by board serial number, or, where amdsmi gives none, by enumeration pairs (0,1), (2,3)...
  as Zeus does. A job holding one GCD still gets the package, flagged shared (attrs["job_gcds"]).
* amdsmi is not thread-safe before ROCm 7.2: every call goes through one lock.
* Counter bugs (frozen MI100 counters, backward jumps): `counter_plausible` is Zeus's ratio check, for the
  sampler to run on two counter reads and a power reading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import threading
from collections.abc import Callable, Sequence
from typing import Any

from jpwr.backends._base import failed, unavailable
from jpwr.clock import Clock
from jpwr.domains import Discovery, Domain, Kind, MetricReading, Reading, Sensor, Signal, Status
from jpwr.errors import ValidationError
from jpwr.selectors import selector_kind, selector_matches

NAME = "amdsmi"
_INVALID = (0xFFFFFFFF, 0xFFFF)  # UINT32_MAX / UINT16_MAX: "not supported" in amdsmi integer fields


def _number(value: Any) -> float | None:
    """An amdsmi numeric field, or None for "N/A..." strings and UINT32_MAX/UINT16_MAX."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value in _INVALID:
        return None
    return float(value)


@dataclasses.dataclass
class _Gcd:
    handle: Any
    position: int  # amdsmi enumeration position
    uuid: str
    bdf: str
    name: str
    serial: str
    hip_id: int | None
    power_key: str | None  # which power_info key carries this die's power, None if it reports none


@dataclasses.dataclass
class _Meter:
    """One metered domain and the GCD whose handle feeds its sensors."""

    gcd: _Gcd
    domain: Domain
    counter: Sensor | None = None
    power: Sensor | None = None


class AmdSmiBackend:
    name = NAME

    def __init__(self, clock: Clock, selectors: Sequence[str] | None = None) -> None:
        self._clock = clock
        self._selectors = None if selectors is None else list(selectors)
        self._lock = threading.Lock()  # amdsmi is not thread-safe before ROCm 7.2
        self._smi: Any = None
        self._meters: list[_Meter] = []

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            return fn(*args)

    # ---- discovery -------------------------------------------------------------------------------
    def discover(self) -> Discovery:
        disc = Discovery(NAME)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints when libamd_smi.so is missing
                import amdsmi
        except ImportError:
            disc.unavailable.append(unavailable(NAME, "amdsmi not installed (ships with ROCm: /opt/rocm/share/amdsmi)"))
            return disc
        except (OSError, AttributeError, KeyError) as exc:  # library/ROCm version mismatch
            disc.unavailable.append(unavailable(NAME, f"amdsmi import failed: {exc!r}"))
            return disc
        try:
            self._call(amdsmi.amdsmi_init, amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except amdsmi.AmdSmiException as exc:
            disc.unavailable.append(unavailable(NAME, f"amdsmi_init failed: {exc} (no amdgpu driver or GPU?)"))
            return disc
        self._smi = amdsmi
        self._meters = []
        try:
            version = self._call(amdsmi.amdsmi_get_lib_version)
            disc.info["amdsmi"] = ".".join(str(version.get(k, "?")) for k in ("major", "minor", "release"))
            gcds = [self._gcd(i, h) for i, h in enumerate(self._call(amdsmi.amdsmi_get_processor_handles))]
            if gcds:
                driver = self._call(amdsmi.amdsmi_get_gpu_driver_info, gcds[0].handle)
                disc.info["driver"] = str(driver.get("driver_version", "unknown"))
            selected = self._select(gcds, disc)
            for group in self._packages(gcds):
                if any(g.uuid in selected for g in group):
                    self._add_meter(disc, group, [g for g in group if g.uuid in selected])
        except Exception as exc:  # AmdSmiException, or an API this amdsmi version lacks: discover() must not raise
            disc.unavailable.append(unavailable(NAME, f"amdsmi query failed during discovery: {exc!r}"))
        if not disc.sensors and not disc.unavailable:
            disc.unavailable.append(unavailable(NAME, "no GPUs selected"))
        return disc

    def _gcd(self, position: int, handle: Any) -> _Gcd:
        smi = self._smi
        power = self._call(smi.amdsmi_get_power_info, handle)
        key = next((k for k in ("current_socket_power", "average_socket_power") if _number(power.get(k))), None)
        try:
            hip_id = int(self._call(smi.amdsmi_get_gpu_enumeration_info, handle)["hip_id"])  # ROCm 6.4+
        except (smi.AmdSmiException, AttributeError, KeyError):
            hip_id = None
        try:
            serial = str(self._call(smi.amdsmi_get_gpu_board_info, handle).get("product_serial", ""))
        except smi.AmdSmiException:
            serial = ""
        return _Gcd(handle, position, str(self._call(smi.amdsmi_get_gpu_device_uuid, handle)),
                    str(self._call(smi.amdsmi_get_gpu_device_bdf, handle)),
                    str(self._call(smi.amdsmi_get_gpu_asic_info, handle)["market_name"]),
                    "" if serial.startswith("N/A") else serial, hip_id, key)

    def _select(self, gcds: list[_Gcd], disc: Discovery) -> set[str]:
        """Selectors -> UUIDs. Indices are HIP ids where amdsmi reports them, else enumeration positions."""
        if self._selectors is None:
            return {g.uuid for g in gcds}
        chosen: set[str] = set()
        for selector in self._selectors:
            try:
                kind = selector_kind(selector)
            except ValidationError as exc:
                disc.unavailable.append(unavailable(NAME, str(exc)))
                continue
            matches = [g for g in gcds if selector_matches(
                selector, kind, g.position if g.hip_id is None else g.hip_id, g.uuid, g.bdf)]
            if len(matches) == 1:
                chosen.add(matches[0].uuid)
            else:
                disc.unavailable.append(unavailable(NAME, f"device {selector!r} matches no single GPU of {len(gcds)}"))
        return chosen

    @staticmethod
    def _packages(gcds: list[_Gcd]) -> list[list[_Gcd]]:
        """Group dies that share a sensor: MI250/MI250X GCD pairs; every other GPU on its own."""
        groups: dict[str, list[_Gcd]] = {}
        for g in gcds:
            key = g.uuid
            if "MI250" in g.name:
                key = f"serial:{g.serial}" if g.serial else f"pair:{g.position // 2}"
            groups.setdefault(key, []).append(g)
        return list(groups.values())

    def _add_meter(self, disc: Discovery, group: list[_Gcd], job_gcds: list[_Gcd]) -> None:
        smi = self._smi
        reporting = next((g for g in group if g.power_key), group[0])
        ids = tuple(f"amdsmi:{g.uuid}" for g in group)
        attrs = (("job_gcds", ",".join(f"amdsmi:{g.uuid}" for g in job_gcds)),)
        if len(group) > 1:
            domain = Domain(f"amdsmi:package:{reporting.uuid}", NAME, Kind.PACKAGE, reporting.name, reporting.uuid,
                            reporting.bdf, reporting.position, shared_with=ids, attrs=attrs)
        else:
            domain = Domain(ids[0], NAME, Kind.GPU, reporting.name, reporting.uuid, reporting.bdf,
                            reporting.position, attrs=attrs)
        disc.domains.append(domain)
        meter = _Meter(reporting, domain)
        try:
            self._read_energy(reporting.handle)
            meter.counter = Sensor(f"{domain.id}/energy_counter", domain.id, Signal.ENERGY_COUNTER)
            disc.sensors.append(meter.counter)
        except (smi.AmdSmiException, KeyError) as exc:
            disc.unavailable.append(unavailable(NAME, f"{domain.id}/energy_counter: {exc!r} (VM guest?)"))
        if reporting.power_key == "current_socket_power":
            meter.power = Sensor(f"{domain.id}/power_instant", domain.id, Signal.POWER_INSTANT, resolution=1.0)
        elif reporting.power_key == "average_socket_power":
            meter.power = Sensor(f"{domain.id}/power_average", domain.id, Signal.POWER_AVERAGE, resolution=1.0)
        else:
            disc.unavailable.append(unavailable(NAME, f"{domain.id}: amdsmi_get_power_info reports no power"))
        if meter.power:
            disc.sensors.append(meter.power)
        self._meters.append(meter)

    def _power(self, gcd: _Gcd) -> Any:
        return self._call(self._smi.amdsmi_get_power_info, gcd.handle)[gcd.power_key]

    def _read_energy(self, handle: Any) -> float:
        """Joules: ticks × counter_resolution (µJ/tick) / 1e6."""
        data = self._call(self._smi.amdsmi_get_energy_count, handle)
        ticks = data["energy_accumulator"] if "energy_accumulator" in data else data["power"]
        return float(ticks) * float(data["counter_resolution"]) / 1e6

    # ---- reading ---------------------------------------------------------------------------------
    def read(self, sensors: Sequence[Sensor]) -> list[Reading]:
        wanted = {s.id for s in sensors}
        readings: list[Reading] = []
        for meter in self._meters:
            if meter.counter and meter.counter.id in wanted:
                readings.append(self._read(meter.counter.id, functools.partial(self._read_energy, meter.gcd.handle)))
            if meter.power and meter.power.id in wanted:
                readings.append(self._read(meter.power.id, functools.partial(self._power, meter.gcd)))
        known = {r.sensor_id for r in readings}
        now = self._clock.monotonic_ns()
        readings.extend(failed(sid, now, now) for sid in sorted(wanted - known))
        return readings

    def _read(self, sensor_id: str, call: Callable[[], Any]) -> Reading:
        t0 = self._clock.monotonic_ns()
        try:
            value = _number(call())
        except self._smi.AmdSmiException as exc:
            code = exc.get_error_code() if hasattr(exc, "get_error_code") else None
            status = Status.UNSUPPORTED if code == 2 else Status.ERROR  # 2: AMDSMI_STATUS_NOT_SUPPORTED
            return failed(sensor_id, t0, self._clock.monotonic_ns(), status)
        except (KeyError, TypeError, ValueError):
            return failed(sensor_id, t0, self._clock.monotonic_ns())
        t1 = self._clock.monotonic_ns()
        if value is None:
            return failed(sensor_id, t0, t1, Status.UNSUPPORTED)
        return Reading(sensor_id, t0, t1, value)

    @staticmethod
    def counter_plausible(energy_before_j: float, energy_after_j: float, power_w: float, seconds: float) -> bool | None:
        """Zeus's start-up check: counter delta / (power × dt) must lie in (0.1, 10). None: power too low to tell."""
        expected = power_w * seconds
        if expected <= 1e-3:
            return None
        return 0.1 < (energy_after_j - energy_before_j) / expected < 10

    def read_metrics(self) -> list[MetricReading]:
        smi = self._smi
        metrics: list[MetricReading] = []
        probes: list[tuple[str, Callable[[Any], Any], float]] = [  # each reads one GCD, given its handle
            ("utilization_gpu", lambda h: smi.amdsmi_get_gpu_activity(h)["gfx_activity"], 0.01),
            ("utilization_memory", lambda h: smi.amdsmi_get_gpu_activity(h)["umc_activity"], 0.01),
            ("sm_clock_hz", lambda h: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)["clk"], 1e6),
            ("memory_clock_hz", lambda h: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.MEM)["clk"], 1e6),
            ("memory_used_bytes", lambda h: smi.amdsmi_get_gpu_vram_usage(h)["vram_used"], 1024.0**2),  # MiB
            ("temperature_c", lambda h: smi.amdsmi_get_temp_metric(
                h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT), 1.0),
            ("power_limit_w", lambda h: smi.amdsmi_get_power_cap_info(h)["power_cap"], 1e-6),  # µW
        ]
        for meter in self._meters:
            for metric, probe, scale in probes:
                t0 = self._clock.monotonic_ns()
                try:
                    value = _number(self._call(probe, meter.gcd.handle))
                except (smi.AmdSmiException, KeyError, AttributeError):
                    continue
                if value is not None:
                    t = (t0 + self._clock.monotonic_ns()) // 2
                    metrics.append(MetricReading(meter.domain.id, metric, t, value * scale))
        return metrics

    def close(self) -> None:
        if self._smi is not None:
            with contextlib.suppress(self._smi.AmdSmiException):
                self._call(self._smi.amdsmi_shut_down)
            self._smi = None
            self._meters = []
