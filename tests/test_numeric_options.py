"""Every numeric option of jpwr, the drivers and the analysis verbs has a stated range (issues 22 and 32).

The parsers are read, not listed: each command's parser is captured where its main builds it, every option
found with a numeric type is fed NaN, infinities, a non-number and values just outside its range, and must
end the command with exit 2 naming the option before anything starts. A new option with a bare `type=int` or
`type=float`, a range without an upper bound, a help that does not state the range, or a range that admits 0
without the help saying what 0 does fails the first test. tests/test_option_bounds.py runs the commands at
the bounds.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator

import pytest

from joulebench.arguments import SEED
from jpwr.arguments import Number


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _capture(build: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser a command's main builds: stopped at its parse_args, so nothing of the command runs."""
    def stop(self: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        raise _Captured(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        patch.setattr(argparse.ArgumentParser, "parse_known_args", stop)
        try:
            result = build()
        except _Captured as captured:
            return captured.parser
    assert isinstance(result, argparse.ArgumentParser), f"{build} neither built nor parsed a parser"
    return result


def _commands() -> dict[str, Callable[[], object]]:
    from joulebench.analysis import attribute, demo, pareto, plan, plot, recommend
    from jpwr import cli, qualify, selftest
    from llm_inference.cli import build_parser as inference_parser
    from llm_training.cli import build_parser as training_parser
    from resnet50.cli import build_parser as resnet_parser

    return {
        "jpwr --": lambda: cli.cmd_wrap([]), "jpwr serve": lambda: cli.cmd_serve([]),
        "jpwr combine": lambda: cli.cmd_combine([]), "jpwr info": lambda: cli.cmd_info([]),
        "jpwr qualify": qualify.build_parser, "jpwr selftest": lambda: selftest.main([]),
        "python -m llm_training": training_parser, "python -m resnet50": resnet_parser,
        "python -m llm_inference": inference_parser, "joulebench attribute": attribute.build_parser,
        "joulebench report --pareto": lambda: pareto.main(["--pareto"]), "joulebench plan": lambda: plan.main([]),
        "joulebench plot": lambda: plot.main([]), "joulebench demo": lambda: demo.main([]),
        "joulebench recommend": lambda: recommend.main([]),
    }


def _options(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                               argparse.Action]]:
    """(sub-command path, action) for every option of the parser and of its sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*prefix, name))
        elif action.option_strings:
            yield prefix, action


def _numeric(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...], argparse.Action]]:
    found = []
    for command, build in _commands().items():
        for path, action in _options(_capture(build, monkeypatch)):
            if action.type in (int, float) or isinstance(action.type, Number):
                found.append((command, path, action))
    return found


def _outside(number: Number) -> list[str]:
    """Values just outside the stated range (the open end itself where it is open)."""
    step = 1 if number.kind is int else 1e-9
    values = [number.low if number.low_open else number.low - max(step, abs(number.low) * 1e-9),
              number.high if number.high_open else number.high + max(step, abs(number.high) * 1e-9)]
    return [str(number.kind(v)) if number.kind is int else repr(float(v)) for v in values]


def _name(command: str, path: tuple[str, ...], action: argparse.Action) -> str:
    return f"{command} {' '.join(path)} {action.option_strings[-1]}".replace("  ", " ")


ZERO_SAID = re.compile(r"\b0 = \S")  # "(0 = off)", "default 0 = none"


def test_every_numeric_option_states_its_range(monkeypatch: pytest.MonkeyPatch) -> None:
    numeric = _numeric(monkeypatch)
    bare = [_name(*found) for found in numeric if not isinstance(found[2].type, Number)]
    assert not bare, f"numeric options without a range (use a jpwr.Number type (joulebench.arguments)): {bare}"
    unbounded = [_name(*found) for found in numeric
                 if not (math.isfinite(found[2].type.low) and math.isfinite(found[2].type.high))]
    assert not unbounded, f"numeric options without a finite lower and upper bound: {unbounded}"
    unstated = [_name(*found) for found in numeric if found[2].type.describe() not in (found[2].help or "")]
    assert not unstated, f"numeric options whose help does not state the range (jpwr.state_ranges): {unstated}"
    # zero is refused by the range, or the help says what it does (a seed's 0 is a seed like any other)
    silent = [_name(*found) for found in numeric if found[2].type.admits(0) and found[2].type is not SEED
              and not ZERO_SAID.search(found[2].help.replace(found[2].type.describe(), ""))]
    assert not silent, f"options that admit 0 without saying what 0 does (write '0 = ...' in the help): {silent}"
    assert len(numeric) >= 80  # the commands above: a parser that was not found would shrink this


@pytest.mark.parametrize("value_kind", ["nan", "inf", "-inf", "not-a-number", "outside"])
def test_bad_values_end_the_command_with_the_option_named(value_kind: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    numeric = _numeric(monkeypatch)
    parsers = {command: _capture(build, monkeypatch) for command, build in _commands().items()}
    checked = 0
    for command, path, action in numeric:
        number = action.type
        assert isinstance(number, Number)
        values = _outside(number) if value_kind == "outside" else [value_kind]
        for value in values:
            option = action.option_strings[-1]
            with pytest.raises(SystemExit) as ended:
                parsers[command].parse_args([*path, f"{option}={value}"])
            err = capsys.readouterr().err
            assert ended.value.code == 2, f"{command} {option}={value}"
            assert option in err and "expected" in err, f"{command} {option}={value}: {err}"
            checked += 1
    assert checked >= len(numeric)


def test_edges_inside_the_range_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    for command, _path, action in _numeric(monkeypatch):
        number = action.type
        for edge, open_end in ((number.low, number.low_open), (number.high, number.high_open)):
            if not open_end:
                assert number(str(number.kind(edge))) == edge, f"{command} {action.option_strings[-1]} {edge}"


def test_zero_warmup_and_zero_dropout_still_validate(capsys: pytest.CaptureFixture[str]) -> None:
    from llm_training.cli import main as training
    from resnet50.cli import main as resnet

    assert training(["validate", "--model", "tiny", "--device", "cpu", "--iterations", "4", "--warmup-iterations", "0",
                     "--hidden-dropout", "0", "--attention-dropout", "0"]) == 0
    assert resnet(["validate", "--framework", "pytorch", "--device", "cpu", "--iterations", "4",
                   "--warmup-iterations", "0"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(("argv", "named"), [
    (["--lr", "1e-4", "--min-lr", "1e-3"], "--min-lr"),
    (["--clip-grad", "-1"], "--clip-grad"),
    (["--adam-beta2", "1"], "--adam-beta2"),
    (["--adam-eps", "0"], "--adam-eps"),
    (["--hidden-dropout", "1"], "--hidden-dropout"),
])
def test_training_values_that_cannot_train_are_refused(argv: list[str], named: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from llm_training.cli import main as training

    try:
        code = training(["validate", "--model", "tiny", "--device", "cpu", *argv])
    except SystemExit as ended:
        code = ended.code
    assert code in (2, 64) and named in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "soon"])
@pytest.mark.parametrize("driver", ["llm_training", "resnet50", "llm_inference"])
def test_steady_seconds_is_positive_finite_or_auto(driver: str, value: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    parser = _capture(_commands()[f"python -m {driver}"], monkeypatch)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["validate", f"--steady-seconds={value}"])
    assert ended.value.code == 2 and "--steady-seconds" in capsys.readouterr().err
    required = ["--framework", "pytorch"] if driver == "resnet50" else []
    assert parser.parse_args(["validate", *required, "--steady-seconds=auto"]).steady_seconds is None


@pytest.mark.parametrize("value", ["1,8,8", "0,4", "", "1,x", "1,,4", "4,", " ,"])
def test_inference_batch_sweep_refuses_repeats_and_non_counts(value: str, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = _capture(_commands()["python -m llm_inference"], monkeypatch)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["validate", f"--batch-sizes={value}"])
    assert ended.value.code == 2 and "--batch-sizes" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "option", "value"), [
    ("validate", "--batch-sizes", "1,,4"), ("validate", "--task", "chat,,code"), ("validate", "--task", "chat,"),
    ("validate-load", "--rates", "1,,4"), ("validate-load", "--rates", "max,"),
])
def test_a_list_with_an_empty_item_is_refused_not_shortened(command: str, option: str, value: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`1,,4` was read as 1,4 (batch sizes, tasks) or ended in a bare "'' is not a rate": a typo is named."""
    parser = _capture(_commands()["python -m llm_inference"], monkeypatch)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args([command, f"{option}={value}"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and option in err and "has an empty" in err, err


@pytest.mark.parametrize("driver", ["llm_training", "resnet50", "llm_inference"])
def test_unknown_energy_methods_end_at_the_parser(driver: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    parser = _capture(_commands()[f"python -m {driver}"], monkeypatch)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["validate", "--energy-methods", "nvml,joulemeter"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "--energy-methods" in err and "joulemeter" in err


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_help_text_renders_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse %-formats help: a bare '%' before a letter printed the option's internals (0.5{'option_strings'...)."""
    for command, build in _commands().items():
        for parser in _parsers(_capture(build, monkeypatch)):
            text = parser.format_help()
            assert "'option_strings'" not in text and "%(" not in text, (command, parser.prog, text)
