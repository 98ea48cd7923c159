"""A gradient bucket's Allreduce and a layer's SGD update with their data in the cache, against after an eviction.

    mpiexec -n 2 python benchmarks/cache_residency.py [--mib 1 4 6 16 64] [--calls 15] [--rounds 2]

``calibrate`` times both with the caches evicted before every call, as a network larger
than the last-level cache leaves them: its bucket and its optimizer state are touched
again only after the rest of the step has streamed through memory. A small network (MLP,
LeNet) on a machine with a large last-level cache keeps its whole step in the cache, and
pays the warm time instead. Per size, the median of ``--calls`` calls of each (the slowest
rank's for the Allreduce), alternating warm and evicted rounds in this run:

- warm: the gradient written just before the call, as backward leaves it, nothing else touched;
- evicted: the same, after every rank has streamed twice its last-level cache
  (``CacheEvictor``, as ``calibrate`` does).

Rank 0 prints the two times and their ratio, warm over evicted (1.0: the cache does not
matter at that size).
"""
from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from pydtnn_lite.backend import make_backend
from pydtnn_lite.kernels import cpu
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.textable import format_table

from common import timed

WORLD = MPI.COMM_WORLD
MODES = ("warm", "evicted")


def timed_calls(run: Callable[[], None], prepare: Callable[[], None], calls: int) -> list[float]:
    """Seconds of ``calls`` calls of ``run``, each after ``prepare`` and a barrier."""
    seconds = []
    for _ in range(calls):
        prepare()
        WORLD.Barrier()
        seconds.append(timed(run))
    return seconds


def measure(count: int, evict: CacheEvictor, calls: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """This rank's seconds of each (kernel, mode) on a gradient of ``count`` float32, the
    modes alternating over ``rounds``."""
    param, grad, velocity = (np.ones(count, dtype=np.float32) for _ in range(3))

    def written() -> None:
        grad[:] = 1.0  # backward has just written the gradient

    def evicted() -> None:
        evict()
        written()

    def reduce() -> None:
        WORLD.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)

    def update() -> None:
        cpu.sgd_update(param, grad, velocity, 1e-6, 0.9, 0.0, False)

    reduce()
    update()  # compiles the update's loop
    seconds: dict[tuple[str, str], list[float]] = {}
    # Each mode's calls run in a block, not rotated call by call as common.interleave does:
    # a warm update right after an evicted call would find its weights and momentum evicted.
    for _ in range(rounds):
        for mode, prepare in zip(MODES, (written, evicted), strict=True):
            for kernel, run in (("allreduce", reduce), ("sgd_update", update)):
                seconds.setdefault((kernel, mode), []).extend(timed_calls(run, prepare, calls))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 4, 6, 16, 64],
                        help="sizes of the gradient (MiB of float32)")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per size, mode and round")
    parser.add_argument("--rounds", type=int, default=2, help="warm and evicted rounds, alternating")
    args = parser.parse_args()
    evict = CacheEvictor(make_backend("cpu"))
    rows = []
    for mib in args.mib:
        gathered = WORLD.gather(measure(int(mib * (1 << 20)) // 4, evict, args.calls, args.rounds))
        if gathered is None:  # only rank 0 gathers
            continue
        for kernel in ("allreduce", "sgd_update"):
            # The Allreduce ends for all when the slowest rank's does; an update is each rank's own.
            pick = max if kernel == "allreduce" else min
            median = {mode: statistics.median(pick(times) for times in zip(*(g[(kernel, mode)] for g in gathered),
                                                                           strict=True))
                      for mode in MODES}
            rows.append([kernel, f"{mib:g}", f"{1e3 * median['warm']:.3f}", f"{1e3 * median['evicted']:.3f}",
                         f"{median['warm'] / median['evicted']:.2f}"])
    if WORLD.rank == 0:
        print(f"{WORLD.size} rank(s), {evict.buffer.nbytes >> 20} MiB streamed by each to evict the caches")
        print(format_table(["kernel", "MiB", "warm ms", "evicted ms", "warm / evicted"], rows))


if __name__ == "__main__":
    main()
