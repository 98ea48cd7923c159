"""Allreduce samples: how long an in-place SUM Allreduce of n bytes takes on P ranks.

The samples are stored raw in the calibration file; modelling them is the prediction
side's job (``allreduce.py``). Timed with ``MPICommunicator.allreduce_bare`` (mpi4py's
buffer interface, nothing around it) on float32 host arrays, as the trainer's gradient
buckets are, and, as in training, on buffers that are not in the cache: a bucket is
reduced once, after backward has streamed the rest of the step through memory, while a
timing loop that repeats a call on one buffer finds it in the cache and under-estimates a
bucket's time (docs/performance-model.md, 'What is measured'). Each call is preceded by
an untimed cache eviction.

MPICH's time is not a smooth function of the message size (docs/performance-model.md):
the time per byte falls up to a few MiB and rises again as the operands leave the last
level cache. So the full grid samples every quarter octave from 64 KiB up, and the
prediction interpolates between the samples.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor

if TYPE_CHECKING:
    from pydtnn_lite.comm.mpi import MPICommunicator

KIB, MIB = 1 << 10, 1 << 20
Reduction = Callable[[np.ndarray], np.ndarray]  # an in-place sum of a host buffer over a communicator's ranks


def log_spaced_sizes(low: int, high: int, per_octave: int) -> tuple[int, ...]:
    """Sizes from ``low`` to ``high`` bytes, ``per_octave`` per doubling, rounded to whole KiB."""
    octaves = round(np.log2(high / low))
    return tuple(int(round(low * 2 ** (i / per_octave) / KIB)) * KIB for i in range(octaves * per_octave + 1))


# 1 KiB .. 32 KiB every power of two (latency-bound), then every quarter octave to 256 MiB.
FULL_SIZES = tuple(KIB << i for i in range(6)) + log_spaced_sizes(64 * KIB, 256 * MIB, 4)
QUICK_SIZES = tuple(KIB << i for i in range(0, 13, 2))  # 1 KiB .. 4 MiB, every power of four
# Each size is timed in ROUNDS passes over all sizes, alternately ascending and descending,
# so that a slow spell of a shared machine spreads over many sizes instead of a few
# neighbours (which interpolation would then follow).
ROUNDS = 3
SECONDS_PER_SIZE = 0.25  # timed calls per size, all rounds together: as many as fit in this ...
MIN_CALLS, MAX_CALLS = 3, 48  # ... within these limits


def rank_counts(size: int) -> list[int]:
    """The numbers of ranks to time: every power of two from 2 up to ``size``, and ``size``."""
    return sorted({1 << i for i in range(1, size.bit_length())} | {size}) if size > 1 else []


def call_seconds(comm: MPICommunicator, nbytes: int, budget: float, min_calls: int, max_calls: int,
                 evict: Callable[[], None], reduce: Reduction | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of in-place Allreduce calls of ``nbytes`` on ``comm`` (every rank of it calls
    this), or of ``reduce`` in its place: after one untimed warm-up, as many calls as fit
    in ``budget`` seconds, within ``min_calls`` and ``max_calls``. Each call starts after
    ``evict()`` and a barrier and lasts until the slowest rank is done. Returned with the
    CPU seconds each call took on the calling threads (the mean over the ranks): where
    ranks time-share cores, what a reduction takes from the ranks that compute while it
    runs."""
    reduce = reduce or comm.allreduce_bare
    buffer = np.zeros(max(nbytes // 4, 1), dtype=np.float32)  # zeros stay zeros: no overflow, no denormals
    started = time.perf_counter()
    reduce(buffer)  # warm-up (page faults, MPICH's buffers), and a guess of the time
    first = max(comm.allgather_object(time.perf_counter() - started))
    calls = int(np.clip(budget / max(first, 1e-9), min_calls, max_calls))
    seconds, cpu_seconds = np.empty(calls), np.empty(calls)
    for call in range(calls):
        evict()
        comm.barrier()
        started, cpu_started = time.perf_counter(), time.thread_time()
        reduce(buffer)
        seconds[call], cpu_seconds[call] = time.perf_counter() - started, time.thread_time() - cpu_started
    return (np.max(comm.allgather_object(seconds), axis=0), np.mean(comm.allgather_object(cpu_seconds), axis=0))


@dataclass(frozen=True)
class AllreduceTiming:
    """One message size's Allreduce: the median over its calls of the slowest rank's seconds,
    and of the CPU seconds per rank (:func:`call_seconds`)."""

    seconds: float
    cpu_seconds: float


def allreduce_timings(comm: MPICommunicator, sizes: Sequence[int], rounds: int = ROUNDS,
                      reduce: Reduction | None = None) -> list[AllreduceTiming]:
    """The Allreduce (or ``reduce``, :func:`call_seconds`) of each of ``sizes`` bytes on
    ``comm`` (collective), in place, over the calls of ``rounds`` passes over the sizes,
    each call on a buffer evicted from the cache."""
    evict = CacheEvictor(make_backend("cpu"))
    calls: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in sizes}
    budget, min_calls, max_calls = SECONDS_PER_SIZE / rounds, max(1, MIN_CALLS // rounds), max(1, MAX_CALLS // rounds)
    for round_ in range(rounds):
        for nbytes in (sizes if round_ % 2 == 0 else sizes[::-1]):
            calls[nbytes].append(call_seconds(comm, nbytes, budget, min_calls, max_calls, evict, reduce))
    return [AllreduceTiming(float(np.median(np.concatenate([wall for wall, _ in calls[n]]))),
                            float(np.median(np.concatenate([cpu for _, cpu in calls[n]])))) for n in sizes]


def time_allreduce(comm: MPICommunicator, sizes: Sequence[int], rounds: int = ROUNDS,
                   reduce: Reduction | None = None) -> list[float]:
    """Median seconds of an in-place Allreduce (or ``reduce``) of each of ``sizes`` bytes on
    ``comm`` (collective): the :func:`allreduce_timings`' seconds."""
    return [timing.seconds for timing in allreduce_timings(comm, sizes, rounds, reduce)]


def allreduce_samples(comm: MPICommunicator, sizes: Sequence[int]) -> list[tuple[int, float, float]]:
    """(ranks, bytes, seconds) for each of :func:`rank_counts` and each message size, on the
    first ranks of ``comm``. Collective; every rank gets the list."""
    samples: list[tuple[int, float, float]] = []
    for ranks in rank_counts(comm.size):
        sub = comm.split(0 if comm.rank < ranks else None, comm.rank)
        if sub is not None:
            timings = time_allreduce(sub, sizes)
            samples += [(ranks, nbytes, seconds) for nbytes, seconds in zip(sizes, timings, strict=True)]
            sub.free()
        comm.barrier()
    return comm.broadcast_object(samples, root=0)
