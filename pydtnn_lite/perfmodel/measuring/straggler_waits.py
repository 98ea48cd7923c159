"""The wait for the slowest rank where the job's ranks time-share the cores.

The calibration fits the ranks' wait for the slowest on its own ranks, a rank per core
(``modelling/synchronization.py``). Ranks that share the cores wander far more: the
operating system hands each core to one rank after another, and which rank runs late
changes with every stretch. Under an emulated cluster of 2 nodes x 2 ranks on 2 cores
the ranks of a training step waited 11-28 ms a step for the slowest, where the
calibration's ranks explain none. So a job placed as it will run (``calibrate
--allreduce-only`` under the emulator) also times these waits: every rank runs the same
number of GEMMs on its BLAS threads, stretches of :data:`SEGMENTS` seconds, and meets the others
as the trainer waits for a collective, polling without spinning on a core. A sample is
the stretch's mean seconds over the ranks and their mean wait beyond the slowest rank's
own, which is the meeting's latency, not a wait for anyone (about 2.5 ms between the
emulated nodes).
"""
from __future__ import annotations

import math
import statistics
import time

from pydtnn_lite.comm import Communicator
from pydtnn_lite.perfmodel.measuring.machine_state import wait_idly
from pydtnn_lite.perfmodel.measuring.transfer_cost import gemm_kernel

# Stretches of work between two meetings, as a step's between its synchronisations: a
# ResNet's layers between batch-norm reductions up to a VGG's whole step.
SEGMENTS = (0.05, 0.1, 0.2, 0.4, 0.8)
REPEATS = 3  # the waits vary several-fold from one stretch to the next: the fit takes their trend
TIMED_KERNELS = 20


def time_straggler_waits(comm: Communicator, segments: tuple[float, ...] = SEGMENTS,
                         repeats: int = REPEATS) -> list[tuple[float, float]]:
    """(seconds of work, mean seconds waited for the slowest) of ``repeats`` stretches of
    each length in ``segments``, on all of ``comm``'s ranks at once, placed as they run;
    collective, every rank gets the samples."""
    kernel = gemm_kernel()
    wait_idly(comm)
    started = time.perf_counter()
    for _ in range(TIMED_KERNELS):
        kernel()
    # Every rank runs as many kernels: the same work, as a data-parallel step's.
    kernel_seconds = max(comm.allgather_object((time.perf_counter() - started) / TIMED_KERNELS))
    mine = []
    for segment in segments:
        count = max(1, math.ceil(segment / kernel_seconds))
        for _ in range(repeats):
            wait_idly(comm)
            started = time.perf_counter()
            for _ in range(count):
                kernel()
            arrived = time.perf_counter()
            wait_idly(comm)
            mine.append((arrived - started, time.perf_counter() - arrived))
    samples = []
    for per_rank in zip(*comm.allgather_object(mine), strict=True):
        works, waits = zip(*per_rank, strict=True)
        samples.append((statistics.fmean(works), statistics.fmean(waits) - min(waits)))
    return samples
