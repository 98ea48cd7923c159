"""Predicted against measured training steps on an emulated cluster (run as root, from the repository root).

    python benchmarks/emulated_cluster.py [--nodes 2] [--ranks-per-node 1] [--link-gbit 1 2 5]
        [--models vgg11 resnet18] [--comm mpi [hierarchical ...]] [--calibration calibration/] [--steps 6]
        [--runs 1] [--keep DIR]

For each link rate, launch/emulated-cluster.sh first times Allreduce into a copy of the
calibration (``calibrate --allreduce-only --quick``: the job-wide, inter-node and
intra-node reductions over the shaped links; the kernels stay the calibration's, which
must have nodes x ranks-per-node ranks), then trains each model under the same emulated
cluster with ``--trace`` (once per ``--comm`` strategy) and validates the trace against that copy. Prints per run the
strategy taken, the measured and predicted step and COMM (the Allreduce time the step waits for), and their
errors (predicted - measured) / measured; the step's error after the correction for the
machine's drift since the calibration (docs/performance-model.md), and before it; and COMM's
parts, the posts of the buckets, the tests between backward's kernels and the wait, each
measured with its prediction beside it.
With ``--runs N`` (N >= 2) each configuration trains N times in a row, and the summary gives
the medians over its runs and, beside the errors, how far the runs differ among
themselves: the median over every ordered pair of runs of |one's - the other's| / the
other's step and COMM, the error one run's measurement makes as a prediction of another's.
``--keep DIR`` keeps the traces and the re-timed calibrations there (a new folder).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys

from pydtnn_lite.perfmodel.measuring.host import this_blas_kernels, this_processor
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.perfmodel.modelling.validation import COMM_PARTS
from pydtnn_lite.textable import format_table

from common import output_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launch", "emulated-cluster.sh")
PYTHON = sys.executable
HEADERS = ["model", "comm", "Gbit/s", "step ms", "predicted", "error %", "before drift %", "COMM ms", "predicted",
           "error %", "posts, tests, wait ms (predicted)"]
BETWEEN_HEADERS = ["between runs: step %", "COMM %"]


def on_cluster(args: argparse.Namespace, rate: float, command: list[str]) -> None:
    """Run ``command`` under the launcher; stop with its output when it fails."""
    launch = [LAUNCHER, "--nodes", str(args.nodes), "--ranks-per-node", str(args.ranks_per_node),
              "--link-gbit", f"{rate:g}", "--", PYTHON, *command]
    env = dict(os.environ, MPIEXEC=os.path.join(os.path.dirname(PYTHON), "mpiexec"))
    result = subprocess.run(launch, capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(launch)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def validated_run(args: argparse.Namespace, rate: float, model: str, comm: str, calibration: str,
                  trace: str) -> dict:
    """Train ``model`` traced into ``trace`` under the emulated cluster with ``--comm comm``;
    the validation's figures as JSON."""
    folder = os.path.dirname(trace)
    on_cluster(args, rate, ["-m", "pydtnn_lite.train", "--model", model, "--batch-size", str(args.batch_size),
                            "--steps-per-epoch", str(args.steps), "--eval-steps", "0", "--no-progress",
                            "--comm", comm, "--trace", trace, "--validate", calibration,
                            "--run-dir", os.path.join(folder, "runs")])
    result = subprocess.run([PYTHON, "-m", "pydtnn_lite.validate", trace, "--json"], capture_output=True, text=True,
                            check=True)
    with open(os.path.join(trace, "meta.json"), encoding="utf-8") as handle:
        strategy = json.load(handle)["strategy"]
    return dict(json.loads(result.stdout), strategy=strategy)


def between_runs(values: list[float]) -> float:
    """Percent by which one run's ``values`` entry misses another's, the median over every ordered pair."""
    return 100 * statistics.median(abs(a - b) / b for a, b in itertools.permutations(values, 2))


def comm_parts(runs: list[dict]) -> str:
    """COMM's parts (``validate --json``'s ``comm_parts``), the medians over ``runs`` of each
    measured and predicted: "posts (predicted), tests (predicted), wait (predicted)" in ms;
    "-" where the model had none."""
    if not all(run.get("comm_parts") for run in runs):
        return "-"

    def median(part: str, figure: str) -> float:
        return 1e3 * statistics.median(run["comm_parts"][part][figure] for run in runs)
    return ", ".join(f"{median(part, 'measured_seconds'):.1f} ({median(part, 'predicted_seconds'):.1f})"
                     for part in COMM_PARTS)


def summary_row(runs: list[dict], model: str, comm: str, rate: float, with_between: bool) -> list[str]:
    """A configuration's medians over its ``runs`` (validations), and how far the runs differ."""
    def median(key: str, stage: str | None = None) -> float:
        return statistics.median(run[key][stage] if stage else run[key] for run in runs)
    strategies = sorted({run["strategy"] for run in runs})
    taken = comm if strategies == [comm] else f"{comm}: {', '.join(strategies)}"
    row = [model, taken, f"{rate:g}", f"{median('measured_step_seconds') * 1e3:.0f}",
           f"{median('predicted_step_seconds') * 1e3:.0f}", f"{100 * median('step_error'):+.1f}",
           f"{100 * median('raw_step_error'):+.1f}", f"{median('measured_stage_seconds', 'COMM') * 1e3:.0f}",
           f"{median('predicted_stage_seconds', 'COMM') * 1e3:.0f}", f"{100 * median('stage_errors', 'COMM'):+.1f}",
           comm_parts(runs)]
    if with_between:
        row += [f"{between_runs([run['measured_step_seconds'] for run in runs]):.1f}",
                f"{between_runs([run['measured_stage_seconds']['COMM'] for run in runs]):.1f}"]
    return row


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
    parser.add_argument("--runs", type=int, default=1, help="training runs of each configuration")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the traces and calibrations in DIR")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    args.calibration = calibration_file(args.calibration, this_processor(), blas=this_blas_kernels())
    rows = []
    with output_folder(args.keep, "emulated_cluster") as folder:
        for rate in args.link_gbit:
            calibration = os.path.join(folder, f"calibration-{rate:g}.json")
            shutil.copy(args.calibration, calibration)
            on_cluster(args, rate, ["-m", "pydtnn_lite.calibrate", "--allreduce-only", calibration, "--quick"])
            for model, comm in itertools.product(args.models, args.comm):
                runs = []
                for run in range(args.runs):
                    runs.append(validated_run(args, rate, model, comm, calibration,
                                              os.path.join(folder, f"{model}-{comm}-{rate:g}-{run}")))
                    print(format_table(HEADERS, [summary_row(runs[-1:], model, comm, rate, False)]), flush=True)
                rows.append(summary_row(runs, model, comm, rate, args.runs > 1))
    print(f"\n{args.nodes} node(s) x {args.ranks_per_node} rank(s), global batch {args.batch_size}, {args.steps} "
          f"steps per run, {args.runs} run(s) each{' (medians)' if args.runs > 1 else ''}; kernels from "
          f"{os.path.relpath(args.calibration, REPO)}")
    print(format_table(HEADERS + (BETWEEN_HEADERS if args.runs > 1 else []), rows))


if __name__ == "__main__":
    main()
