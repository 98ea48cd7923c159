"""A kernel call's cold start: the same call after other work against back to back.

    python benchmarks/cold_start.py [--elements 456] [--rounds 50] [--busy-ms 5]

A training step's first update follows the step's other work (backward, the gradient
wait), and it takes longer than the same call among the other updates: the calibration
keeps these calls apart and predicts the excess (``Calibration.cold_start_seconds``,
docs/performance-model.md, "Cold starts"). This shows where the excess comes from. It
times one SGD update of ``--elements`` parameters with momentum (the Numba kernel a step
runs, on one thread) and a NumPy in-place update of the same arrays, each back to back
(the baseline, measured in the same round) and after ``--busy-ms`` of GEMMs, of a busy
wait and of sleep, the conditions taking turns within every round. Prints each median and
its ratio to back to back.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from pydtnn_lite.kernels import cpu
from pydtnn_lite.runtime import set_blas_threads

GEMM_SIZE = 256  # one product of this size takes well under a millisecond: the busy time is a whole number of them


def gemms(seconds: float) -> Callable[[], None]:
    """Matrix products for about ``seconds``."""
    a = np.random.default_rng(0).random((GEMM_SIZE, GEMM_SIZE), dtype=np.float32)

    def run() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            a @ a
    return run


def busy_wait(seconds: float) -> Callable[[], None]:
    """A loop of the interpreter alone, as a rank polling a reduction spins."""
    def run() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass
    return run


def sleep(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=456, help="parameters updated (456: LeNet's first layer)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--busy-ms", type=float, default=5.0, help="other work before each timed call")
    args = parser.parse_args()
    set_blas_threads(1)
    cpu.set_threads(1)
    param, grad, velocity = (np.ones(args.elements, dtype=np.float32) for _ in range(3))

    def numba_update() -> None:
        cpu.sgd_update(param, grad, velocity, 1e-4, 0.9, 0.0, False)

    def numpy_update() -> None:
        param.__isub__(grad * np.float32(1e-4))

    before = {"after GEMMs": gemms(args.busy_ms / 1e3), "after a busy wait": busy_wait(args.busy_ms / 1e3),
              "after sleep": sleep(args.busy_ms / 1e3)}
    for name, update in (("Numba sgd_update", numba_update), ("NumPy p -= lr * g", numpy_update)):
        for _ in range(5):
            update()
        seconds: dict[str, list[float]] = {"back to back": [], **{condition: [] for condition in before}}
        for _ in range(args.rounds):
            for condition, other_work in before.items():
                other_work()
                started = time.perf_counter()
                update()
                seconds[condition].append(time.perf_counter() - started)
                started = time.perf_counter()
                update()  # the same call again at once: the baseline
                seconds["back to back"].append(time.perf_counter() - started)
        baseline = float(np.median(seconds["back to back"]))
        print(f"{name}, {args.elements} elements, {args.rounds} rounds, {args.busy_ms:g} ms of other work:")
        for condition, times in seconds.items():
            median = float(np.median(times))
            print(f"  {condition:18s} {1e6 * median:8.1f} us  {median / baseline:5.1f}x back to back")


if __name__ == "__main__":
    main()
