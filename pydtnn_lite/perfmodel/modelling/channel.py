"""The link that a step's overlapped bucket reductions share, simulated beside backward.

A bucket's reduction over p ranks runs in 2 ceil(log2 p) phases, as MPICH's
reduce-scatter then allgather (a share moves, is summed, moves on), each taking an equal
part of the bucket's timed Allreduce on the link. The phases share the link first in,
first out. Networks that move data on their own (NCCL, RDMA: the presets) start a phase
as soon as the one before it has arrived. MPI over TCP starts a phase only inside an MPI
call once the bucket's previous phase has arrived (the call that posts the bucket, the
trainer's tests between kernels, a blocking call), and between two calls the link moves
no more than the sockets hold (``TransferCost.window_bytes``): over an emulated link six
4 MiB buckets tested every 50 ms moved 2.8 MiB per test at 1 Gbit/s, 3.4 at 5. While
a test's phase moves, the rank that computes pays ``cpu_per_byte`` for it: inside the
tests (the socket copies, the sums of the received shares), and in its kernels, which the
network stack's interrupts slow. Inside a blocking call the outstanding buckets run their
phases back to back, and their CPU time is the call's own; a two-level reduction
pipelined by the trainer's tests (``pipelined``) starts its collective between the nodes
inside a test only, so a blocking call in the middle of backward completes the link phases
of the buckets whose collective has started and starts none.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TransferCost:
    """What moving a bucket over MPI on a network costs beside the computation: CPU seconds
    per byte of the bucket, the bucket bytes the link moves at most between two MPI
    calls (infinite: no limit), the seconds of the call that posts a bucket's
    reduction (MPICH over TCP starts sending inside it), the share of the CPU seconds
    spent inside the tests themselves (the rest slows the kernels between them; 1 for
    files written before it was measured), the seconds of the tests that start a bucket's
    later collectives (the hierarchical pipeline's: its collective between the nodes,
    then its Bcast; 0 for a reduction of one collective, and in files written before they
    were measured), and the seconds of the trainer's test right after a post (which takes
    in what the peers sent of the bucket meanwhile; 0 in files written before it was
    timed apart, whose ``post_seconds`` holds the post and that test together)."""

    cpu_per_byte: float = 0.0
    window_bytes: float = math.inf
    post_seconds: float = 0.0
    in_tests: float = 1.0
    start_seconds: float = 0.0
    post_test_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"cpu_per_byte": self.cpu_per_byte, "post_seconds": self.post_seconds,
                "window_bytes": None if math.isinf(self.window_bytes) else self.window_bytes,
                "in_tests": self.in_tests, "start_seconds": self.start_seconds,
                "post_test_seconds": self.post_test_seconds}

    @classmethod
    def from_dict(cls, data: dict) -> TransferCost:
        """The record of :meth:`to_dict`; a field it lacks (or holds as null) keeps its default."""
        return cls(float(data.get("cpu_per_byte") or 0.0),
                   math.inf if data.get("window_bytes") is None else float(data["window_bytes"]),
                   float(data.get("post_seconds") or 0.0),
                   1.0 if data.get("in_tests") is None else float(data["in_tests"]),
                   float(data.get("start_seconds") or 0.0),
                   float(data.get("post_test_seconds") or 0.0))


NO_TRANSFER_COST = TransferCost()


def reduction_phases(procs: int) -> int:
    """The phases of a bucket's reduction over ``procs`` ranks: a reduce-scatter and an
    allgather by recursive halving and doubling, ceil(log2 procs) steps each."""
    return 2 * max(1, math.ceil(math.log2(procs)))


@dataclass
class _Phase:
    bucket: int
    seconds_left: float  # on the link
    bytes_per_second: float  # of the bucket, while it moves
    cpu_per_second: float  # for the computing rank (0 inside blocking calls)


class Channel:
    """The link of a step's buckets (``bucket_bytes``, each timed ``bucket_seconds`` as a
    blocking Allreduce over ``procs`` ranks), its time in seconds from backward's start.
    ``inside_calls``: phases start only inside MPI calls (MPI over TCP), at most
    ``cost.window_bytes`` moving between two calls. ``link_seconds`` (default
    ``bucket_seconds``) is the part of each reduction the link carries, shared out over
    its phases; the rest, its exchanges inside the nodes, runs beside the other buckets'
    phases on the link, and only the last bucket's lengthens a blocking call. ``pipelined``:
    the link phases are one collective of a pipeline that the tests start (:meth:`block`)."""

    def __init__(self, bucket_bytes: list[float], bucket_seconds: list[float], procs: int, inside_calls: bool,
                 cost: TransferCost, link_seconds: list[float] | None = None, pipelined: bool = False) -> None:
        on_link = bucket_seconds if link_seconds is None else link_seconds
        self.phases = reduction_phases(procs)
        self.phase_seconds = [seconds / self.phases for seconds in on_link]
        self.off_link = [max(0.0, total - linked) for total, linked in zip(bucket_seconds, on_link, strict=True)]
        self.phase_bytes = [nbytes / self.phases for nbytes in bucket_bytes]
        self.phases_left = [self.phases] * len(bucket_bytes)
        self.inside_calls, self.cost, self.pipelined = inside_calls, cost, pipelined
        self.moving: deque[_Phase] = deque()
        self.time = 0.0  # how far the link is simulated

    def _start(self, bucket: int, cpu: bool) -> None:
        seconds = self.phase_seconds[bucket]
        rate = self.phase_bytes[bucket] / seconds if seconds > 0 else math.inf
        self.moving.append(_Phase(bucket, seconds, rate, rate * self.cost.cpu_per_byte if cpu else 0.0))
        self.phases_left[bucket] -= 1

    def advance(self, now: float) -> float:
        """Move the link on to ``now`` (the next MPI call), within the window; the CPU time
        the rank spent on the tests' phases meanwhile."""
        budget = self.cost.window_bytes if self.inside_calls else math.inf
        cpu = 0.0
        while self.moving and self.time < now and budget > 0:
            phase = self.moving[0]
            seconds = min(phase.seconds_left, now - self.time, budget / phase.bytes_per_second)
            if seconds <= 0.0 < phase.seconds_left:
                break  # a window spent but for a sliver too small to move anything (a subnormal)
            self.time += seconds
            phase.seconds_left -= seconds
            budget -= seconds * phase.bytes_per_second
            cpu += seconds * phase.cpu_per_second
            if phase.seconds_left <= 1e-15:
                self.moving.popleft()
        self.time = max(self.time, now)
        return cpu

    def call(self, ready: int) -> None:
        """An MPI call that does not block, the first ``ready`` buckets posted: where phases
        start inside calls, the next phase of each whose previous one has arrived; else
        every phase of them, one after the other."""
        in_flight = {phase.bucket for phase in self.moving}
        for bucket in range(ready):
            if self.inside_calls:
                if self.phases_left[bucket] and bucket not in in_flight:
                    self._start(bucket, cpu=True)
            else:
                while self.phases_left[bucket]:
                    self._start(bucket, cpu=False)

    def finish(self, now: float, ready: int) -> float:
        """A blocking call at ``now`` that waits for the first ``ready`` buckets: they run their
        phases back to back, behind what the link is moving; when they are done, the last
        of them inside the nodes too."""
        return self._run_out(now, range(ready), inside_nodes=True)

    def block(self, now: float, ready: int) -> float:
        """A blocking call at ``now`` for something else (a batch-norm reduction), which
        queues behind the first ``ready`` buckets: as :meth:`finish`, except that a pipelined
        channel completes only the buckets whose link phases have started, without their
        exchanges inside the nodes (the tests start those stages)."""
        if not self.pipelined:
            return self.finish(now, ready)
        return self._run_out(now, [b for b in range(ready) if self.phases_left[b] < self.phases], inside_nodes=False)

    def _run_out(self, now: float, buckets: Iterable[int], inside_nodes: bool) -> float:
        """When the link has moved what it is moving and every phase left of ``buckets``,
        back to back from ``now``, and (``inside_nodes``) the last one's exchanges inside the nodes."""
        self.advance(now)  # the rank's cores are the call's own from here
        unfinished = [phase.bucket for phase in self.moving]
        done = self.time + sum(phase.seconds_left for phase in self.moving)
        for bucket in buckets:
            if self.phases_left[bucket]:
                unfinished.append(bucket)
                done += self.phases_left[bucket] * self.phase_seconds[bucket]
                self.phases_left[bucket] = 0
        if unfinished and inside_nodes:
            done += self.off_link[max(unfinished)]
        self.moving.clear()
        self.time = done
        return done
