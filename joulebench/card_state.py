"""The card's own state while work ran: its SM clock and whether the power cap held it down, per counter segment.

The sampler records with its NVML readings (about every 50 ms) the SM clock and the clock event reason mask (jpwr's
NVML backend). A counter segment (about 100 ms, the unit the per-request fit works in) gets the median clock of the
readings inside it and the share of them with the SW power cap reason set (readings come evenly, so it is the share
of the segment's time); each engine step gets the state of the segment it ran in (by its middle). A window's state
is that of the steps inside it, weighted by their time in it: the state the work ran in, not the idle gaps'.

Measured facts only: nothing here sets a clock, a power limit or any other setting. Only NVML reports the power-cap
reason; elsewhere the capped share is None ("n/a"), never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from joulebench.record_types import CardComparison, CardConditions, CardStateCheck
from joulebench.segment_fit import Segments
from jpwr.device_state import reason_names
from jpwr.trace import Domain, TraceData

CLOCK = "sm_clock_hz"
REASONS = "throttle_reasons"  # NVML's clock event reasons (formerly throttle reasons), as a float of the bit mask
POWER_CAP = "sw_power_cap"  # the reason under which the card holds its power limit by lowering its clocks


@dataclasses.dataclass(frozen=True)
class CardState:
    """One device's readings: SM clock (Hz) and whether the power cap held the clocks (None: not reported)."""

    clock_t_ns: np.ndarray
    clock_hz: np.ndarray
    capped_t_ns: np.ndarray | None
    capped: np.ndarray | None  # 1.0 where the power-cap reason was set

    @classmethod
    def of_trace(cls, trace: TraceData, domain: Domain) -> CardState | None:
        """The device's SM clock and power-cap readings in the trace (None: it recorded no SM clock)."""
        clock = sorted((m.t_ns, m.value) for m in trace.metrics
                       if m.domain_id == domain.id and m.name == CLOCK and np.isfinite(m.value) and m.value > 0)
        if not clock:
            return None
        reasons = sorted((m.t_ns, m.value) for m in trace.metrics
                         if m.domain_id == domain.id and m.name == REASONS and np.isfinite(m.value))
        clock_t, clock_hz = (np.array(c, dtype=float) for c in zip(*clock, strict=True))
        if domain.backend != "nvml" or not reasons:
            return cls(clock_t, clock_hz, None, None)
        capped = np.array([float(POWER_CAP in reason_names(int(v))) for _, v in reasons])
        return cls(clock_t, clock_hz, np.array([t for t, _ in reasons], dtype=float), capped)

    def per_segment(self, segments: Segments) -> tuple[np.ndarray, np.ndarray | None]:
        """Each segment's median SM clock and capped share (of its readings; the nearest reading where none)."""
        clock = _per_interval(self.clock_t_ns, self.clock_hz, segments.t0_ns, segments.t1_ns, np.median)
        if self.capped_t_ns is None or self.capped is None:
            return clock, None
        return clock, _per_interval(self.capped_t_ns, self.capped, segments.t0_ns, segments.t1_ns, np.mean)

    def at_steps(self, segments: Segments, t0_ns: np.ndarray, t1_ns: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray | None]:
        """Each step's state: that of the counter segment holding its middle (its own nearest readings where no
        segment does: outside the counter's span)."""
        middle = (np.asarray(t0_ns, float) + np.asarray(t1_ns, float)) / 2
        own_clock = _per_interval(self.clock_t_ns, self.clock_hz, middle, middle, np.median)
        own_capped = None if self.capped_t_ns is None or self.capped is None else \
            _per_interval(self.capped_t_ns, self.capped, middle, middle, np.mean)
        if not len(segments):
            return own_clock, own_capped
        order = np.argsort(segments.t0_ns, kind="stable")
        k = order[np.clip(np.searchsorted(segments.t0_ns[order], middle, side="right") - 1, 0, len(order) - 1)]
        inside = (middle >= segments.t0_ns[k]) & (middle <= segments.t1_ns[k])
        clock, capped = self.per_segment(segments)
        return (np.where(inside, clock[k], own_clock),
                None if capped is None or own_capped is None else np.where(inside, capped[k], own_capped))


def _per_interval(t_ns: np.ndarray, values: np.ndarray, t0_ns: np.ndarray, t1_ns: np.ndarray,
                  reduce: Callable[[np.ndarray], Any]) -> np.ndarray:
    """reduce(values of the readings inside each [t0, t1]); the reading nearest to its middle where none is."""
    lo, hi = np.searchsorted(t_ns, t0_ns, side="left"), np.searchsorted(t_ns, t1_ns, side="right")
    middle = (np.asarray(t0_ns, float) + np.asarray(t1_ns, float)) / 2
    after = np.clip(np.searchsorted(t_ns, middle), 0, len(t_ns) - 1)
    before = np.clip(after - 1, 0, len(t_ns) - 1)
    nearest = np.where(np.abs(t_ns[before] - middle) <= np.abs(t_ns[after] - middle), before, after)
    return np.array([float(reduce(values[a:b])) if b > a else float(values[n])
                     for a, b, n in zip(lo, hi, nearest, strict=True)])


