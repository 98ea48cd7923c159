"""The wait for the slowest rank where the ranks time-share the cores.

With a core each, ranks that do the same work meet within a few percent of it (the
calibration's probes measure that wait, ``synchronization.py``). Ranks that share cores
meet much further apart: the scheduler hands the cores out unevenly over a step, and a
rank that arrives first sleeps in its wait (as the communicator waits when ranks
outnumber cores) while the others finish on the freed cores. Four ranks on two cores
waited 30-40 ms at the end of a 450 ms VGG11 step, where the 2-rank fit says 11.

So each child job of :mod:`process_counts` also has its ranks do equal stretches of
one-thread GEMM work of a few lengths, each followed by a one-value reduction waited on
as the trainer waits, and records the ranks' mean wait after each length of stretch.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from pydtnn_lite.comm import Communicator

SEGMENTS = (0.03, 0.1, 0.3)  # seconds of time-shared work between two meetings: a few layers .. a step
MEETINGS = 8  # after each length, besides a first one that is not kept: the waits have a long tail
MATRIX = 128  # a GEMM this size takes tens of microseconds: segments are whole numbers of them


def shared_waits(comm: Communicator, segments: Sequence[float] = SEGMENTS,
                 meetings: int = MEETINGS) -> list[tuple[float, float]]:
    """(seconds of work, seconds waited) for each of ``segments``: the means over the
    meetings after that length of work and over the ranks (collective; every rank gets
    the samples).

    Means, not medians: most meetings find the ranks a few percent apart and a few find
    one far behind, and a step pays the mean. Every rank does the same number of GEMMs,
    set by rank 0's timing of them in this job, so that a wait measures the ranks'
    uneven progress, not uneven work."""
    matrix = np.random.default_rng(0).random((MATRIX, MATRIX), dtype=np.float32)
    began = time.perf_counter()
    for _ in range(100):
        matrix @ matrix
    seconds_per_call = comm.broadcast_object((time.perf_counter() - began) / 100)
    mine: list[list[tuple[float, float]]] = []
    value = np.zeros(1)
    for segment in segments:
        calls = max(1, round(segment / seconds_per_call))
        mine.append([])
        for meeting in range(meetings + 1):
            began = time.perf_counter()
            for _ in range(calls):
                matrix @ matrix
            arrived = time.perf_counter()
            comm.iallreduce(value).wait()
            if meeting:
                mine[-1].append((arrived - began, time.perf_counter() - arrived))
    per_rank = comm.allgather_object(mine)
    return [(float(np.mean([work for rank in ranks for work, _ in rank])),
             float(np.mean([wait for rank in ranks for _, wait in rank])))
            for ranks in zip(*per_rank, strict=True)]
