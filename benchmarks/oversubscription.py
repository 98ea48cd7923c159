"""Training throughput with more ranks than cores, against as many ranks as cores, in the same run.

    python benchmarks/oversubscription.py [--model vgg11] [--dataset synthetic] [--batch-size 64] [--steps 6]
        [--ranks 2 8] [--rounds 3] [--variant NAME VAR=VALUE ...] [--train-flags "--no-overlap"]

Each round starts ``mpiexec -n R python -m pydtnn_lite.train`` once for the first of
``--ranks`` (the baseline, as the product sets it up) and once per variant for each other
rank count, in an order that rotates every round so that a slow spell of a shared machine
hits all alike. A run trains two epochs of ``--steps`` steps (synthetic data by default); its
throughput is that of the second epoch (the first pays allocation and warm-up). A variant
adds environment variables to its runs: ``--variant spin MPIR_CVAR_CH4_PROGRESS_THROTTLE=0``
undoes a setting the product makes. The default variant, ``product``, adds none.

Prints the median img/s of every run kind and its ratio to the baseline's median, then
what compute alone allows each rank count against the baseline: one rank of one thread
times a step on its share of the batch (in this process, in every round beside the
jobs), and R ranks on C cores need max(1, R / C) such steps of time a step.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.runtime import set_blas_threads, usable_cores
from pydtnn_lite.textable import format_table

from common import MPIEXEC, interleave, make_trainer, median_seconds

EPOCH_THROUGHPUT = re.compile(r"epoch 2/2: .*?([\d.]+) img/s")
BASELINE = "baseline"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch (two epochs; the second is timed)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8], help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "VAR=VALUE"),
                        help="a kind of run with these environment variables (repeatable)")
    parser.add_argument("--train-flags", default="", help="extra pydtnn_lite.train flags of every run")
    args = parser.parse_args()
    if len(args.ranks) < 2:
        parser.error("--ranks needs a baseline count and at least one other")
    for variant in args.variant or []:
        if not all("=" in setting for setting in variant[1:]):
            parser.error(f"--variant {' '.join(variant)}: settings must be VAR=VALUE")
    return args


def throughput(args: argparse.Namespace, ranks: int, environment: dict[str, str]) -> float:
    """Images per second of the second epoch of one training job on ``ranks`` ranks."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "pydtnn_lite.train", "--model", args.model,
                   "--dataset", args.dataset, "--batch-size", str(args.batch_size), "--epochs", "2",
                   "--steps-per-epoch", str(args.steps), "--eval-steps", "0", "--no-progress",
                   "--run-dir", run_dir, *args.train_flags.split()]
        result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, **environment))
    found = EPOCH_THROUGHPUT.search(result.stdout + result.stderr)
    if result.returncode != 0 or found is None:
        sys.exit(f"oversubscription: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return float(found.group(1))


def one_rank_step(args: argparse.Namespace, batch: int) -> float:
    """Seconds of a training step of one rank of one thread on ``batch`` images (median of ``--steps``)."""
    set_blas_threads(1)  # as each rank of a job with at least as many ranks as cores
    trainer = make_trainer(args.model, args.dataset, batch, SerialCommunicator())
    data = trainer.load_step(0, 0)
    return median_seconds(lambda: trainer.train_step(data), args.steps)


def compute_bound(step_seconds: float, ranks: int, cores: int) -> float:
    """The shortest step ``ranks`` ranks of one thread allow on ``cores`` cores, each rank's
    step taking ``step_seconds`` alone: ranks beyond the cores take turns."""
    return step_seconds * max(1.0, ranks / cores)


def main() -> None:
    args = parse_args()
    variants = {name: dict(setting.split("=", 1) for setting in settings)
                for name, *settings in args.variant or [["product"]]}
    baseline_ranks = args.ranks[0]
    runs = [(BASELINE, baseline_ranks, {})]
    runs += [(name, ranks, environment) for ranks in args.ranks[1:] for name, environment in variants.items()]

    def job(name: str, ranks: int, environment: dict[str, str]):
        return lambda: {f"{name}, {ranks} ranks": throughput(args, ranks, environment)}

    counts = list(dict.fromkeys(args.ranks))  # each rank count once (--ranks 2 2 8 repeats the baseline)

    def alone_label(ranks: int) -> str:
        return f"alone, {args.batch_size // ranks} images"

    def alone(ranks: int):
        return lambda: {alone_label(ranks): one_rank_step(args, args.batch_size // ranks)}

    jobs = [job(*run) for run in runs] + [alone(ranks) for ranks in counts]
    samples = interleave(jobs, args.rounds, warmup=0)
    steps_alone = {ranks: statistics.median(samples.pop(alone_label(ranks))) for ranks in counts}
    base = statistics.median(samples[f"{BASELINE}, {baseline_ranks} ranks"])
    rows = [[label, " ".join(f"{v:.1f}" for v in values), f"{statistics.median(values):.1f}",
             f"{statistics.median(values) / base:.2f}"] for label, values in samples.items()]
    print(f"{args.model}, global batch {args.batch_size}, {os.cpu_count()} cores; median of {args.rounds} rounds")
    print(format_table(["run", "img/s per round", "median img/s", f"/ {baseline_ranks} ranks"], rows))
    for name, environment in variants.items():
        print(f"{name}: {' '.join(f'{k}={v}' for k, v in environment.items()) or 'no added environment'}")
    cores = usable_cores()
    for ranks in counts[1:]:
        bound = compute_bound(steps_alone[baseline_ranks], baseline_ranks, cores) / compute_bound(
            steps_alone[ranks], ranks, cores)
        print(f"compute alone bounds {ranks} ranks at {bound:.2f}x of {baseline_ranks} on {cores} cores (one rank of "
              f"one thread: {args.batch_size // ranks} images {steps_alone[ranks] * 1e3:.1f} ms, "
              f"{args.batch_size // baseline_ranks} images {steps_alone[baseline_ranks] * 1e3:.1f} ms a step)")


if __name__ == "__main__":
    main()
