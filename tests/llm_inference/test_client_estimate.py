"""The client-side estimate: a server's work rebuilt from chunk times, against the planted serving run.

The run (tests/serving_run.py) is a continuous-batching schedule with planted per-step costs metered by the real
sampler through the fake pynvml; its own work log is what an instrumented engine records. The client sees only
when each request's tokens arrived.
"""

from __future__ import annotations

import numpy as np
import pytest

from joulebench.request_energy import COLUMNS, fit_request_energy, request_parts
from jpwr import ValidationError
from llm_inference.client_estimate import ClientStream, client_work_log, engine_streams, estimate_error
from tests import serving_run
from tests.serving_run import IDLE_W


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    import pynvml  # the fake (tests/conftest.py puts tests/fakes first)

    log, lifetimes, schedule = serving_run.serve(6, 7.0, 420, 64)
    knots = serving_run.meter(schedule, tmp_path_factory.mktemp("client"), pynvml, 16)
    counts = np.diff(log.member_offsets)
    prefill = np.repeat(log.prefill_tokens > 0, counts)
    inputs = {int(r): int(t) for r, t in zip(log.member_request[prefill], log.member_prefill_tokens[prefill],
                                              strict=True)}
    arrivals = {int(i): int(a) for i, a, _ in lifetimes}
    return log, lifetimes, knots, engine_streams(log, arrivals, inputs)


def test_the_rebuilt_log_keeps_every_token_and_prompt(planted: tuple) -> None:
    log, _, _, streams = planted
    rebuilt = client_work_log(streams)
    assert rebuilt.prefill_tokens.sum() == pytest.approx(log.prefill_tokens.sum())
    # every token after the first is a decoded row (the first comes from the prefill pass)
    assert rebuilt.row_steps.sum() == pytest.approx(log.row_steps.sum())
    assert rebuilt.kv_tokens.sum() == pytest.approx(log.kv_tokens.sum(), rel=0.01)  # the run counts from 0
    assert rebuilt.prefill_steps.sum() == pytest.approx(log.prefill_steps.sum(), rel=0.35)  # passes are guessed
    assert rebuilt.decode_steps.sum() == pytest.approx(log.decode_steps.sum(), rel=0.15)


def test_its_per_request_energy_is_close_to_the_engines_own(planted: tuple) -> None:
    log, lifetimes, knots, streams = planted
    span = (float(log.t0_ns[0]), float(log.t1_ns[-1]))
    engine = request_parts(fit_request_energy(log, knots, IDLE_W, *span), log, lifetimes, *span)
    error = estimate_error(engine, streams, lifetimes, knots, IDLE_W, span)
    assert error["requests"] == len(lifetimes)
    assert abs(error["relative_error_of_sum"]) < 0.005  # both fit the same counter
    assert error["relative_error_p50"] < 0.02
    assert error["relative_error_p90"] < 0.06
    assert abs(error["prefill_relative_error_of_sum"]) < 0.2  # where in the gap a prompt ran is guessed


def test_the_fit_on_the_rebuilt_log_finds_the_planted_work(planted: tuple) -> None:
    log, lifetimes, knots, streams = planted
    span = (float(log.t0_ns[0]), float(log.t1_ns[-1]))
    rebuilt = client_work_log(streams)
    fit = fit_request_energy(rebuilt, knots, IDLE_W, *span, draws=50)
    parts = request_parts(fit, rebuilt, lifetimes, *span)
    planted_work = sum(serving_run.COSTS[c] * log.columns()[:, k].sum() for k, c in enumerate(COLUMNS))
    assert parts.work_j.sum() == pytest.approx(planted_work, rel=0.03)


def test_chunks_of_several_tokens_and_repeated_stamps() -> None:
    """One request, 1 + 3 + 2 tokens in three chunks, the last two read at the same instant: one decode gap."""
    stream = ClientStream(7, 0, 10, np.array([10_000_000, 30_000_000, 30_000_000]), np.array([1.0, 3.0, 2.0]))
    rebuilt = client_work_log([stream])
    assert rebuilt.prefill_tokens.sum() == pytest.approx(10)
    assert rebuilt.row_steps.sum() == pytest.approx(5)
    assert rebuilt.kv_tokens.sum() == pytest.approx(5 * 11 + 10)  # attended: 11, 12, ..., 15
    assert set(rebuilt.member_request) == {7}


def test_a_load_without_output_is_refused() -> None:
    with pytest.raises(ValidationError, match="no request produced output"):
        client_work_log([ClientStream(0, 0, 5, np.zeros(0, np.int64), np.zeros(0))])
