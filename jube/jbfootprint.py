"""Carbon and cost of a run, from the site profile only: an estimate, never a measurement, with its source.

    carbon_intensity_g_per_kwh = 380            a fixed intensity (g CO2e per kWh), or
    carbon_intensity_csv = /path/intensity.csv  hourly values: `time,value` per line, ISO 8601 with an offset
                                                (a relative path: to the profile file that sets it, or from a
                                                JOULEBENCH_* variable to the working directory: jbsystems.py)
    price_per_kwh = 0.31 and currency = EUR     a fixed price, or price_csv = /path/price.csv (same form)
    pue = 1.2                                   facility energy per accelerator energy (>= 1; empty: 1, stated)

Why here and not in the drivers: the profile is the site's, and the job's record is finished here (jbrecord.py).
No built-in intensity or price: without one the block says n/a with the reason. Energy is the run's metered
windows (idle baseline, warm-up, steady...), each spread evenly over its wall-clock span (the record's clock anchor
maps the node's monotonic window edges to UTC) and weighted by the hourly value of each hour it touches. The
error bound of the energy carries over (scaled by PUE and the value); the profile's values have no stated bound.
Standard library only: the login node's validate step (jbprofile.py) parses the files before anything runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jbsettings  # noqa: F401  (puts the repository root on sys.path, for the core's record types below)
from jbsystems import ConfigError

from joulebench.record_shape import checked_block
from joulebench.record_types import FootprintBlock

J_PER_KWH = 3.6e6
HOUR = dt.timedelta(hours=1)
# Plausible ranges of the profile's numbers: a typo (g instead of kg, a price in cents) must not pass silently.
LIMITS = {"carbon": (0.0, 5000.0), "price": (-10.0, 1000.0), "pue": (1.0, 5.0)}
PROFILE_KEYS = ("carbon_intensity_g_per_kwh", "carbon_intensity_csv", "price_per_kwh", "price_csv", "currency", "pue")


@dataclasses.dataclass(frozen=True)
class Rate:
    """A fixed value or hourly values (UTC hour start -> value), and where it came from."""

    source: str
    given: str  # the profile's text: the value, or the CSV's absolute path
    fixed: float | None = None
    hourly: Mapping[dt.datetime, float] | None = None

    def at(self, hour: dt.datetime) -> float | None:
        """The value of the hour starting at `hour` (UTC); None when the CSV does not cover it."""
        return self.fixed if self.hourly is None else self.hourly.get(hour)

    @property
    def phase(self) -> dt.timedelta:
        """How far past each UTC hour the rate's hours start: 30 min for a CSV in +05:30, else 0."""
        first = next(iter(self.hourly or {}), None)
        return dt.timedelta(0) if first is None else first - first.replace(minute=0, second=0, microsecond=0)


@dataclasses.dataclass(frozen=True)
class SiteFootprint:
    """The profile's footprint settings, checked: carbon and price may each be absent (n/a), PUE defaults to 1."""

    carbon: Rate | None
    price: Rate | None
    currency: str
    pue: float
    pue_text: str  # the profile's text; empty: not given (1)

    def settings(self) -> dict[str, str]:
        """The job.env variables that carry them to the job (each CSV by its absolute path)."""
        def text(rate: Rate | None, fixed_key: str, csv_key: str) -> dict[str, str]:
            if rate is None:
                return {fixed_key: "", csv_key: ""}
            hourly = rate.hourly is not None
            return {fixed_key: "" if hourly else rate.given, csv_key: rate.given if hourly else ""}
        return {**text(self.carbon, "JB_CARBON_INTENSITY_G_PER_KWH", "JB_CARBON_INTENSITY_CSV"),
                **text(self.price, "JB_PRICE_PER_KWH", "JB_PRICE_CSV"),
                "JB_CURRENCY": self.currency, "JB_PUE": self.pue_text}


def _number(text: str, what: str, kind: str) -> float:
    low, high = LIMITS[kind]
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a number", f"write a number in [{low}, {high}]") from None
    if not math.isfinite(value) or not low <= value <= high:
        sign = " (a negative intensity)" if kind == "carbon" and value < 0 else ""
        raise ConfigError(f"{what}: {text} is out of range{sign}", f"write a number in [{low}, {high}]")
    return value


def _hour(text: str, where: str) -> dt.datetime:
    try:
        stamp = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not an ISO 8601 time",
                          "write the hour as e.g. 2026-11-26T14:00:00+01:00") from None
    if stamp.tzinfo is None:
        raise ConfigError(f"{where}: {text!r} has no UTC offset (local time is ambiguous at clock changes)",
                          "write the hour with its offset, e.g. 2026-11-26T14:00:00+01:00 or ...Z")
    if stamp != stamp.replace(minute=0, second=0, microsecond=0):  # in its own offset: +05:30's hours too
        raise ConfigError(f"{where}: {text} is not the start of an hour", "give one value per whole hour")
    return stamp.astimezone(dt.UTC)


