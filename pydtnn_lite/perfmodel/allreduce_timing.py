"""Allreduce samples: how long an in-place SUM Allreduce of n bytes takes on P ranks.

The samples are stored raw in the calibration file; fitting a latency/bandwidth model to
them is the prediction side's job. Timed through mpi4py's buffer interface on float32
host arrays, as the trainer's gradient buckets are.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

KIB, MIB = 1 << 10, 1 << 20
FULL_SIZES = tuple(KIB << i for i in range(19))  # 1 KiB .. 256 MiB, every power of two
QUICK_SIZES = tuple(KIB << i for i in range(0, 13, 2))  # 1 KiB .. 4 MiB, every power of four
SECONDS_PER_SIZE = 0.25  # timed calls per size: as many as fit in this, within the limits below
MIN_CALLS, MAX_CALLS = 3, 50


def rank_counts(size: int) -> list[int]:
    """The numbers of ranks to time: every power of two from 2 up to ``size``, and ``size``."""
    return sorted({1 << i for i in range(1, size.bit_length())} | {size}) if size > 1 else []


def time_allreduce(comm: Any, nbytes: int) -> float:
    """Median seconds of an in-place Allreduce of ``nbytes`` on ``comm`` (every rank of it
    calls this). Each call starts after a barrier and lasts until the slowest rank is done."""
    from mpi4py import MPI

    buffer = np.zeros(max(nbytes // 4, 1), dtype=np.float32)  # zeros stay zeros: no overflow, no denormals
    started = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, buffer)  # warm-up, and a first guess of the time per call
    first = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    calls = int(np.clip(SECONDS_PER_SIZE / max(first, 1e-9), MIN_CALLS, MAX_CALLS))
    seconds = np.empty(calls)
    for call in range(calls):
        comm.Barrier()
        started = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buffer)
        seconds[call] = time.perf_counter() - started
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return float(np.median(seconds))


def allreduce_samples(comm: Any, sizes: Sequence[int]) -> list[tuple[int, int, float]]:
    """(ranks, bytes, seconds) for each of :func:`rank_counts` and each message size, on the
    first ranks of ``comm`` (an mpi4py communicator). Collective; every rank gets the list."""
    from mpi4py import MPI

    samples = []
    for ranks in rank_counts(comm.Get_size()):
        member = comm.Get_rank() < ranks
        sub = comm.Split(0 if member else MPI.UNDEFINED, comm.Get_rank())
        if member:
            samples += [(ranks, nbytes, time_allreduce(sub, nbytes)) for nbytes in sizes]
            sub.Free()
        comm.Barrier()
    return comm.bcast(samples, root=0)
