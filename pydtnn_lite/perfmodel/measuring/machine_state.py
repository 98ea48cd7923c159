"""The machine-state probe: how fast this machine's cores run right now.

A calibration is a snapshot: shared hosts, clock speeds and other jobs move a machine's
speed by tens of percent from one day, or second, to the next. The probe measures three
rates the kernels' times follow: a float32 GEMM (the compute-bound kernels), a copy of an
array larger than the caches (the memory-bound ones) and a small Allreduce over the
job's ranks (communication). ``calibrate`` stores one beside its kernel models, and every
traced run measures its own (``modelling/drift.py`` turns the two into a correction).

GEMM and copy run on every core of each host at once, one thread per core, as a job's
ranks load every core: a core's speed depends on what its neighbours do. Ranks share
out their host's cores; ranks beyond the cores wait without spinning, so that each core
runs one probe thread. :class:`StateWatch` repeats the core probe between a run's traced
steps about once a second. The Allreduce is timed as calibrations time it: every call on
a buffer evicted from the cache, the slowest rank's time.
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.measuring.timing import seconds_together
from pydtnn_lite.perfmodel.modelling.drift import CoreRates, MachineState, ProbedWork
from pydtnn_lite.runtime import usable_cores

GEMM_SIZE = 1024  # n of the n^3 product: ~2 GFLOP, tens of milliseconds on one core
COPY_BYTES = 64 << 20  # beyond the last-level cache of the machines this runs on
ALLREDUCE_BYTES = 1 << 20  # a gradient bucket's order of magnitude, sampled by every calibration
REPEATS = 11  # a shared machine's timings are bimodal at times: the median of many
WATCH_REPEATS = 3  # the probe between a run's steps: short, and repeated about once a second
WATCH_INTERVAL = 1.0  # seconds between probes in a run: a core's slow spells last seconds
SLEEP_SECONDS = 1e-3  # how often a waiting rank looks whether the others are done
IQR_PER_SIGMA = 1.349  # a normal distribution's interquartile range, in standard deviations
MEDIAN_ERROR = 1.2533  # a median's standard error over a mean's, for normal samples


def median_and_spread(seconds: Sequence[float]) -> tuple[float, float]:
    """The median of ``seconds`` and its relative uncertainty: the standard error of a
    median of that many repeats (1.25 sigma / sqrt(n)), sigma taken from the interquartile
    range (IQR / 1.35), which the odd outlier of a shared machine leaves alone."""
    lower, median, upper = statistics.quantiles(seconds, n=4)
    sigma = (upper - lower) / IQR_PER_SIGMA
    return median, MEDIAN_ERROR * sigma / math.sqrt(len(seconds)) / median


def timed_median(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """The median seconds of ``repeats`` calls of ``run`` after a warm-up call, and its spread."""
    run()  # warm-up: page faults, BLAS buffers
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return median_and_spread(seconds)


def _on_threads(job: Callable[[int], tuple[float, float]], threads: int) -> list[tuple[float, float]]:
    """``job(index)`` on ``threads`` threads at once (NumPy releases the GIL in both probes)."""
    results: list[tuple[float, float]] = [(0.0, 0.0)] * threads
    start = threading.Barrier(threads)

    def run(index: int) -> None:
        start.wait()
        results[index] = job(index)

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def core_rates(threads: int, repeats: int = REPEATS) -> list[tuple[float, float, float, float]]:
    """(GEMM FLOP/s, its spread, copy bytes/s, its spread) of each of ``threads`` cores, all
    running one-thread GEMMs at once, then copies at once: medians, since the probe asks
    how fast the cores run now, not how fast they can run."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((GEMM_SIZE, GEMM_SIZE)).astype(np.float32) for _ in range(2))
    products = [np.empty_like(a) for _ in range(threads)]
    sources = [np.ones(COPY_BYTES // 4, dtype=np.float32) for _ in range(threads)]
    targets = [np.empty_like(source) for source in sources]
    with threadpool_limits(1, user_api="blas"):
        gemms = _on_threads(lambda i: timed_median(lambda: np.matmul(a, b, out=products[i]), repeats), threads)
    copies = _on_threads(lambda i: timed_median(lambda: np.copyto(targets[i], sources[i]), repeats), threads)
    return [(2.0 * GEMM_SIZE ** 3 / gemm, gemm_spread, 2.0 * COPY_BYTES / copy, copy_spread)
            for (gemm, gemm_spread), (copy, copy_spread) in zip(gemms, copies, strict=True)]


def cores_of(index: int, ranks: int, cores: int) -> int:
    """The cores the ``index``-th of a host's ``ranks`` probes: its share of the ``cores``
    dealt out in turn, none for ranks beyond them (they time-share cores others probe)."""
    return len(range(index, cores, ranks))


def probe_cores(comm: Communicator, repeats: int = REPEATS) -> CoreRates:
    """Every core's rates, measured at once (collective; every rank gets them all). The
    communicator's host-local rank and count say which of its host's cores a rank probes:
    hosts, not the job's nodes, since an emulated cluster's nodes share one machine's cores."""
    cores = usable_cores()
    threads = cores_of(comm.local_rank, comm.local_size, cores)
    wait_idly(comm)  # every rank done with its step: no rank's update runs on a probed core
    mine = core_rates(threads, repeats) if threads else []
    wait_idly(comm)
    gathered = comm.allgather_object((mine, comm.local_size > cores))
    rates = [rate for rank_rates, _ in gathered for rate in rank_rates]
    return CoreRates(tuple(r[0] for r in rates), tuple(r[2] for r in rates),
                     max(r[1] for r in rates), max(r[3] for r in rates), any(crowded for _, crowded in gathered))


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
        seconds[call] = seconds_together(comm, lambda: reduce(buffer), before=evict)
    slowest = np.max(comm.allgather_object(seconds.tolist()), axis=0)
    return median_and_spread(slowest.tolist())


def allreduce_probe(comm: Communicator) -> tuple[int, int, float, float]:
    """(ranks, bytes, median seconds, spread) of the probe's Allreduce (collective)."""
    seconds, spread = allreduce_seconds(comm)
    return comm.size, ALLREDUCE_BYTES, seconds, spread


def probe_machine_state(comm: Communicator) -> MachineState:
    """Measure the machine's state now, one instant (collective; every rank gets it)."""
    cores = probe_cores(comm)
    return MachineState.over([cores], [allreduce_probe(comm)] if comm.size > 1 else [])


class StateWatch:
    """The machine's state over a run: the full probe as it starts and ends, and the core
    probe between its traced steps, about every :data:`WATCH_INTERVAL` seconds; and where
    it is given ``probe_kernels`` (``kernel_probe.py``, collective), what that measured as
    the run started and as it ended (``kernel_runs``).

    ``traced_steps()`` counts the steps traced so far. Every rank must call
    :meth:`after_step` after the same steps (a probe is collective): the interval in steps
    is agreed once, from the slowest rank's first traced step, so that no rank decides by
    its own clock.
    """

    def __init__(self, comm: Communicator, traced_steps: Callable[[], int],
                 probe_kernels: Callable[[], ProbedWork] | None = None) -> None:
        self.comm, self.traced_steps, self.probe_kernels = comm, traced_steps, probe_kernels
        self.kernel_runs = [probe_kernels()] if probe_kernels is not None else []
        self.instants = [probe_cores(comm)]
        self.allreduce = [allreduce_probe(comm)] if comm.size > 1 else []
        self.every: int | None = None
        self.steps = 0
        self.last = time.perf_counter()

    def after_step(self, step: int, result: object) -> None:
        """The step callback: probe the cores when the interval has passed (traced steps only)."""
        if self.traced_steps() == self.steps:
            self.last = time.perf_counter()
            return
        self.steps = self.traced_steps()
        if self.every is None:
            slowest = max(self.comm.allgather_object(time.perf_counter() - self.last))
            self.every = max(1, round(WATCH_INTERVAL / max(slowest, 1e-3)))
        if self.steps % self.every == 0:
            self.instants.append(probe_cores(self.comm, WATCH_REPEATS))
        self.last = time.perf_counter()

    def state(self) -> MachineState:
        """The run's state, after a last full probe and kernel probe (collective)."""
        self.instants.append(probe_cores(self.comm))
        if self.comm.size > 1:
            self.allreduce.append(allreduce_probe(self.comm))
        if self.probe_kernels is not None:
            self.kernel_runs.append(self.probe_kernels())
        return MachineState.over(self.instants, self.allreduce)