def read_hourly(path: Path, kind: str, key: str) -> Rate:
    """An hourly CSV: `time,value` lines (a first line that is no time is a header; `#` lines are comments), one
    line per hour, in order, without a gap; refuses the first bad line by its number."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a byte order mark is not part of the header
    except OSError as exc:
        raise ConfigError(f"profile key {key} = {path}: cannot read it ({exc.strerror})",
                          "give a readable file on a file system the nodes share") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"profile key {key} = {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                          "save it as UTF-8 (or ASCII), e.g. iconv -f UTF-16 -t UTF-8") from None
    hourly: dict[dt.datetime, float] = {}
    previous: dt.datetime | None = None
    for number, line in enumerate(lines, 1):
        where = f"{path} line {number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if previous is None and not hourly and not cells[0][:1].isdigit():
            continue  # the header
        if len(cells) != 2:
            raise ConfigError(f"{where}: {len(cells)} fields, not 2", "write `time,value` on every line")
        hour = _hour(cells[0], where)
        if previous is not None and hour != previous + HOUR:
            problem = "a gap" if hour > previous + HOUR else "out of order or repeated"
            raise ConfigError(f"{where}: {cells[0]} follows {previous.isoformat()}: {problem} in the hourly values",
                              "give one value for every hour, in order, without gaps")
        hourly[hour] = _number(cells[1], where, kind)
        previous = hour
    if not hourly:
        raise ConfigError(f"profile key {key} = {path} holds no hourly values", "write `time,value` lines")
    return Rate(source=f"csv {path}", given=str(path), hourly=hourly)


def _rate(profile: Mapping[str, str], fixed_key: str, csv_key: str, kind: str) -> Rate | None:
    fixed, csv = profile.get(fixed_key, "").strip(), profile.get(csv_key, "").strip()
    if fixed and csv:
        raise ConfigError(f"profile keys {fixed_key} and {csv_key} are both set", "set one of them")
    if csv:
        return read_hourly(Path(csv).expanduser().resolve(), kind, csv_key)
    if fixed:
        return Rate(source=f"profile {fixed_key} = {fixed}", given=fixed,
                    fixed=_number(fixed, f"profile key {fixed_key}", kind))
    return None


def site_footprint(profile: Mapping[str, str]) -> SiteFootprint:
    """The profile's (or job.env's, lower-case keys) footprint settings, refused with the line or key at fault."""
    carbon = _rate(profile, "carbon_intensity_g_per_kwh", "carbon_intensity_csv", "carbon")
    price = _rate(profile, "price_per_kwh", "price_csv", "price")
    currency = profile.get("currency", "").strip()
    if price is not None and not currency:
        raise ConfigError("a price is set but profile key currency is empty", "set currency, e.g. currency = EUR")
    pue_text = profile.get("pue", "").strip()
    pue = _number(pue_text, "profile key pue", "pue") if pue_text else 1.0
    return SiteFootprint(carbon, price, currency, pue, pue_text)


def from_settings(settings: Mapping[str, str]) -> SiteFootprint:
    """What the job carries (JB_CARBON_INTENSITY_G_PER_KWH ...), read again where the record is finished."""
    return site_footprint({key: settings.get(f"JB_{key.upper()}", "") for key in PROFILE_KEYS})


# ---------------------------------------------------------------------------------------------------
# The record's block


def _utc(text: str | None) -> dt.datetime | None:
    try:
        stamp = dt.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return None if stamp is None else (stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def spans(record: Any) -> tuple[list[tuple[str, dt.datetime, dt.datetime, float, float]], str]:
    """(window, UTC start, UTC end, energy J, bound J) of each metered window, and how they were placed in time."""
    anchor = record.meter.get("clock") if isinstance(record.meter, dict) else None
    out = []
    for window in record.windows:
        energy = window.energy
        if energy is None or energy.energy_j is None:
            continue  # an unmetered window adds nothing it could state; the basis lists the windows counted
        out.append((window.name, window.t_start_ns, window.t_end_ns, energy.energy_j, energy.error_bound_j or 0.0))
    if anchor and {"wall_ns", "monotonic_ns"} <= set(anchor):
        offset = int(anchor["wall_ns"]) - int(anchor["monotonic_ns"])
        def wall(ns: int) -> dt.datetime:
            return dt.datetime.fromtimestamp((ns + offset) / 1e9, dt.UTC)
        return [(n, wall(a), wall(b), e, u) for n, a, b, e, u in out], "windows placed by the record's clock anchor"
    start, end = _utc(record.started_at), _utc(record.finished_at)
    if start is None or end is None:
        return [], "the record has no clock anchor and no start and end time"
    return ([(n, start, end, e, u) for n, _a, _b, e, u in out],
            "no clock anchor in the record: each window spread over the run's start to end")


def _hours(start: dt.datetime, end: dt.datetime, phase: dt.timedelta) -> list[tuple[dt.datetime, float]]:
    """(the rate's hour, share of [start, end] in it); the rate's hours start `phase` past each UTC hour (its CSV's
    own hours, e.g. at :30 in +05:30); a zero-length span lies wholly in its hour."""
    first = (start - phase).replace(minute=0, second=0, microsecond=0) + phase
    length = (end - start).total_seconds()
    if length <= 0:
        return [(first, 1.0)]
    shares, hour = [], first
    while hour < end:
        overlap = (min(end, hour + HOUR) - max(start, hour)).total_seconds()
        shares.append((hour, overlap / length))
        hour += HOUR
    return shares


def unavailable(reason: str) -> dict[str, Any]:
    """A footprint figure that is n/a (null), with the reason."""
    return {"value": None, "bound": None, "unavailable_reason": reason}


def _weighted(rate: Rate | None, pieces: Sequence[tuple[dt.datetime, float, float]], pue: float,
              what: str) -> dict[str, Any]:
    """Sum of facility kWh × the hour's value, and its bound; n/a with the reason for a missing rate or hour."""
    if rate is None:
        return unavailable(f"no {what} in the site profile")
    total = bound = 0.0
    for hour, joules, bound_j in pieces:
        value = rate.at(hour)
        if value is None:
            return unavailable(f"{rate.source} has no value for the hour {hour.isoformat()}")
        total += value * pue * joules / J_PER_KWH
        bound += abs(value) * pue * bound_j / J_PER_KWH
    return {"value": total, "bound": bound}


def footprint_block(record: Any, site: SiteFootprint) -> FootprintBlock:
    """Schema 3's `footprint`: grams CO2e and cost of the run's metered energy and per unit of the steady window's
    work, each with its bound, labelled an estimate with its sources; n/a (null, with the reason) where the profile
    gives no value."""
    placed, placement = spans(record)
    steady_name = record.metrics.get("window", "steady")

    def pieces(rate: Rate | None, windows: str | None) -> list[tuple[dt.datetime, float, float]]:
        """Each window's (or only `windows`') energy and bound spread over the rate's hours."""
        phase = rate.phase if rate is not None else dt.timedelta(0)
        return [(hour, e * share, u * share) for n, a, b, e, u in placed if windows in (None, n)
                for hour, share in _hours(a, b, phase)]

    unit = record.metrics.get("work_unit")
    work = next((w.work.get(unit) for w in record.windows if w.name == steady_name), None) if unit else None
    block: dict[str, object] = {  # the figures' keys are built below: checked_block types the block
        "estimate": "estimate: the site profile's carbon intensity and price, not measured",
        "carbon_source": site.carbon.source if site.carbon else None,
        "price_source": site.price.source if site.price else None,
        "currency": site.currency or None,
        "pue": site.pue,
        "pue_source": f"profile pue = {site.pue_text}" if site.pue_text else "not given: 1 (accelerator energy only)",
        "energy_basis": "accelerator energy of the run's metered windows (" + ", ".join(n for n, *_ in placed)
        + ") times PUE; start-up outside the windows is not metered",
        "placement": placement,
        "run_energy_j": sum(e for *_x, e, _u in placed) if placed else None,
        "run_energy_error_bound_j": sum(u for *_x, u in placed) if placed else None,
        "work_unit": unit, "work": work,
    }
    for key, rate, what in (("g_co2e", site.carbon, "carbon intensity"), ("cost", site.price, "price")):
        run_pieces, steady = pieces(rate, None), pieces(rate, steady_name)
        run = _weighted(rate, run_pieces, site.pue, what) if placed else unavailable(f"no metered energy: {placement}")
        per = (_weighted(rate, steady, site.pue, what) if steady and work
               else unavailable(f"no {steady_name} window with energy and work"))
        block[key] = run["value"]
        block[f"{key}_error_bound"] = run["bound"]
        block[f"{key}_per_unit"] = None if per["value"] is None else per["value"] / work
        block[f"{key}_per_unit_error_bound"] = None if per["bound"] is None else per["bound"] / work
        reasons = [r for r in (run.get("unavailable_reason"), per.get("unavailable_reason")) if r]
        if reasons:
            block[f"{key}_unavailable_reason"] = "; ".join(dict.fromkeys(reasons))
    return checked_block(FootprintBlock, block, "footprint")
