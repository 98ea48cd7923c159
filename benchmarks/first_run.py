"""The first run after an installation, which compiles the host kernels, against a run that finds them compiled.

    python benchmarks/first_run.py [--model resnet18] [--batch-size 64] [--steps 2] [--ranks 2 8]

For each of ``--ranks`` it times a whole ``mpiexec -n R python -m pydtnn_lite.train`` of
``--steps`` steps twice: with Numba's cache empty (``NUMBA_CACHE_DIR``, a new folder), as
after ``pip install``, then again with the cache that run left, the baseline. Prints both
wall times, their difference (the compilations' share of the first run) and their ratio.
A function compiles once per host (``kernels/jit.py``): without that, every rank compiled
every loop it called, and ranks beyond the cores shared them to do so.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from pydtnn_lite.textable import format_table

from common import MPIEXEC


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2, help="training steps of each run")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    return parser.parse_args()


def timed_run(args: argparse.Namespace, ranks: int, cache: str, run_dir: str) -> float:
    """Wall seconds of one training job whose processes keep Numba's machine code in ``cache``."""
    command = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "pydtnn_lite.train", "--model", args.model,
               "--batch-size", str(args.batch_size), "--epochs", "1", "--steps-per-epoch", str(args.steps),
               "--eval-steps", "1", "--run-dir", run_dir]
    started = time.perf_counter()
    result = subprocess.run(command, env={**os.environ, "NUMBA_CACHE_DIR": cache}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"training failed ({' '.join(command)}):\n{result.stderr[-3000:]}")
    return seconds


def main() -> None:
    args = parse_args()
    rows = []
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="pydtnn-first-run-") as folder:
            cache = os.path.join(folder, "numba-cache")
            first = timed_run(args, ranks, cache, os.path.join(folder, "first"))
            again = timed_run(args, ranks, cache, os.path.join(folder, "again"))
        rows.append([str(ranks), f"{first:.1f}", f"{again:.1f}", f"{first - again:.1f}", f"{first / again:.2f}x"])
    print(f"{args.model}, global batch {args.batch_size}, {args.steps} steps a run; wall seconds of the whole job")
    print(format_table(["ranks", "first run", "cache filled", "compiling", "first / filled"], rows))


if __name__ == "__main__":
    main()