@dataclasses.dataclass(frozen=True)
class Conditions:
    """What the work of some windows ran under and how large its steps were: the state and the sizes a fit's
    coefficients hold for, and those a prediction asks them for."""

    sm_clock_mhz: float | None  # median SM clock of the steps, weighted by their time
    capped_share: float | None  # share of the steps' time with the power-cap reason set
    prefill_step_tokens: float | None  # tokens per prefill step, token-weighted (the step the mean token ran in)
    decode_step_rows: float | None  # rows per decode step, row-weighted
    decode_row_positions: float | None  # attended KV positions per decoded row (what a decode row reads)
    # rows per decode step at its 5th and 95th percentile, step-weighted: the mean hides a drain's few-row steps,
    # whose fixed cost per step a fit on full steps alone cannot tell from its cost per row
    decode_rows_p5: float | None = None
    decode_rows_p95: float | None = None

    @classmethod
    def of_steps(cls, seconds: np.ndarray, clock_hz: np.ndarray | None, capped: np.ndarray | None,
                 prefill_tokens: np.ndarray, prefill_steps: np.ndarray, row_steps: np.ndarray,
                 decode_steps: np.ndarray, kv_tokens: np.ndarray) -> Conditions:
        """From the steps (or their in-window shares: amounts and seconds scaled alike) of the windows."""
        weight = np.asarray(seconds, float)
        clock = None if clock_hz is None or not weight.sum() else _weighted_median(clock_hz, weight) / 1e6
        share = None if capped is None or not weight.sum() else float(np.average(capped, weights=weight))
        rows = float(np.sum(row_steps))
        all_steps = np.asarray(decode_steps, float)
        decoding = all_steps > 0
        steps = all_steps[decoding]
        per_step = np.asarray(row_steps, float)[decoding] / steps
        p5, p95 = ((None, None) if not len(steps) else
                   (_weighted_quantile(per_step, steps, 0.05), _weighted_quantile(per_step, steps, 0.95)))
        return cls(clock, share, _per_step(prefill_tokens, prefill_steps), _per_step(row_steps, decode_steps),
                   float(np.sum(kv_tokens)) / rows if rows > 0 else None, p5, p95)

    def to_dict(self) -> CardConditions:
        return {"sm_clock_mhz": self.sm_clock_mhz, "capped_share": self.capped_share,
                "prefill_step_tokens": self.prefill_step_tokens, "decode_step_rows": self.decode_step_rows,
                "decode_row_positions": self.decode_row_positions, "decode_rows_p5": self.decode_rows_p5,
                "decode_rows_p95": self.decode_rows_p95}


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    return _weighted_quantile(values, weights, 0.5)


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value below which a share q of the weight lies (the lower one at a tie)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] * q)])


def _per_step(amount: np.ndarray, steps: np.ndarray) -> float | None:
    """Amount per step, weighted by the amount: sum(a_i² / s_i) / sum(a_i) over the steps with some."""
    some = (steps > 0) & (amount > 0)
    total = float(amount[some].sum())
    return float(np.sum(amount[some] ** 2 / steps[some]) / total) if total > 0 else None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A check's two sides: the conditions of the data fitted and of the window predicted."""

    fitted: Conditions
    predicted: Conditions

    @property
    def prefill_step_factor(self) -> float | None:
        return _ratio(self.predicted.prefill_step_tokens, self.fitted.prefill_step_tokens)

    @property
    def decode_rows_factor(self) -> float | None:
        return _ratio(self.predicted.decode_step_rows, self.fitted.decode_step_rows)

    @property
    def decode_positions_factor(self) -> float | None:
        """The decode's extrapolation in attended length: a decode row's KV positions, predicted over fitted."""
        return _ratio(self.predicted.decode_row_positions, self.fitted.decode_row_positions)

    def to_dict(self) -> CardComparison:
        return {"fitted": self.fitted.to_dict(), "predicted": self.predicted.to_dict(),
                "prefill_step_factor": self.prefill_step_factor, "decode_rows_factor": self.decode_rows_factor,
                "decode_positions_factor": self.decode_positions_factor}

    def cause(self) -> str:
        """A failing check's measured cause in one line: the card-state difference and the step-size
        extrapolation between the fitted and the predicted data (facts measured, not a proof of the cause)."""
        return (f"card state fitted {_state(self.fitted)}, predicted {_state(self.predicted)}; step size predicted/"
                f"fitted: prefill {_times(self.prefill_step_factor)} ({_amount(self.predicted.prefill_step_tokens)} "
                f"vs {_amount(self.fitted.prefill_step_tokens)} tokens), decode {_times(self.decode_rows_factor)} "
                f"({_amount(self.predicted.decode_step_rows)} vs {_amount(self.fitted.decode_step_rows)} rows) "
                f"attending {_times(self.decode_positions_factor)} ({_amount(self.predicted.decode_row_positions)} "
                f"vs {_amount(self.fitted.decode_row_positions)} KV positions a row), decode rows p5-p95 "
                f"{_range(self.predicted)} vs {_range(self.fitted)}")


def check_fields(comparison: Comparison | None, passes: bool) -> CardStateCheck:
    """A check's record fields: its conditions, and where it failed their measured cause."""
    if comparison is None:
        return {}
    fields: CardStateCheck = {"conditions": comparison.to_dict()}
    if not passes:
        fields["measured_cause"] = comparison.cause()
    return fields


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _state(c: Conditions) -> str:
    clock = "n/a" if c.sm_clock_mhz is None else f"{c.sm_clock_mhz:.0f} MHz"
    capped = "capped share n/a" if c.capped_share is None else f"{c.capped_share:.0%} capped"
    return f"{clock}, {capped}"


def _times(factor: float | None) -> str:
    return "n/a" if factor is None else f"{factor:.2g}x"


def _amount(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _range(c: Conditions) -> str:
    return f"{_amount(c.decode_rows_p5)}-{_amount(c.decode_rows_p95)}"

