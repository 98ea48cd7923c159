"""Command line: ``python -m pydtnn_lite.validate TRACE_DIR [--calibration FILE | machine flags]``.

Sets the kernels of a trace (``python -m pydtnn_lite.train --trace DIR``) against the
performance model's predictions for the same model, batch and ranks, and writes a CSV per
kernel, a plot per stage and an HTML report (``TRACE_DIR/validation`` by default).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.prediction import Machine, predict_step
from pydtnn_lite.perfmodel.modelling.report import summary_text, write_report
from pydtnn_lite.perfmodel.modelling.validation import Validation, validate
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.predict import add_machine_arguments, machine_from_arguments
from pydtnn_lite.tracing import load_trace

PROGRAM = "pydtnn_lite.validate"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a directory written by python -m pydtnn_lite.train --trace DIR")
    parser.add_argument("--out", default=None, help="where to write the report (default TRACE/validation)")
    add_machine_arguments(parser)
    return parser


def validation_of(trace: str, loaded: tuple[list, list, dict], machine: Machine) -> Validation:
    """The trace of directory ``trace`` (``loaded`` is what ``load_trace`` read there)
    against the prediction of ``machine`` for the same model, batch, ranks and settings."""
    records, steps, meta = loaded
    if not steps:
        raise UserError(f"{trace} holds no traced training step: lower --trace-skip or train more steps")
    network, optimizer = build_workload(meta["model"], meta["dataset"], meta.get("dtype", "float32"),
                                        meta.get("optimizer", "sgd"))
    procs, bucket_mb = int(meta["ranks"]), float(meta.get("bucket_mb", 4.0))
    return validate(records, steps, bool(meta.get("overlap", True)),
                    lambda batch: predict_step(network, optimizer, batch, procs, machine, bucket_mb))


def validate_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                   out: Optional[str] = None) -> str:
    """Validate the trace of directory ``trace`` (``loaded`` is what ``load_trace`` read
    there) on ``machine``, write the report (to ``out``, default ``trace/validation``) and
    return the text summary."""
    validation = validation_of(trace, loaded, machine)
    meta = loaded[2]
    procs = int(meta["ranks"])
    title = (f"{meta['model']} on {meta['dataset']}, global batch {meta['global_batch']}, {procs} rank(s), "
             f"{meta.get('device', '?')}: measured against predicted ({machine_name})")
    paths = write_report(out or os.path.join(trace, "validation"), validation, title)
    return "\n".join([title, summary_text(validation), "wrote " + ", ".join(paths)])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        loaded = load_trace(args.trace)
        dtype = loaded[2].get("dtype", "float32")
        machine, machine_name, _ = machine_from_arguments(args, 8 if dtype == "float64" else 4)
        print(validate_trace(args.trace, loaded, machine, machine_name, args.out))
    except (OSError, ValueError, KeyError, UserError) as error:
        detail = f"the trace's meta.json lacks {error}" if isinstance(error, KeyError) else str(error)
        print(f"{PROGRAM}: error: {detail}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
