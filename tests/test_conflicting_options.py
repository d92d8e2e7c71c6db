"""Options that mean the same, given together, are refused by one rule in every driver (joulebench.arguments.
SameMeaning; issue 47 item 6): exit 2 naming both and which to keep, in either order and whatever the values,
where argparse alone would have kept one of them silently. Each option alone still works."""

from __future__ import annotations

import argparse

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
