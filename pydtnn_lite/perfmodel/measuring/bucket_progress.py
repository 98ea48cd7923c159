"""A gradient bucket's reduction beside kernels, with and without blocking reductions after them, on one node.

The patterns of an overlapped backward, on every rank at once: a bucket posted, a few
one-thread GEMMs with a test of the bucket after each, then its wait; optionally a small
blocking Allreduce (a batch-norm layer's statistics) after every kernel. Against the
bucket's blocking Allreduce after one kernel, they give the
:class:`~pydtnn_lite.perfmodel.modelling.bucket_progress.BucketProgress` that
``calibrate`` records, and ``benchmarks/bucket_progress.py``'s table.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pydtnn_lite.comm.gradients import MIB
from pydtnn_lite.perfmodel.measuring.sampling import median_of_slowest, rounded
from pydtnn_lite.perfmodel.modelling.bucket_progress import BucketProgress

if TYPE_CHECKING:
    from pydtnn_lite.comm.mpi import MPICommunicator

SIZES = (MIB, 4 * MIB, 16 * MIB)  # the trainer's buckets are 4 MiB, its first 1 MiB by default
KERNELS, GEMM_SIZE, REPEATS = 6, 256, 15
STATISTICS_VALUES = 64  # a batch-norm layer's sums, as float64
Kernel = Callable[[], object]


def gemm_kernel(size: int = GEMM_SIZE) -> Kernel:
    """A kernel of backward: a product of two ``size``-square float32 matrices (run once here)."""
    matrix = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)

    def kernel() -> None:
        matrix @ matrix

    kernel()
    return kernel


def _adding_seconds(call: Callable[[], object], seconds: list[float]) -> object:
    """``call()``, its seconds added to ``seconds[0]``."""
    started = time.perf_counter()
    result = call()
    seconds[0] += time.perf_counter() - started
    return result


def overlapped(comm: MPICommunicator, bucket: np.ndarray, kernel: Kernel, kernels: int,
               with_statistics: bool) -> tuple[float, float]:
    """(seconds in the bucket's post, tests and wait; seconds in the small reductions) of one
    reduction of ``bucket`` beside ``kernels`` runs of ``kernel``, a small blocking Allreduce
    after each where ``with_statistics``; collective."""
    values = np.ones(STATISTICS_VALUES)
    in_bucket, in_statistics = [0.0], [0.0]
    started = time.perf_counter()
    request = comm.iallreduce_buffer(bucket)
    in_bucket[0] += time.perf_counter() - started
    done = _adding_seconds(request.test, in_bucket)
    for _ in range(kernels):  # a fixed count: every rank makes the same small reductions
        kernel()
        if with_statistics:
            _adding_seconds(lambda: comm.allreduce_buffer(values), in_statistics)
        if not done:
            done = _adding_seconds(request.test, in_bucket)
    _adding_seconds(request.wait, in_bucket)
    return in_bucket[0], in_statistics[0]


def blocking(comm: MPICommunicator, buffer: np.ndarray, kernel: Kernel) -> float:
    """Seconds of one blocking Allreduce of ``buffer`` after a kernel; collective."""
    kernel()
    started = time.perf_counter()
    comm.allreduce_buffer(buffer)
    return time.perf_counter() - started


def measure_bucket_progress(comm: MPICommunicator, evict: Callable[[], None], sizes: Sequence[int] = SIZES,
                            kernels: int = KERNELS, repeats: int = REPEATS) -> BucketProgress:
    """Time buckets of ``sizes`` bytes blocking and beside ``kernels`` GEMMs with the small
    reductions, alternating, each after ``evict()`` and a barrier (collective; every rank
    gets the record). A reduction lasts until its slowest rank is done: each figure is the
    median over the repeats of the slowest rank's seconds.

    Evicted, as the calibration's Allreduce samples are, on which a prediction's bucket
    times rest: a backward streams its layers' data through the cache between a bucket's
    tests. On the EPYC without AVX-512 (2026-12-02) the own calls took 0.38-0.54 of the
    blocking time so, 0.30-0.36 with the data left in the cache, and 0.45-0.58 in traced
    ResNet50 and DenseNet121 steps."""
    kernel = gemm_kernel()
    blocking_seconds, own_seconds = [], []
    for nbytes in sizes:
        bucket = np.ones(max(int(nbytes) // 4, 1), dtype=np.float32)
        alone, own = [], []
        for repeat in range(repeats + 1):  # the first warms MPICH's buffers
            evict()
            comm.barrier()
            once = blocking(comm, bucket, kernel)
            evict()
            comm.barrier()
            beside = overlapped(comm, bucket, kernel, kernels, True)[0]
            if repeat:
                alone.append(once)
                own.append(beside)
        per_rank = comm.allgather_object((alone, own))
        blocking_seconds.append(rounded(median_of_slowest([a for a, _ in per_rank])))
        own_seconds.append(rounded(median_of_slowest([o for _, o in per_rank])))
    return BucketProgress(comm.size, tuple(int(n) for n in sizes), tuple(blocking_seconds), tuple(own_seconds))
