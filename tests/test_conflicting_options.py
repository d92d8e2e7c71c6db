"""Options that mean the same, given together, are refused by one rule in every driver (joulebench.arguments.
SameMeaning; issue 47 item 6): exit 2 naming both and which to keep, in either order and whatever the values,
where argparse alone would have kept one of them silently. Each option alone still works."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from joulebench.arguments import SameMeaning
from llm_inference.cli import main as inference

TINY = ["--preset", "tiny", "--task", "tiny", "--device", "cpu"]
# (command line, the two options named, the one to keep named)
CONFLICTS = [
    (["validate", *TINY, "--batch-size", "2", "--batch-sizes", "1,8"], "--batch-size", "--batch-sizes"),
    (["run", *TINY, "--batch-sizes", "1,8", "--batch-size", "2"], "--batch-sizes", "--batch-size"),
    (["validate-load", *TINY, "--rate", "2", "--rates", "1,4"], "--rate", "--rates"),
    (["load", *TINY, "--rates", "1,4", "--rate", "max"], "--rates", "--rate"),
    (["run", *TINY, "--steady-seconds", "3", "--min-window-s", "2"], "--steady-seconds", "--min-window-s"),
    (["load", *TINY, "--min-window-s", "2", "--steady-seconds", "2"], "--min-window-s", "--steady-seconds"),
]


@pytest.mark.parametrize(("argv", "first", "second"), CONFLICTS,
                         ids=[" ".join(c[0][:1] + c[0][-4:]) for c in CONFLICTS])
def test_two_options_that_mean_the_same_are_refused_naming_both(argv, first, second, capsys, tmp_path):
    with pytest.raises(SystemExit) as ended:
        inference([*argv, "--out-dir", str(tmp_path / "never")])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert f"error: {first} and {second} both given: they set the same thing, and only one would count; keep" in error
    assert not (tmp_path / "never").exists()  # refused before any work


@pytest.mark.parametrize("argv", [
    ["validate", *TINY, "--batch-size", "2"], ["validate", *TINY, "--batch-sizes", "1,2"],
    ["validate-load", *TINY, "--rate", "2"], ["validate-load", *TINY, "--rates", "1,2"],
    ["validate", *TINY, "--steady-seconds", "2"], ["validate", *TINY, "--min-window-s", "2"],
])
def test_each_option_alone_is_taken(argv, capsys):
    assert inference(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("OK ")


def _driver_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="driver")
    parser.add_argument("--point", type=int, action=SameMeaning, same_as=("--points",), keep="--points for a sweep")
    parser.add_argument("--points", action=SameMeaning, same_as=("--point",), keep="--points for a sweep")
    parser.add_argument("--window", "--old-window", action=SameMeaning, keep="--window alone")
    return parser


def test_one_option_given_twice_and_an_alias_alone_are_argparse_s_as_before():
    parser = _driver_parser()
    assert parser.parse_args(["--point", "1", "--point", "2"]).point == 2
    assert parser.parse_args(["--old-window", "3"]).window == "3"


@pytest.mark.parametrize(("argv", "words"), [
    (["--points", "1,2", "--point", "1"], "--points and --point both given"),
    (["--point", "1", "--points", "1"], "--point and --points both given"),  # the same value: still both given
    (["--window", "3", "--old-window", "3"], "--window and --old-window both given"),
])
def test_the_parser_error_names_both_and_what_to_keep(argv, words, capsys):
    with pytest.raises(SystemExit) as ended:
        _driver_parser().parse_args(argv)
    assert ended.value.code == 2
    keep = "--window alone" if "window" in words else "--points for a sweep"
    assert capsys.readouterr().err.endswith(
        f"driver: error: {words}: they set the same thing, and only one would count; keep {keep}\n")


# ---- issue 61: one option (or one key) given twice with different values, one rule for every command --------------
REPO = Path(__file__).resolve().parents[1]
FRONT = REPO / "benchmarks/results/2026-11-28-wave4-s3/pool/rec-llama8b-bs1/llama8b-bs1/front"
TWICE = {  # name -> (command, arguments, exit code, words of the error)
    "objective": ("llm_inference", ["validate", *TINY, "--objective", "speed", "--objective", "energy"], 2,
                  "--objective speed and --objective energy both given: only the last would count; give --objective "
                  "once"),
    "steady seconds": ("llm_inference", ["validate", *TINY, "--steady-seconds", "2", "--steady-seconds", "3"], 2,
                       "--steady-seconds 2.0 and --steady-seconds 3.0 both given"),
    "a flag and its no-": ("llm_inference", ["validate", *TINY, "--idle-baseline", "--no-idle-baseline"], 2,
                           "--idle-baseline (on) and --no-idle-baseline (off) both given: only the last would count; "
                           "give one of --idle-baseline and --no-idle-baseline"),
    "micro-batch size": ("llm_training", ["validate", "--model", "tiny", "--micro-batch-size", "2",
                                          "--micro-batch-size", "4"], 2,
                         "--micro-batch-size 2 and --micro-batch-size 4 both given"),
    "methods": ("jpwr", ["--methods", "nvml", "--methods", "rapl", "--", "true"], 2,
                "--methods nvml and --methods rapl both given"),
    "a --default key": ("joulebench", ["recommend", str(FRONT), "--max-slowdown", "15%", "--default",
                                       "decode_tuning=auto", "--default", "decode_tuning=default"], 64,
                        "--default decode_tuning=auto and --default decode_tuning=default both given: only the last "
                        "would count. Fix: give decode_tuning once"),
    "a trace's own requests": ("llm_inference", ["validate-load", *TINY, "--trace", "t.jsonl", "--requests", "4"], 2,
                               "--requests and --trace both given: --requests has no meaning beside --trace and would "
                               "be ignored; leave --requests out"),
}


def _main(command: str):
    from joulebench.analysis.cli import main as joulebench
    from jpwr.cli import main as jpwr
    from llm_training.cli import main as training

    return {"llm_inference": inference, "llm_training": training, "jpwr": jpwr, "joulebench": joulebench}[command]


@pytest.mark.parametrize("case", TWICE)
def test_an_option_given_twice_with_different_values_is_refused_naming_both(case, capsys, tmp_path, monkeypatch):
    """Once the last silently won (`recommend --default`, `--objective`, `--steady-seconds`, `--micro-batch-size`,
    `jpwr --methods`), and `--requests` beside `--trace` was ignored."""
    monkeypatch.chdir(tmp_path)
    command, argv, code, words = TWICE[case]
    try:
        ended = _main(command)(argv)
    except SystemExit as exc:  # the parser's refusal (exit 2)
        ended = exc.code
    err = capsys.readouterr().err
    assert ended == code, err
    assert words in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())  # refused before any work


@pytest.mark.parametrize("argv", [
    ["validate", *TINY, "--objective", "speed", "--objective", "speed"],
    ["validate", *TINY, "--no-idle-baseline", "--no-idle-baseline"],
])
def test_an_option_given_twice_alike_is_taken_once(argv, capsys):
    assert inference(argv) == 0, capsys.readouterr().err


def test_a_jube_set_key_given_twice_with_different_values_is_refused():
    from tests.jube.test_profile import jbprofile

    def values(*items: str) -> dict[str, str]:
        return jbprofile.sweep_values(argparse.Namespace(sweep=None, set=list(items)))

    assert values("batch_size=1", "batch_size=1", "task=chat") == {"batch_size": "1", "task": "chat"}
    with pytest.raises(jbprofile.ConfigError, match=re.escape("--set batch_size=1 and --set batch_size=4 both given: "
                                                              "only the last would count. Fix: give batch_size once")):
        values("batch_size=1", "batch_size=4")


def test_every_option_whose_repetition_makes_a_list_says_so_in_its_help(monkeypatch):
    from tests.test_numeric_options import _capture, _commands, _options

    lists = {(command, " ".join(path), action.option_strings[0]): action.help
             for command, build in _commands().items() for path, action in _options(_capture(build, monkeypatch))
             if isinstance(action, argparse._AppendAction | argparse._ExtendAction)}
    assert ("joulebench recommend", "", "--default") in lists
    assert [option for option, text in lists.items() if "repeat" not in (text or "")] == []


def test_the_parsers_groups_and_exclusive_options_are_argparse_s_as_before(capsys):
    """The rule on repetition keeps what argparse does with groups: their sections in --help, and the options of a
    mutually exclusive group refused together."""
    with pytest.raises(SystemExit):
        inference(["load", "--help"])
    help_text = capsys.readouterr().out
    assert "server (an OpenAI-compatible server instead of the in-process engine):" in help_text
    assert "\nload:\n" in help_text and "[--url URL | --server-command SERVER_COMMAND]" in help_text
    with pytest.raises(SystemExit) as ended:
        inference(["validate-load", *TINY, "--rate", "1", "--url", "http://a:1", "--server-command", "x"])
    assert ended.value.code == 2 and "argument --server-command: not allowed with argument --url" in \
        capsys.readouterr().err
