"""Gradient synchronisation: bucketed Allreduce of the flat gradient, overlapped with backward.

Buckets are contiguous slices of the network's flat gradient (no packing), filled in
reverse layer order, the order backward produces them, and identical on every rank
because they depend only on the model. The first bucket is kept small so communication
starts after the first layers' backward. With overlap on, a bucket's non-blocking
Allreduce starts as soon as its last layer is done, and while any is outstanding every
kernel call tests them: MPICH makes no progress in the background (over TCP a bucket
begins to move only inside an MPI call), so these tests are what moves the data while
backward computes, and a test only at layer boundaries leaves a network link idle through
a long layer's backward. Each outstanding bucket is tested: MPICH advances every started
collective by a step per pass of its progress engine, so testing only the oldest moves
less (docs/performance.md, "How many tests a kernel call makes"). The tests wrap the
kernel entries from outside (``kernels.instrument``) only while buckets are outstanding,
outside a tracer's timing.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.comm.base import Communicator, Request
from pydtnn_lite.network import Network

MIB = 1 << 20
FIRST_BUCKET_MB = 1.0  # the first bucket's default limit: small, so that communication starts early


@dataclass(frozen=True)
class Bucket:
    """A slice [start, stop) of the flat gradient, ready once layer ``first_layer`` is done."""

    start: int
    stop: int
    first_layer: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan_buckets(network: Network, bucket_bytes: float, first_bucket_bytes: float | None = None) -> list[Bucket]:
    """Cut the flat gradient, last layer first, into buckets of at most ``bucket_bytes``
    (the first at most ``first_bucket_bytes``, by default the smaller of
    :data:`FIRST_BUCKET_MB` MiB and ``bucket_bytes``); a layer larger than a bucket spans several."""
    if first_bucket_bytes is None:
        first_bucket_bytes = min(FIRST_BUCKET_MB * MIB, bucket_bytes)
    itemsize = np.dtype(network.backend.dtype).itemsize
    buckets: list[Bucket] = []
    top = None  # upper end of the bucket being filled
    for segment in reversed(network.segments):
        low = segment.stop
        while low > segment.start:
            top = low if top is None else top
            capacity = max(1, int((first_bucket_bytes if not buckets else bucket_bytes) // itemsize))
            low = max(segment.start, top - capacity)
            if top - low == capacity:
                buckets.append(Bucket(low, top, segment.layer))
                top = None
    if top is not None:
        first = network.segments[0]
        buckets.append(Bucket(first.start, top, first.layer))
    return buckets


class GradientSynchronizer:
    """Sums the flat gradient over all ranks during (overlap) or after (blocking) backward.

    Use ``layer_done`` as the network's backward callback, then ``finish`` before the
    update. ``exposed_seconds`` is the time the last ``finish`` spent waiting, and
    ``kernel_test_seconds`` the time the tests after kernel calls have taken, all steps
    together.
    """

    def __init__(self, network: Network, comm: Communicator, bucket_mb: float = 4.0,
                 first_bucket_mb: float | None = None, overlap: bool = True) -> None:
        self.network, self.comm, self.overlap = network, comm, overlap
        first_bucket_bytes = None if first_bucket_mb is None else first_bucket_mb * MIB
        self.buckets = plan_buckets(network, bucket_mb * MIB, first_bucket_bytes) if network.segments else []
        self.pending: list[Request] = []
        self.next_bucket = 0
        self.exposed_seconds = 0.0
        self.kernel_test_seconds = 0.0
        self._plain_kernels: Callable[[], None] | None = None  # restores the entries while tests wrap them

    @property
    def active(self) -> bool:
        return self.comm.size > 1

    def layer_done(self, layer_index: int) -> None:
        """Backward of ``layer_index`` is complete: start every bucket it completes, drive the rest."""
        if not (self.active and self.overlap):
            return
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].first_layer >= layer_index:
            bucket = self.buckets[self.next_bucket]
            self.pending.append(self.comm.iallreduce(self.network.flat_grads[bucket.start:bucket.stop]))
            self.next_bucket += 1
        self._test_pending()
        if self.pending and self._plain_kernels is None:
            self._plain_kernels = kernels.instrument(self._testing_after)

    def _test_pending(self) -> None:
        self.pending = [request for request in self.pending if not request.test()]

    def _testing_after(self, name: str, kernel: Callable) -> Callable:
        """``kernel``, then a test of the outstanding buckets."""
        def run(*args: Any, **kwargs: Any) -> Any:
            result = kernel(*args, **kwargs)
            if self.pending:
                started = time.perf_counter()
                self._test_pending()
                self.kernel_test_seconds += time.perf_counter() - started
            return result
        return run

    def finish(self) -> None:
        """Complete the reduction of every bucket: wait for those backward started, then reduce
        the rest (all of them without overlap, or in a step that accumulates micro-batches,
        whose backward starts none) one at a time. MPICH runs reductions posted together
        slower than one after another: ten of 4 MiB took 31.5-33.0 ms posted at once and
        16.8-17.2 ms in turn (2 ranks on one node, 2026-12-06)."""
        started = time.perf_counter()
        if self.active:
            if self._plain_kernels is not None:
                self._plain_kernels()
                self._plain_kernels = None
            for request in self.pending:
                request.wait()
            for bucket in self.buckets[self.next_bucket:]:
                self.comm.allreduce(self.network.flat_grads[bucket.start:bucket.stop])
        self.pending, self.next_bucket = [], 0
        self.exposed_seconds = time.perf_counter() - started

    def describe(self) -> str:
        sizes = [b.size * np.dtype(self.network.backend.dtype).itemsize / MIB for b in self.buckets]
        mode = "overlapped with backward" if self.overlap else "after backward"
        return (f"{len(self.buckets)} buckets ({min(sizes, default=0):.2f}-{max(sizes, default=0):.2f} MiB), "
                f"{mode}")


def make_gradient_synchronizer(network: Network, comm: Communicator, bucket_mb: float,
                               overlap: bool, first_bucket_mb: float | None = None) -> GradientSynchronizer:
    """A synchronizer whose first bucket is at most ``first_bucket_mb``, by default the
    smaller of :data:`FIRST_BUCKET_MB` and ``bucket_mb``."""
    return GradientSynchronizer(network, comm, bucket_mb, first_bucket_mb, overlap)
