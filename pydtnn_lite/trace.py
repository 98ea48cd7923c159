"""Command line: ``python -m pydtnn_lite.trace summarize DIR`` prints what a trace holds.

The per-stage and per-layer times of a training step, the kernels that take longest with
the GFLOP/s and GB/s they achieve, and each rank's wait for the others (stragglers).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydtnn_lite import flags
from pydtnn_lite.cli import command_parser, parse_command_line, print_output
from pydtnn_lite.tracing import load_trace, report

PROGRAM = "pydtnn_lite.trace"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-trace", __doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    summarize = commands.add_parser("summarize", help="print the per-stage, per-layer, kernel and rank tables")
    summarize.add_argument("directory", help="a directory written by python -m pydtnn_lite.train --trace DIR")
    summarize.add_argument("--top", type=flags.COUNT, default=12, help="how many kernels to list (default 12)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    try:
        kernels, steps, meta = load_trace(args.directory)
    except (OSError, ValueError) as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    print_output(report(kernels, steps, meta, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
