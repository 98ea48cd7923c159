"""Command line: ``python -m pydtnn_lite.validate TRACE_DIR [TRACE_DIR ...] [--calibration FILE | machine flags]``.

Sets the kernels of a trace (``python -m pydtnn_lite.train --trace DIR``) against the
performance model's predictions for the same model, batch and ranks, and writes a CSV per
kernel, a plot per stage and an HTML report (``TRACE_DIR/validation`` by default).
Without machine flags it uses the calibration the trace's meta.json names, and stops if
it names none: a preset describes another machine than the one a trace was taken on.
Given several runs of one configuration, it validates each and then sets the model's
figures beside how far the runs differ from each other (``repeatability.py``).
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
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels
from pydtnn_lite.perfmodel.modelling.repeatability import (
    check_same_configuration,
    comparison_summary,
    comparison_table,
)
from pydtnn_lite.perfmodel.modelling.trace_validation import CheckedTrace, check_trace, run_label, trace_calibration
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.tracing import KernelRecord, load_trace
from pydtnn_lite.tracing.records import EVENTS_FILE, META_FILE, trace_meta

PROGRAM = "pydtnn_lite.validate"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-validate", __doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="+",
                        help="a directory written by python -m pydtnn_lite.train --trace DIR; several runs of one "
                             "configuration: each validated, then the model set beside the runs' own spread")
    parser.add_argument("--out", default=None,
                        help="where to write the report (default TRACE/validation; with several traces, "
                             "OUT/run-1, OUT/run-2, ... in their order)")
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
        check_same_configuration(args.trace, [trace_meta(trace) for trace in args.trace])
        # One trace's records at a time: a run's events of many steps and ranks fill memory.
        checked = [check_one(args, trace, load_trace(trace), folder) for trace, folder in
                   zip(args.trace, report_folders(args.out, len(args.trace)), strict=True)]
    except (OSError, ValueError, KeyError, UserError) as error:
        detail = f"the trace's meta.json lacks {error}" if isinstance(error, KeyError) else str(error)
        print(f"{PROGRAM}: error: {detail}", file=sys.stderr)
        return 2
    validations = [run.validation for run in checked]
    if args.json:
        print_output(json.dumps(checked[0].summary() if len(checked) == 1 else
                                {"traces": [run.summary() for run in checked],
                                 **comparison_summary(validations)}, indent=1))
    elif len(checked) == 1:
        print_output(checked[0].text())
    else:
        print_output("\n\n".join([f"run {i + 1}: {run.text()}" for i, run in enumerate(checked)] +
                                  [f"{len(checked)} runs of {run_label(checked[0].meta)}: the model beside how far "
                                   "the runs differ from each other\n" + comparison_table(validations)]))
    return 0


def report_folders(out: str | None, traces: int) -> list[str | None]:
    """Where each trace's report goes: ``out`` for one trace (None: in the trace), OUT/run-1,
    OUT/run-2, ... for several (traces of different runs may share a folder name)."""
    if out is None or traces == 1:
        return [out] * traces
    return [os.path.join(out, f"run-{i + 1}") for i in range(traces)]


def check_one(args: argparse.Namespace, trace: str, loaded: tuple[list, list, dict], out: str | None) -> CheckedTrace:
    """One trace validated on the machine the flags give, or else on the calibration its meta.json names;
    its report in ``out`` (default: in the trace)."""
    records, _, meta = loaded
    check_same_model(trace, records, meta)
    flags = args if names_a_machine(args) else argparse.Namespace(**{**vars(args),
                                                                      "calibration": trace_calibration(meta)})
    itemsize = 8 if meta.get("dtype", "float32") == "float64" else 4
    machine, machine_name, _ = machine_from_arguments(flags, itemsize, Processor.of(meta), meta.get("device", "cpu"),
                                                      blas_kernels(meta))
    return check_trace(trace, loaded, machine, machine_name, out)


if __name__ == "__main__":
    sys.exit(main())
