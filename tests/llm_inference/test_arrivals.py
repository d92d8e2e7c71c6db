"""Arrival processes, drawn requests, replayed traces and the refusals of bad rates and traces (issue 30 items 2, 8)."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from jpwr import ValidationError
from llm_inference.arrivals import (
    Request,
    arrival_times,
    check_context,
    draw_requests,
    load_trace,
    parse_rate,
    parse_rates,
)
from llm_inference.tasks import TASKS

ALPHA = 0.001


def ks_exponential(gaps: np.ndarray, rate: float) -> tuple[float, float]:
    """Kolmogorov-Smirnov statistic of the gaps against Exp(rate), and its asymptotic critical value at ALPHA."""
    n = len(gaps)
    cdf = 1.0 - np.exp(-rate * np.sort(gaps))
    ranks = np.arange(1, n + 1) / n
    statistic = max(float(np.max(ranks - cdf)), float(np.max(cdf - (ranks - 1.0 / n))))
    return statistic, math.sqrt(-math.log(ALPHA / 2) / 2) / math.sqrt(n)


def test_poisson_gaps_pass_a_ks_test_and_a_planted_wrong_rate_fails():
    rate = 3.0
    times = arrival_times("poisson", rate, 10_000, seed=2024)
    gaps = np.diff(times, prepend=0.0)
    assert len(times) == 10_000 and np.all(gaps > 0)
    statistic, critical = ks_exponential(gaps, rate)
    assert statistic < critical, f"D={statistic:.4f} >= {critical:.4f}"
    # The test can fail: the same gaps against a rate 10 % off, or constant gaps at the right rate, are rejected.
    assert ks_exponential(gaps, rate * 1.1)[0] > critical
    assert ks_exponential(np.diff(arrival_times("constant", rate, 10_000, 0), prepend=-1 / rate), rate)[0] > critical


def test_poisson_arrivals_are_reproducible_from_the_seed():
    first = arrival_times("poisson", 5.0, 100, seed=1)
    assert np.array_equal(first, arrival_times("poisson", 5.0, 100, seed=1))
    assert not np.array_equal(first, arrival_times("poisson", 5.0, 100, seed=2))


def test_constant_arrivals_start_at_zero_one_gap_apart():
    assert np.allclose(arrival_times("constant", 4.0, 5, seed=0), [0.0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("process", ["poisson", "constant"])
def test_rate_max_queues_every_request_at_the_start(process):
    times = arrival_times(process, math.inf, 7, seed=3)
    assert times.shape == (7,) and not times.any()


def test_an_unknown_process_is_refused():
    with pytest.raises(ValueError, match="'gamma'"):
        arrival_times("gamma", 1.0, 3, 0)


def test_drawn_requests_have_their_own_lengths_and_flag_the_warmup_first():
    chat = TASKS["chat"]
    arrivals = arrival_times("poisson", 2.0, 50, seed=5)
    requests = draw_requests(chat, arrivals, seed=9, warmup=4)
    assert [r.id for r in requests] == list(range(50))
    assert [r.warmup for r in requests] == [True] * 4 + [False] * 46
    assert [r.arrival_s for r in requests] == arrivals.tolist()
    outputs = {r.output_tokens for r in requests}
    assert len(outputs) > 10  # each request its own output length, not one per load
    assert all(chat.output_length.low <= r.output_tokens <= chat.output_length.high for r in requests)
    assert all(chat.input_length.low <= r.input_tokens <= chat.input_length.high for r in requests)
    assert all(r.prompt_ids is None for r in requests)
    assert draw_requests(chat, arrivals, seed=9, warmup=4) == requests


def test_a_forced_output_length_applies_to_every_request():
    requests = draw_requests(TASKS["chat"], np.zeros(6), seed=1, output_length=17)
    assert {r.output_tokens for r in requests} == {17}
    assert not any(r.warmup for r in requests)


def test_more_warmup_requests_than_arrivals_are_refused():
    with pytest.raises(ValueError, match="warmup 4"):
        draw_requests(TASKS["tiny"], np.zeros(3), seed=0, warmup=4)


def test_parse_rate_accepts_numbers_and_max():
    assert parse_rate("2.5") == 2.5
    assert parse_rate("max") == math.inf and parse_rate(" MAX ") == math.inf


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf", "fast", "", "1e999", "2e6"])
def test_parse_rate_refuses_values_that_are_not_a_positive_rate(text):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_rate(text)
    message = str(refused.value)
    assert text in message and "positive number of requests/s, or max" in message and "expected" in message


def test_a_bad_rate_ends_the_command_with_the_option_named(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=parse_rate)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["--rate", "0"])
    assert ended.value.code == 2
    assert "--rate" in capsys.readouterr().err


def test_parse_rates_keeps_the_given_order():
    assert parse_rates("1,2,4,max") == (1.0, 2.0, 4.0, math.inf)
    assert parse_rates("8,0.5") == (8.0, 0.5)


@pytest.mark.parametrize(("text", "named"), [("1,2,1", "repeats 1"), ("max,2,MAX", "repeats max"),
                                             ("1,,2", "has an empty rate"), ("1,-2", "-2"), ("1,inf", "inf")])
def test_parse_rates_refuses_repeats_and_bad_rates(text, named):
    with pytest.raises(argparse.ArgumentTypeError, match=named):
        parse_rates(text)


def write_trace(tmp_path, lines: list[str] | bytes):
    path = tmp_path / "trace.jsonl"
    if isinstance(lines, bytes):
        path.write_bytes(lines)
    else:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_trace_is_replayed_in_file_order(tmp_path):
    path = write_trace(tmp_path, [
        json.dumps({"arrival_s": 0, "input_tokens": 12, "output_tokens": 3}),
        "",
        json.dumps({"arrival_s": 0.5, "prompt_ids": [5, 0, 7], "output_tokens": 1}),
        json.dumps({"arrival_s": 0.5, "prompt": "hello world again", "output_tokens": 8}),
    ])
    requests = load_trace(path, tokenize=lambda text: [len(word) for word in text.split()])
    assert requests == [Request(0, 0.0, 12, 3), Request(1, 0.5, 3, 1, (5, 0, 7)), Request(2, 0.5, 3, 8, (5, 5, 5))]


def refused(tmp_path, lines, tokenize=None) -> str:
    with pytest.raises(ValidationError) as error:
        load_trace(write_trace(tmp_path, lines), tokenize)
    message = str(error.value)
    assert "--trace" in message and "trace.jsonl" in message and ". Fix: " in message
    return message


GOOD = json.dumps({"arrival_s": 1.0, "input_tokens": 4, "output_tokens": 2})


@pytest.mark.parametrize(("bad", "named"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"arrival_s": 2, "input_tokens": 4}', "missing field(s) 'output_tokens'"),
    ('{"output_tokens": 2, "input_tokens": 4}', "missing field(s) 'arrival_s'"),
    ('{"arrival_s": 2, "input_tokens": 4, "output_tokens": 2, "user": "x"}', "unknown field(s) 'user'"),
    ('{"arrival_s": 2, "input_tokens": 4, "prompt_ids": [1], "output_tokens": 2}', "exactly one is needed"),
    ('{"arrival_s": 2, "output_tokens": 2}', "has none of"),
    ('{"arrival_s": "2", "input_tokens": 4, "output_tokens": 2}', "arrival_s is '2', not a number"),
    ('{"arrival_s": true, "input_tokens": 4, "output_tokens": 2}', "arrival_s is True, not a number"),
    ('{"arrival_s": -0.5, "input_tokens": 4, "output_tokens": 2}', "arrival_s is -0.5"),
    ('{"arrival_s": NaN, "input_tokens": 4, "output_tokens": 2}', "arrival_s is nan"),
    ('{"arrival_s": Infinity, "input_tokens": 4, "output_tokens": 2}', "arrival_s is inf"),
    ('{"arrival_s": 1e999, "input_tokens": 4, "output_tokens": 2}', "arrival_s is inf"),
    ('{"arrival_s": 2, "input_tokens": 4, "output_tokens": 2.0}', "output_tokens is 2.0"),
    ('{"arrival_s": 2, "input_tokens": 4, "output_tokens": 0}', "output_tokens is 0"),
    ('{"arrival_s": 2, "input_tokens": 0, "output_tokens": 2}', "input_tokens is 0"),
    ('{"arrival_s": 2, "input_tokens": false, "output_tokens": 2}', "input_tokens is False"),
    ('{"arrival_s": 2, "prompt_ids": "1 2", "output_tokens": 2}', "not a list of token ids"),
    ('{"arrival_s": 2, "prompt_ids": [1, -3], "output_tokens": 2}', "a prompt token id is -3"),
    ('{"arrival_s": 2, "prompt_ids": [1, 2.5], "output_tokens": 2}', "a prompt token id is 2.5"),
    ('{"arrival_s": 2, "prompt_ids": [], "output_tokens": 2}', "the prompt has no tokens"),
])
def test_a_bad_trace_line_is_refused_with_its_line_named(tmp_path, bad, named):
    message = refused(tmp_path, [GOOD, bad])
    assert "line 2: " in message and named in message


def test_a_text_prompt_without_a_tokenizer_asks_for_a_checkpoint(tmp_path):
    message = refused(tmp_path, [GOOD, GOOD, json.dumps({"arrival_s": 3, "prompt": "hi", "output_tokens": 2})])
    assert "line 3: " in message and "--checkpoint with a tokenizer" in message and "input_tokens" in message


def test_a_text_prompt_must_be_text(tmp_path):
    message = refused(tmp_path, ['{"arrival_s": 3, "prompt": 42, "output_tokens": 2}'], tokenize=lambda text: [1])
    assert "line 1: prompt is 42, not text" in message


def test_decreasing_arrivals_name_both_lines(tmp_path):
    late, early = (json.dumps({"arrival_s": t, "input_tokens": 4, "output_tokens": 2}) for t in (2.5, 1.5))
    message = refused(tmp_path, [GOOD, late, "", early])
    assert "from 2.5 (line 2) to 1.5 (line 4)" in message and "sort the trace" in message


def test_a_non_utf8_line_is_named(tmp_path):
    message = refused(tmp_path, (GOOD + "\n" + GOOD + "\n").encode() + b'{"prompt": "caf\xe9"}\n')
    assert "line 3 is not UTF-8" in message and "save the trace as UTF-8" in message


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_an_empty_trace_is_refused(tmp_path, content):
    assert "holds no requests" in refused(tmp_path, content)


def test_a_missing_trace_is_refused(tmp_path):
    with pytest.raises(ValidationError, match=r"--trace .*absent\.jsonl does not exist.*Fix: give the path"):
        load_trace(tmp_path / "absent.jsonl")


def test_a_request_longer_than_the_context_is_named():
    requests = [Request(0, 0.0, 100, 28), Request(1, 0.0, 100, 29), Request(2, 0.0, 200, 200)]
    check_context(requests[:1], 128, "tiny")  # exactly the context fits
    with pytest.raises(ValidationError) as error:
        check_context(requests, 128, "tiny")
    message = str(error.value)
    assert "request 1 needs 129 positions (input 100 + output 29) but tiny has 128" in message
    assert "Fix: " in message and "more positions" in message


def test_validate_load_refuses_a_trace_token_id_beyond_the_vocabulary_naming_file_line_and_size(tmp_path, capsys):
    """Issue 61: `validate-load` said OK to prompt ids the model does not have; the load then ended FAILED with an
    IndexError in the embedding. The line and the vocabulary's size are named; the largest id the model has passes."""
    from llm_inference.cli import main
    from llm_inference.presets import PRESETS

    vocab = PRESETS["tiny"].vocab_size
    inside = json.dumps({"arrival_s": 2, "prompt_ids": [1, vocab - 1], "output_tokens": 2})
    beyond = json.dumps({"arrival_s": 3, "prompt_ids": [vocab, 2, vocab + 7], "output_tokens": 2})
    path = write_trace(tmp_path, [GOOD, inside, beyond])
    argv = ["validate-load", "--preset", "tiny", "--device", "cpu", "--max-concurrency", "2", "--trace", str(path)]
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert (f"--trace {path} line 3: prompt token id {vocab} is beyond the model's vocabulary of {vocab} (ids 0 to "
            f"{vocab - 1}; 2 such id(s) on this line)") in err and "Traceback" not in err
    path.write_text("\n".join([GOOD, inside]))
    assert main(argv) == 0, capsys.readouterr().err
