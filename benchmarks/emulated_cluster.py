"""Predicted against measured training steps on an emulated cluster (run as root, from the repository root).

    python benchmarks/emulated_cluster.py [--nodes 2] [--ranks-per-node 1] [--link-gbit 1 2 5]
        [--models vgg11 resnet18] [--comm mpi [hierarchical ...]] [--calibration calibration/] [--steps 6]
        [--keep DIR]

For each link rate, launch/emulated-cluster.sh first times Allreduce into a copy of the
calibration (``calibrate --allreduce-only --quick``: the job-wide, inter-node and
intra-node reductions over the shaped links; the kernels stay the calibration's, which
must have nodes x ranks-per-node ranks), then trains each model under the same emulated
cluster with ``--trace`` (once per ``--comm`` strategy) and validates the trace against that copy. Prints per run the
strategy taken, the measured and predicted step and COMM (the Allreduce time the step waits for), and their
errors (predicted - measured) / measured; the step's error after the correction for the
machine's drift since the calibration (docs/performance-model.md), and before it.
``--keep DIR`` keeps the traces and the re-timed calibrations there (a new folder).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys

from pydtnn_lite.perfmodel.measuring.host import this_processor
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.textable import format_table

from common import output_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launch", "emulated-cluster.sh")
PYTHON = sys.executable
HEADERS = ["model", "comm", "Gbit/s", "step ms", "predicted", "error %", "before drift %", "COMM ms", "predicted",
           "error %"]


def on_cluster(args: argparse.Namespace, rate: float, command: list[str]) -> None:
    """Run ``command`` under the launcher; stop with its output when it fails."""
    launch = [LAUNCHER, "--nodes", str(args.nodes), "--ranks-per-node", str(args.ranks_per_node),
              "--link-gbit", f"{rate:g}", "--", PYTHON, *command]
    env = dict(os.environ, MPIEXEC=os.path.join(os.path.dirname(PYTHON), "mpiexec"))
    result = subprocess.run(launch, capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(launch)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def validated_run(args: argparse.Namespace, rate: float, model: str, comm: str, calibration: str,
                  folder: str) -> dict:
    """Train ``model`` traced under the emulated cluster with ``--comm comm``; the validation's figures as JSON."""
    trace = os.path.join(folder, f"{model}-{comm}-{rate:g}")
    on_cluster(args, rate, ["-m", "pydtnn_lite.train", "--model", model, "--batch-size", str(args.batch_size),
                            "--steps-per-epoch", str(args.steps), "--eval-steps", "0", "--no-progress",
                            "--comm", comm, "--trace", trace, "--validate", calibration,
                            "--run-dir", os.path.join(folder, "runs")])
    result = subprocess.run([PYTHON, "-m", "pydtnn_lite.validate", trace, "--json"], capture_output=True, text=True,
                            check=True)
    with open(os.path.join(trace, "meta.json"), encoding="utf-8") as handle:
        strategy = json.load(handle)["strategy"]
    return dict(json.loads(result.stdout), strategy=strategy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--link-gbit", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    parser.add_argument("--models", nargs="+", default=["vgg11", "resnet18"])
    parser.add_argument("--comm", nargs="+", default=["mpi"],
                        help="--comm of the training runs, each in turn (mpi, hierarchical, auto)")
    parser.add_argument("--calibration", default=os.path.join(REPO, "calibration"),
                        help="the kernels' calibration file, or a folder: its file of this processor")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not traced)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the traces and calibrations in DIR")
    args = parser.parse_args()
    args.calibration = calibration_file(args.calibration, this_processor())
    rows = []
    with output_folder(args.keep, "emulated_cluster") as folder:
        for rate in args.link_gbit:
            calibration = os.path.join(folder, f"calibration-{rate:g}.json")
            shutil.copy(args.calibration, calibration)
            on_cluster(args, rate, ["-m", "pydtnn_lite.calibrate", "--allreduce-only", calibration, "--quick"])
            for model, comm in itertools.product(args.models, args.comm):
                figures = validated_run(args, rate, model, comm, calibration, folder)
                measured, predicted = figures["measured_stage_seconds"], figures["predicted_stage_seconds"]
                taken = comm if comm == figures["strategy"] else f"{comm}: {figures['strategy']}"
                rows.append([model, taken, f"{rate:g}", f"{figures['measured_step_seconds'] * 1e3:.0f}",
                             f"{figures['predicted_step_seconds'] * 1e3:.0f}", f"{100 * figures['step_error']:+.1f}",
                             f"{100 * figures['raw_step_error']:+.1f}",
                             f"{measured['COMM'] * 1e3:.0f}", f"{predicted['COMM'] * 1e3:.0f}",
                             f"{100 * figures['stage_errors']['COMM']:+.1f}"])
                print(format_table(HEADERS, rows[-1:]), flush=True)
    print(f"\n{args.nodes} node(s) x {args.ranks_per_node} rank(s), global batch "
          f"{args.batch_size}, {args.steps} steps per run; kernels from {os.path.relpath(args.calibration, REPO)}")
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
