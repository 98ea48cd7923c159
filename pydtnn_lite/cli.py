"""What every command line shares: ``--version`` and ``--config FILE.toml`` (and ``--log-level``).

Each command builds its parser with :func:`command_parser` and reads its arguments with
:func:`parse_command_line`. A configuration file's keys are the command's long flag names
(``batch-size = 128``, ``random-flip = true``, ``lr-decay-epochs = [30, 60]``); its values
go through the same parser as typed flags, so they are checked the same way, and flags
given on the command line override them.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

from pydtnn_lite.flags import Parser

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the tomli backport
    import tomli as tomllib

LOG_LEVELS = ("debug", "info", "warning", "error")
SHARED_DESTS = {"help", "version", "config", "log_level"}  # flags a configuration file cannot set


def print_output(text: str) -> None:
    """Print a command's report; a reader that stops early (``| head``) is not an error.

    Once the pipe is closed, standard output is pointed at the null device, so that the
    interpreter's own flush at exit does not fail again.
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def version() -> str:
    """The installed package's version ('unknown' in a checkout that was never installed)."""
    try:
        return metadata.version("pydtnn_lite")
    except metadata.PackageNotFoundError:
        return "unknown"


def command_parser(program: str, description: str | None, *, logs: bool = False,
                   formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter) -> argparse.ArgumentParser:
    """A parser for the command ``program`` (e.g. pydtnn-train) with the flags every command has,
    and ``--log-level`` where the command ``logs`` through :mod:`pydtnn_lite.logs`; its errors
    are one line (:class:`pydtnn_lite.flags.Parser`)."""
    parser = Parser(prog=program, description=description, formatter_class=formatter_class)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("--config", default=None, metavar="FILE.toml",
                        help="read flags from this TOML file: its keys are the long flag names (batch-size = 128); "
                             "flags on the command line override it")
    if logs:
        parser.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                            help="least severity of the messages shown")
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (default: sys.argv[1:]) after the flags of its --config file, if it names one.

    A file that cannot be read, is not TOML, or holds a key that is not a flag of the
    command ends it with one error line and status 2, as a bad flag does.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    finder.add_argument("--config", default=None)
    found, arguments = finder.parse_known_args(arguments)
    path = found.config
    if path is None:
        return parser.parse_args(arguments)
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except OSError as error:
        fail(parser, f"cannot read --config {path}: {error.strerror or error}")
    except tomllib.TOMLDecodeError as error:
        fail(parser, f"--config {path} is not valid TOML: {error}")
    # A subcommand's flags follow its name; the file's flags go right after it, ahead of the typed ones.
    subcommand, at = subcommand_of(parser, arguments)
    flags = file_flags(table, parser if subcommand is None else subcommand, parser.prog, path)
    # --config goes first, where the main parser (not a subcommand's) reads it.
    return parser.parse_args(["--config", path, *arguments[:at], *flags, *arguments[at:]])


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """End the command with one error line and status 2 (on the job's first rank alone, as a bad flag)."""
    parser.error(message)


def subcommand_of(parser: argparse.ArgumentParser,
                  arguments: list[str]) -> tuple[argparse.ArgumentParser | None, int]:
    """The subcommand parser ``arguments`` choose and the position just after its name, or (None, 0)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for position, word in enumerate(arguments):
                if word in action.choices:
                    return action.choices[word], position + 1
    return None, 0


def file_flags(table: dict[str, Any], parser: argparse.ArgumentParser, program: str, path: str) -> list[str]:
    """The command-line words that say what the configuration ``table`` says."""
    options = {option: action for action in parser._actions for option in action.option_strings
               if option.startswith("--") and action.dest not in SHARED_DESTS}
    words: list[str] = []
    for key, value in table.items():
        option = "--" + key.replace("_", "-")
        action = options.get(option)
        if action is None:
            fail(parser, f"--config {path}: {key!r} is not a flag of {program}: see {program} --help")
        words += flag_words(option, action, value, parser, path)
    return words


def flag_words(option: str, action: argparse.Action, value: Any, parser: argparse.ArgumentParser,
               path: str) -> list[str]:
    """``option`` set to the TOML ``value`` as command-line words."""
    key = option[2:]
    switch = action.nargs == 0
    if switch or isinstance(value, bool):
        if not (switch or action.nargs == "?") or not isinstance(value, bool):
            kind = "true or false" if switch else "a value, not true or false"
            fail(parser, f"--config {path}: {key} takes {kind}, got {value!r}")
        return [option] if value else []
    if isinstance(value, list):
        if action.nargs not in ("*", "+") and not isinstance(action.nargs, int):
            fail(parser, f"--config {path}: {key} takes one value, got the list {value!r}")
        return [option, *(str(item) for item in value)]
    if isinstance(value, dict):
        fail(parser, f"--config {path}: {key} takes a value, got the table {value!r}")
    return [f"{option}={value}"]
