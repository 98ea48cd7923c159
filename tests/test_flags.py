"""Every numeric flag of every command is range-checked as it is parsed: one line naming the flag, exit 2.

The fuzz runs the commands' parsers in-process (no process per case), so it stays quick.
"""
from __future__ import annotations

import argparse
import math

import pytest

from pydtnn_lite import calibrate, flags, predict, scalability, trace, train, validate

COMMANDS = {  # command: (its parser, the arguments it needs besides the flag under test)
    "train": (train.build_parser, []),
    "predict": (predict.build_parser, []),
    "calibrate": (calibrate.build_parser, []),
    "validate": (validate.build_parser, ["some-trace"]),
    "scalability": (scalability.build_parser, []),
    "trace summarize": (lambda: trace.build_parser()._subparsers._group_actions[0].choices["summarize"],  # type: ignore
                        ["some-trace"]),
}
HOSTILE = ("nan", "inf", "-inf", "-1", "0", "1e308", "-1e308", "1.5", "", "x", "1,nan", "0:nan", "-1:3")


def numeric_flags():
    for command, (make, needed) in COMMANDS.items():
        parser = make()
        for action in parser._actions:
            if action.type is not None and action.option_strings:
                yield pytest.param(parser, needed, action, id=f"{command} {action.option_strings[0]}")


NUMERIC_FLAGS = list(numeric_flags())


def test_every_command_has_its_numeric_flags_checked():
    assert {p.id.split(" --")[0] for p in NUMERIC_FLAGS} >= {"train", "predict", "calibrate", "validate",
                                                              "trace summarize"}
    for param in NUMERIC_FLAGS:
        action = param.values[2]
        assert isinstance(action.type, flags.CHECKED_TYPES), f"{param.id} has the unchecked type {action.type}"


def in_range(kind, value) -> bool:
    if isinstance(kind, flags.RangeType):
        return kind.in_range(value)
    if isinstance(kind, flags.ModelBatch):
        return value[1] >= 1
    if isinstance(kind, flags.RankValue):
        return value[0] >= 0 and kind.value.in_range(value[1])
    return all(math.isfinite(v) and 0 <= v <= flags.MAX_WEIGHT for v in value) and sum(value) > 0


@pytest.mark.parametrize("parser, needed, action", NUMERIC_FLAGS)
def test_a_hostile_value_is_refused_in_one_line_or_lands_in_range(parser, needed, action, capsys):
    flag = action.option_strings[0]
    for text in HOSTILE:
        try:
            parsed = parser.parse_args([*needed, f"{flag}={text}"])
        except SystemExit as exit_:
            assert exit_.code == 2
            lines = capsys.readouterr().err.splitlines()
            assert len(lines) == 1, lines
            names = "/".join(action.option_strings)  # argparse names a flag by all its spellings
            assert f"argument {names}: must be" in lines[0] and repr(text) in lines[0]
            continue
        value = getattr(parsed, action.dest)
        for item in value if action.nargs in ("*", "+") else [value]:
            assert in_range(action.type, item), f"{flag}={text} gave {item}"


@pytest.mark.parametrize("text, value", [("4", 4), (" 7 ", 7)])
def test_an_integer_flag_takes_whole_numbers(text, value):
    assert flags.integer(1, 10)(text) == value


@pytest.mark.parametrize("text", ["0", "11", "2.5", "nan", "1e3"])
def test_an_integer_out_of_its_range_names_the_range(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer from 1 to 10, got"):
        flags.integer(1, 10)(text)


def test_a_real_above_a_minimum_excludes_it():
    check = flags.real(0.0, 1.0, above=True)
    assert check("1") == 1.0 and check("1e-9") == 1e-9
    with pytest.raises(argparse.ArgumentTypeError, match="above 0 and at most 1"):
        check("0")


def test_weights_need_a_positive_sum_and_bounded_values():
    assert flags.weights()("1,3") == (1.0, 3.0)
    for text in ("0,0", "1,1e308", "nan", "1,-1", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive sum"):
            flags.weights()(text)


def test_only_the_first_rank_of_a_job_reports_a_bad_flag(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "1")
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--lr", "nan"])
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--lr", "nan"])
    assert "argument --lr" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_flag_is_taken_only_as_spelled_out(command, capsys):
    """A prefix of a flag is refused, never read as the one flag it begins (``predict --ranks 8``
    as ``--ranks-per-node 8``)."""
    make, needed = COMMANDS[command]
    parser = make()
    longest = max((option for action in parser._actions for option in action.option_strings
                   if option.startswith("--") and action.nargs != 0), key=len)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([*needed, longest[:-2], "1"])
    assert exit_.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err
