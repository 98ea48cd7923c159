"""What moving gradient buckets over a network costs a rank that computes meanwhile.

Over MPI on TCP a bucket's data moves inside the MPI calls the trainer makes between its
kernels (the socket copies, the sum of the received share) and in the network stack's
interrupts, which land on the cores that run the kernels: over an emulated 1 Gbit/s link
VGG11's backward runs about 30 ms longer with its 35 MiB gradient moving beside it. And
between two calls the link moves no more than the sockets hold. Both are measured in an
overlapped backward's pattern, on every rank at once: kernels (one-thread GEMMs) with a
test of the outstanding buckets after each, while :data:`BUCKETS` buckets of
:data:`BUCKET_BYTES` reduce over all the ranks.

- Posting: the seconds of the call that starts a bucket's reduction (MPICH over TCP
  writes the bucket's first share into the socket inside it) and, apart, of the test the
  trainer makes right after it (which takes in what the peers have sent of the bucket and
  sums it), each bucket posted alone onto an idle link, as backward posts its buckets one
  at a time: for a 4 MiB bucket 0.6 ms together over 1 and 2 Gbit/s here, about the call
  alone, and 1.5 over 5, where the call alone took 0.8 and training's tests right after a
  post 0.3-0.5 (the faster the link, the more of the peer's share the test finds). Six
  posted back to back averaged 0.2-0.4 ms, five of them finding the sockets full.
- Starting: through the hierarchical pipeline, the seconds of the later tests that start
  a bucket's next collective (its Allreduce between the nodes, then its Bcast), timed
  with the posts: about a millisecond each, as a post, wherever the bytes then move.
- CPU: kernels of a few milliseconds, against the same kernels alone just before; the
  difference, less the posting and starting, per byte of the buckets; and the share of
  it spent inside the tests (the rest is the kernels' own slowing by the network stack's
  interrupts).
- Window: kernels of :data:`LONG_KERNEL_SECONDS`, longer than the link needs for what the
  sockets hold; the bucket bytes over the tests it took.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pydtnn_lite.comm.gradients import MIB
from pydtnn_lite.perfmodel.modelling.channel import TransferCost

if TYPE_CHECKING:
    from pydtnn_lite.comm.base import Communicator

BUCKET_BYTES = 4 * MIB  # the trainer's default bucket
BUCKETS = 6
# The buckets are views into one flat gradient, past its start, as the trainer's are (a
# ResNet18's lie 312 bytes into a page, its first 16 bytes in). Over an emulated 5 Gbit/s
# link a bucket 16 or 20 bytes into its page took 1.3-1.4 ms to post on average, one 32,
# 312 or 1592 bytes in 0.93-0.95, as training's posts did (0.8-1.0; 2026-12-08).
BUCKET_OFFSET = 78  # float32 values before the first bucket: 312 bytes
GEMM_SIZE = 512  # a GEMM of 0.27 GFLOP: a few milliseconds on one core, as a backward kernel
ALONE_KERNELS = 24
ROUNDS = 5  # the cores' speed wanders by 10-15 % for seconds at a time: the median of several rounds
LONG_KERNEL_SECONDS = 0.05  # twice a VGG11 backward's longest kernels here: ~6 MB at 1 Gbit/s
WINDOW_ROUNDS = 3


def gemm_kernel() -> Callable[[], object]:
    """A backward kernel's stand-in: a GEMM of :data:`GEMM_SIZE`, a few milliseconds."""
    matrix = np.random.default_rng(0).standard_normal((GEMM_SIZE, GEMM_SIZE)).astype(np.float32)
    return lambda: matrix @ matrix


@dataclass(frozen=True)
class Overlapped:
    """A reduction run beside kernels: the kernels run, the seconds taken, and the seconds
    of them posting the buckets, testing them right after, starting their later
    collectives (the tests that start one: the hierarchical pipeline's) and testing them
    otherwise."""

    kernels: int
    seconds: float
    posting: float
    post_testing: float
    starting: float
    testing: float


