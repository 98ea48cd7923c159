"""The machine-state probe: a few seconds that say how fast this machine runs right now.

A calibration is a snapshot: shared hosts, clock speeds and other jobs move a machine's
speed by tens of percent from one day, or hour, to the next. The probe measures three
rates the kernels' times follow: a float32 GEMM (the compute-bound kernels), a copy of an
array larger than the caches (the memory-bound ones) and a small Allreduce over the
job's ranks (communication). ``calibrate`` stores one beside its kernel models, and every
traced run measures one when it starts; their ratios (``modelling/drift.py``) correct a
prediction for how the machine moved in between.

GEMM and copy run on rank 0 with one BLAS thread while the other ranks wait without
spinning, so the figures describe a core of the machine, not how many ranks share it
(that is the placement's job). The Allreduce is timed as calibrations time it: every
call on a buffer evicted from the cache, the slowest rank's time.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.modelling.drift import MachineState

GEMM_SIZE = 1024  # n of the n^3 product: ~2 GFLOP, tens of milliseconds on one core
COPY_BYTES = 64 << 20  # beyond the last-level cache of the machines this runs on
ALLREDUCE_BYTES = 1 << 20  # a gradient bucket's order of magnitude, sampled by every calibration
REPEATS = 11  # a shared machine's timings are bimodal at times: the median of many
SLEEP_SECONDS = 1e-3  # how often a waiting rank looks whether rank 0 is done


def median_and_spread(seconds: Sequence[float]) -> tuple[float, float]:
    """The median of ``seconds`` and its relative spread: half the interquartile range
    over the median (0.05: the middle half of the repeats lies within about +-5 %)."""
    lower, median, upper = statistics.quantiles(seconds, n=4)
    return median, (upper - lower) / (2 * median)


def _timed(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    run()  # warm-up: page faults, BLAS buffers
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return median_and_spread(seconds)


def core_rates(repeats: int = REPEATS) -> tuple[float, float, float, float]:
    """(GEMM FLOP/s, copy bytes/s) of this process on one BLAS thread, each followed by its
    relative spread: medians, since the probe asks how fast the machine runs now, not how
    fast it can run."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((GEMM_SIZE, GEMM_SIZE)).astype(np.float32) for _ in range(2))
    product = np.empty_like(a)
    source = np.ones(COPY_BYTES // 4, dtype=np.float32)
    target = np.empty_like(source)
    with threadpool_limits(1, user_api="blas"):
        gemm_seconds, gemm_spread = _timed(lambda: np.matmul(a, b, out=product), repeats)
    copy_seconds, copy_spread = _timed(lambda: np.copyto(target, source), repeats)
    return 2.0 * GEMM_SIZE ** 3 / gemm_seconds, gemm_spread, 2.0 * COPY_BYTES / copy_seconds, copy_spread


def wait_idly(comm: Communicator) -> None:
    """Meet the other ranks without spinning on a core (MPICH's blocking calls poll)."""
    request = comm.iallreduce(np.zeros(1, dtype=np.float32))
    while not request.test():
        time.sleep(SLEEP_SECONDS)


def allreduce_seconds(comm: Communicator, nbytes: int = ALLREDUCE_BYTES,
                      repeats: int = 3 * REPEATS) -> tuple[float, float]:
    """Median seconds of an in-place Allreduce of ``nbytes`` over every rank of ``comm``,
    each call after a cache eviction and a barrier, timed to the slowest rank, and their
    relative spread. Collective."""
    evict = CacheEvictor(make_backend("cpu"))
    buffer = np.zeros(nbytes // 4, dtype=np.float32)
    # Over MPI, MPI's Allreduce alone, as the calibration's samples time it: a training
    # job's communicator bounds its waits by polling, a calibration's does not.
    reduce = comm.allreduce_bare if isinstance(comm, MPICommunicator) else comm.allreduce
    reduce(buffer)
    seconds = np.empty(repeats)
    for call in range(repeats):
        evict()
        comm.barrier()
        started = time.perf_counter()
        reduce(buffer)
        seconds[call] = time.perf_counter() - started
    slowest = np.max(comm.allgather_object(seconds.tolist()), axis=0)
    return median_and_spread(slowest.tolist())


def probe_machine_state(comm: Communicator) -> MachineState:
    """Measure the machine's state now (collective; every rank gets rank 0's figures)."""
    rates = core_rates() if comm.rank == 0 else None
    wait_idly(comm)
    gemm, gemm_spread, copy, copy_spread = comm.broadcast_object(rates)
    if comm.size == 1:
        return MachineState(gemm, copy, gemm_spread=gemm_spread, copy_spread=copy_spread)
    seconds, spread = allreduce_seconds(comm)
    return MachineState(gemm, copy, comm.size, ALLREDUCE_BYTES, seconds, gemm_spread, copy_spread, spread)
