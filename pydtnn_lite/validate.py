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
from pydtnn_lite.perfmodel.machines import cluster_machine, described_cluster
from pydtnn_lite.perfmodel.prediction import predict_step
from pydtnn_lite.perfmodel.report import summary_text, write_report
from pydtnn_lite.perfmodel.validation import validate
from pydtnn_lite.perfmodel.workload import build_workload
from pydtnn_lite.predict import add_machine_arguments
from pydtnn_lite.tracing import load_trace

PROGRAM = "pydtnn_lite.validate"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a directory written by python -m pydtnn_lite.train --trace DIR")
    parser.add_argument("--out", default=None, help="where to write the report (default TRACE/validation)")
    add_machine_arguments(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        records, steps, meta = load_trace(args.trace)
        if not steps:
            raise UserError(f"{args.trace} holds no traced training step: lower --trace-skip or train more steps")
        cluster = described_cluster(args.preset, args.peak_flops, args.mem_bw, args.link_bw, args.latency)
        network, optimizer = build_workload(meta["model"], meta["dataset"], meta.get("dtype", "float32"),
                                            meta.get("optimizer", "sgd"))
        machine = cluster_machine(cluster, args.algorithm, 8 if meta.get("dtype") == "float64" else 4)
        procs, bucket_mb = int(meta["ranks"]), float(meta.get("bucket_mb", 4.0))
        validation = validate(records, steps, bool(meta.get("overlap", True)),
                              lambda batch: predict_step(network, optimizer, batch, procs, machine, bucket_mb))
        title = (f"{meta['model']} on {meta['dataset']}, global batch {meta['global_batch']}, {procs} rank(s), "
                 f"{meta.get('device', '?')}: measured against predicted ({cluster.name})")
        paths = write_report(args.out or os.path.join(args.trace, "validation"), validation, title)
    except (OSError, ValueError, KeyError, UserError) as error:
        detail = f"the trace's meta.json lacks {error}" if isinstance(error, KeyError) else str(error)
        print(f"{PROGRAM}: error: {detail}", file=sys.stderr)
        return 2
    print(title)
    print(summary_text(validation))
    print("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
