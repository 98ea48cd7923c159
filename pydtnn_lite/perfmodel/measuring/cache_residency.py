"""A bucket's Allreduce and each optimizer's update timed with their data in the cache and after an eviction.

The calibration's Allreduce samples and update samples are evicted calls, as a network
larger than the last-level cache makes them; a small network's step leaves the data in
the cache, where the same calls take as little as 0.45-0.7 of the time (the Xeon with
300 MiB of L3, 2026-12-02). Per gradient size, every rank of the node times each kernel
both ways at once (the cache is shared), each mode's calls in a block of their own: a
resident call right after an evicted one would find the rest of its data (the update's
weights and state, MPICH's buffers) evicted. Each kernel is also timed as resident after
the rank spun for a while since its data's last use (``IDLE_WAITS``): a step's other
work takes time, and on a shared host other tenants' traffic evicts the data meanwhile.
An evicted update follows an update of a few elements of other arrays, as a step's updates
follow each other and as the calibration samples them: the first call after an eviction
also finds the interpreter's and the kernel's own code and data gone, 85-90 us beyond an
update's evicted time on the Xeon with 260 MiB of L3, a cost a step pays once
(``KernelCost.cold_start``), not at every update. An evicted Allreduce comes right after
the eviction, as the calibration's Allreduce samples, whose times its ratios scale, do.
The result is a :class:`~pydtnn_lite.perfmodel.modelling.cache_residency.CacheResidency`.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.costs import ALLREDUCE
from pydtnn_lite.optim import SGD, Adam
from pydtnn_lite.perfmodel.measuring.sampling import median_of_slowest, rounded
from pydtnn_lite.perfmodel.measuring.timing import seconds_together
from pydtnn_lite.perfmodel.modelling.cache_residency import CacheResidency

if TYPE_CHECKING:
    from pydtnn_lite.comm.mpi import MPICommunicator

MIB = 1 << 20
SIZES = tuple((MIB // 4) << i for i in range(9))  # 256 KiB .. 64 MiB of gradient, every octave
QUICK_SIZES = (MIB,)
CALLS, ROUNDS = 12, 3  # timed calls per size, kernel, mode and round; rounds alternating the modes
RESIDENT, EVICTED = "resident", "evicted"
IDLE_WAITS = (0.002, 0.008, 0.032)  # seconds from a resident call's last use of its data to the call: a bucket's
# backward is a few milliseconds, a small network's step (whose update comes a step after the last) 10-100
LEARNING_RATE = 1e-6  # on arrays of zeros: the updates leave them zeros (no overflow, no denormals)
WARM_UP_COUNT = 16  # elements of the update that warms an evicted update's code path: a few cache lines


def _calls(comm: MPICommunicator, count: int) -> tuple[dict[str, Callable[[], object]], Callable[[], object]]:
    """The kernels timed on a gradient of ``count`` float32, by name (the Allreduce of the
    gradient and each optimizer's update of the parameters it belongs to), and the write of
    the gradient that backward makes just before them."""
    param, grad, first, second = (np.zeros(count, dtype=np.float32) for _ in range(4))
    runs: dict[str, Callable[[], object]] = {
        ALLREDUCE: lambda: comm.allreduce_bare(grad),
        SGD.kernel: lambda: kernels.sgd_update(param, grad, first, LEARNING_RATE, 0.9, 0.0, False),
        Adam.kernel: lambda: kernels.adam_update(param, grad, first, second, LEARNING_RATE, 0.9, 0.999, 1e-8, 1,
                                                 0.0)}
    return runs, lambda: grad.fill(0.0)


def _spin(seconds: float) -> None:
    """Keep the core busy for ``seconds`` without touching memory, as a rank computing elsewhere."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _idle(wait: float) -> str:
    return f"idle {wait}"


def _rank_seconds(comm: MPICommunicator, count: int, evict: Callable[[], None], calls: int, rounds: int,
                  waits: Sequence[float]) -> dict[tuple[str, str], list[float]]:
    """This rank's seconds of every call of each (kernel, mode) on a gradient of ``count`` float32."""
    runs, written = _calls(comm, count)
    warm_ups, _ = _calls(comm, WARM_UP_COUNT)
    for run in (*runs.values(), *warm_ups.values()):
        run()  # compiles the updates' loops, maps MPICH's buffers

    def written_then(wait: float) -> Callable[[], None]:
        def write_and_wait() -> None:
            written()
            _spin(wait)
        return write_and_wait

    def evicted_before(kernel: str) -> Callable[[], None]:
        if kernel == ALLREDUCE:
            return evict

        def evict_then_warm_up() -> None:
            evict()
            warm_ups[kernel]()
        return evict_then_warm_up

    prepare = {RESIDENT: written, **{_idle(wait): written_then(wait) for wait in waits}}
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for mode in (*prepare, EVICTED):
            for kernel, run in runs.items():
                before = evicted_before(kernel) if mode == EVICTED else prepare[mode]
                seconds.setdefault((kernel, mode), []).extend(
                    seconds_together(comm, run, before=before) for _ in range(calls))
    return seconds


def measure_cache_residency(comm: MPICommunicator, evict: Callable[[], None], sizes: Sequence[int] = SIZES,
                            calls: int = CALLS, rounds: int = ROUNDS,
                            waits: Sequence[float] = IDLE_WAITS) -> CacheResidency:
    """Time every kernel of :func:`_calls` resident, resident after each of ``waits``
    seconds and evicted (by ``evict``) on gradients of ``sizes`` bytes (collective; every
    rank gets the record). An Allreduce lasts until its slowest rank is done: the median
    over calls of the slowest rank's seconds; an update is each rank's own: the median
    over ranks of each rank's median."""
    by_mode: dict[str, dict[str, list[float]]] = {}
    for nbytes in sizes:
        per_rank = comm.allgather_object(_rank_seconds(comm, max(nbytes // 4, 1), evict, calls, rounds, waits))
        for kernel, mode in per_rank[0]:
            columns = [rank[(kernel, mode)] for rank in per_rank]
            median = (median_of_slowest(columns) if kernel == ALLREDUCE
                      else statistics.median(statistics.median(column) for column in columns))
            by_mode.setdefault(mode, {}).setdefault(kernel, []).append(rounded(median))
    idle = ({kernel: [by_mode[_idle(wait)][kernel] for wait in waits] for kernel in by_mode[RESIDENT]}
            if waits else {})
    return CacheResidency(comm.size, tuple(int(n) for n in sizes), by_mode[RESIDENT], by_mode[EVICTED],
                          tuple(waits), idle, warm_evicted_updates=True)