def overlapped_kernels(comm: Communicator, kernel: Callable[[], object], buckets: list[np.ndarray]) -> Overlapped:
    """Reduce ``buckets`` over ``comm`` while running ``kernel`` with a test of the outstanding
    buckets after each, until all are done; collective."""
    comm.barrier()
    started = time.perf_counter()
    pending = [comm.iallreduce(bucket) for bucket in buckets]
    posted = time.perf_counter()
    pending = [request for request in pending if not request.test()]  # as the trainer tests right after posting
    posting, post_testing = posted - started, time.perf_counter() - posted
    kernels, testing, starting = 0, 0.0, 0.0
    while pending:
        kernel()
        kernels += 1
        collectives = sum(request.collectives_started for request in pending)
        tested = time.perf_counter()
        unfinished = [request for request in pending if not request.test()]
        seconds = time.perf_counter() - tested
        if sum(request.collectives_started for request in pending) > collectives:
            starting += seconds
        else:
            testing += seconds
        pending = unfinished
    return Overlapped(kernels, time.perf_counter() - started, posting, post_testing, starting, testing)


def transfer_round(comm: Communicator, kernel: Callable[[], object],
                   buckets: list[np.ndarray]) -> tuple[float, float]:
    """Seconds per bucket byte that a reduction of ``buckets`` over ``comm``, tested after
    every ``kernel``, adds to this rank's kernels besides posting them, and of them the
    seconds per byte inside the tests (the tests that start a bucket's next collective left
    to :func:`lone_post_round`); collective."""
    started = time.perf_counter()
    for _ in range(ALONE_KERNELS):
        kernel()
    alone = (time.perf_counter() - started) / ALONE_KERNELS
    run = overlapped_kernels(comm, kernel, buckets)
    nbytes = sum(bucket.nbytes for bucket in buckets)
    posts = run.posting + run.post_testing + run.starting
    return max(0.0, run.seconds - posts - run.kernels * alone) / nbytes, run.testing / nbytes


def lone_post_round(comm: Communicator, kernel: Callable[[], object],
                    buckets: list[np.ndarray]) -> tuple[float, float, float]:
    """The mean seconds of posting one of ``buckets`` onto an idle link, of testing it right
    after, and of starting its later collectives, each reduced to its end, tested after
    every ``kernel``, before the next is posted; collective."""
    runs = [overlapped_kernels(comm, kernel, [bucket]) for bucket in buckets]
    return (statistics.fmean(run.posting for run in runs), statistics.fmean(run.post_testing for run in runs),
            statistics.fmean(run.starting for run in runs))


def window_round(comm: Communicator, kernel: Callable[[], object], buckets: list[np.ndarray]) -> float:
    """The bucket bytes per test that a reduction of ``buckets`` over ``comm`` moved, tested
    after every ``kernel``; collective."""
    return sum(bucket.nbytes for bucket in buckets) / overlapped_kernels(comm, kernel, buckets).kernels


def measure_transfer(comm: Communicator, rounds: int = ROUNDS) -> TransferCost:
    """The CPU seconds per byte of a bucket that moving it over the job's network costs a
    rank computing beside it, the share of them inside the tests (the medians over ``rounds``,
    the share of the round of the median CPU), the seconds of posting one alone, of the test
    right after and of starting its later collectives (the medians over ``rounds``), and the bucket bytes the
    link moves between two tests (the median over :data:`WINDOW_ROUNDS`), each averaged over
    the ranks (every rank gets them). Collective."""
    kernel = gemm_kernel()
    kernel()
    gradient = np.ones(BUCKET_OFFSET + BUCKETS * BUCKET_BYTES // 4, dtype=np.float32)
    buckets = [gradient[start:start + BUCKET_BYTES // 4]
               for start in range(BUCKET_OFFSET, BUCKET_OFFSET + BUCKETS * BUCKET_BYTES // 4, BUCKET_BYTES // 4)]
    by_cpu = sorted(transfer_round(comm, kernel, buckets) for _ in range(rounds))
    cpu, in_tests = by_cpu[len(by_cpu) // 2]
    share = min(1.0, in_tests / cpu) if cpu > 0 else 1.0
    posts = [lone_post_round(comm, kernel, buckets) for _ in range(rounds)]
    post, post_test, start = (statistics.median(figures) for figures in zip(*posts, strict=True))
    started = time.perf_counter()
    kernel()
    repeats = max(1, math.ceil(LONG_KERNEL_SECONDS / (time.perf_counter() - started)))
    # Every rank runs as many GEMMs per kernel, so that their tests keep in step.
    repeats = max(comm.allgather_object(repeats))

    def long_kernel() -> None:
        for _ in range(repeats):
            kernel()

    window = statistics.median(window_round(comm, long_kernel, buckets) for _ in range(WINDOW_ROUNDS))
    per_rank = comm.allgather_object((cpu, window, post, share, start, post_test))
    return TransferCost(*(statistics.fmean(figures) for figures in zip(*per_rank, strict=True)))
