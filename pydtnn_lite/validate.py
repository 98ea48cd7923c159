"""Command line: ``python -m pydtnn_lite.validate TRACE_DIR [--calibration FILE | machine flags]``.

Sets the kernels of a trace (``python -m pydtnn_lite.train --trace DIR``) against the
performance model's predictions for the same model, batch and ranks, and writes a CSV per
kernel, a plot per stage and an HTML report (``TRACE_DIR/validation`` by default).
Without machine flags it uses the calibration the trace's meta.json names, and stops if
it names none: a preset describes another machine than the one a trace was taken on.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from pydtnn_lite.cli import command_parser, parse_command_line, print_output
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.machine_flags import add_machine_arguments, machine_from_arguments, names_a_machine
from pydtnn_lite.perfmodel.modelling.processors import Processor
from pydtnn_lite.perfmodel.modelling.trace_validation import check_trace, trace_calibration
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.tracing import KernelRecord, load_trace
from pydtnn_lite.tracing.records import EVENTS_FILE, META_FILE

PROGRAM = "pydtnn_lite.validate"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-validate", __doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a directory written by python -m pydtnn_lite.train --trace DIR")
    parser.add_argument("--out", default=None, help="where to write the report (default TRACE/validation)")
    parser.add_argument("--json", action="store_true",
                        help="print the step and stage figures as one JSON object instead of the table")
    add_machine_arguments(parser)
    return parser


def check_same_model(trace: str, records: list[KernelRecord], meta: dict) -> None:
    """Refuse a trace whose kernels are not of the layers of the model its meta.json names (files of
    two runs mixed): its validation would set one model's measurements against another's prediction."""
    network, _ = build_workload(meta["model"], meta["dataset"], meta.get("dtype", "float32"))
    expected = {layer.index: layer.name for layer in network.layers}
    expected[network.loss_index] = "loss"
    for record in records:
        if record.layer >= 0 and expected.get(record.layer) != record.layer_name:
            raise UserError(f"{os.path.join(trace, META_FILE)} names model {meta['model']}, but "
                            f"{os.path.join(trace, EVENTS_FILE)} holds another network's layers (layer {record.layer} "
                            f"is {record.layer_name} there, {expected.get(record.layer, 'absent')} in "
                            f"{meta['model']}): the files come from different runs; trace the run again")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    try:
        loaded = load_trace(args.trace)
        check_same_model(args.trace, loaded[0], loaded[2])
        if not names_a_machine(args):
            args.calibration = trace_calibration(loaded[2])
        dtype = loaded[2].get("dtype", "float32")
        machine, machine_name, _ = machine_from_arguments(args, 8 if dtype == "float64" else 4,
                                                           Processor.of(loaded[2]),
                                                           loaded[2].get("device", "cpu"))
        checked = check_trace(args.trace, loaded, machine, machine_name, args.out)
    except (OSError, ValueError, KeyError, UserError) as error:
        detail = f"the trace's meta.json lacks {error}" if isinstance(error, KeyError) else str(error)
        print(f"{PROGRAM}: error: {detail}", file=sys.stderr)
        return 2
    print_output(json.dumps(checked.summary(), indent=1) if args.json else checked.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
