"""Two-level reductions: sum inside groups of ranks, then among the groups' leaders.

One algorithm serves two strategies. Hierarchical: a group is a node, summed with NCCL
when all its ranks are GPU ranks, and the node leaders sum with MPI. GPU-side, for a job
that mixes CPU and GPU ranks: a group is a GPU rank with the CPU ranks attached to it;
the CPU gradients reach the GPU rank over MPI, the GPU ranks sum with NCCL, and the
result goes back the same way. Each level is MPI or NCCL, chosen per group.

Where every level of every rank is MPI, a bucket's reduction is pipelined: its Reduce, the
leaders' Allreduce and its Bcast are non-blocking collectives, each started once the one
before it completes, inside the tests that backward makes, so that buckets cross the
network while backward computes (:class:`PipelinedRequest`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm.base import Request
from pydtnn_lite.comm.mpi import MPICommunicator, MPIRequest
from pydtnn_lite.comm.staged import HostStagedCommunicator


class Level(Protocol):
    """The collectives of one group of ranks, in place on device arrays."""

    def reduce(self, array: Any, root: int) -> Any: ...

    def allreduce(self, array: Any) -> Any: ...

    def broadcast(self, array: Any, root: int) -> Any: ...


class MPILevel:
    """MPI over one group of ranks; device arrays go through host buffers of ``owner``."""

    def __init__(self, mpi_comm: Any, owner: HostStagedCommunicator) -> None:
        self._mpi, self.owner, self.MPI = mpi_comm, owner, owner.MPI
        self.rank = mpi_comm.Get_rank()

    def reduce(self, array: Any, root: int) -> Any:
        host = self.owner.stage(array)
        if self.rank == root:
            self.owner.wait_for(self._mpi.Ireduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM, root=root),
                                f"Reduce of {array.size} values")
            self.owner.backend.copy_from_host(host, array)
        else:
            self.owner.wait_for(self._mpi.Ireduce(host, None, op=self.MPI.SUM, root=root),
                                f"Reduce of {array.size} values")
        return array

    def allreduce(self, array: Any) -> Any:
        host = self.owner.stage(array)
        self.owner.wait_for(self._mpi.Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM),
                            f"Allreduce of {array.size} values")
        return self.owner.backend.copy_from_host(host, array)

    def broadcast(self, array: Any, root: int) -> Any:
        host = self.owner.stage(array)
        self.owner.wait_for(self._mpi.Ibcast(host, root=root), f"Bcast of {array.size} values")
        return array if self.rank == root else self.owner.backend.copy_from_host(host, array)


class DeferredRequest(Request):
    """A reduction run when waited for. Two-level reductions take several collectives on
    different groups, which must run in the same order on every rank: running each in
    ``wait`` (never in ``test``) keeps that order, the buckets' order."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run, self.done = run, False

    def test(self) -> bool:
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.run()
            self.done = True


class PipelinedRequest(Request):
    """One bucket's two-level reduction over MPI, a collective at a time.

    The ``owner``'s stages start this rank's collectives in turn on the bucket's host copy;
    each returns its mpi4py request. A stage starts once the one before it has completed, and
    never before the ``previous`` bucket's same stage: every rank of a group must start the
    group's collectives in one order, the buckets' order, whichever of them finishes first.
    """

    def __init__(self, owner: TwoLevelCommunicator, host: Any, array: Any, previous: PipelinedRequest | None) -> None:
        self.owner, self.host, self.array, self.stages = owner, host, array, owner.stages
        self.previous = previous  # the bucket started before this one, until it is done
        self.started = 0  # stages started so far
        self.request: Any = None  # the mpi4py request of the last one started
        self.done = False

    def _next_may_start(self) -> bool:
        """Whether the previous bucket lets this one go on once its current stage completes."""
        if self.previous is not None and self.previous.done:
            self.previous = None
        return self.started == len(self.stages) or self.previous is None or self.previous.started > self.started

    def advance(self) -> None:
        """Start this bucket's next collectives as far as they can go now."""
        while not self.done and self._next_may_start() and (self.request is None or self.request.Test()):
            if self.started == len(self.stages):
                self.owner.backend.copy_from_host(self.host, self.array)
                self.done = True
            else:
                self.request = self.stages[self.started](self.host)
                self.started += 1

    @property
    def collectives_started(self) -> int:
        return self.started

    def test(self) -> bool:
        self.advance()
        return self.done

    def wait(self) -> None:
        """Block on the oldest bucket in flight until this one is done, advancing every bucket
        in flight after each completion: the later buckets' stages start meanwhile (a leader's
        next Allreduce crosses the links while this bucket's Bcast runs), where waiting for
        each bucket in turn would leave the links idle between them."""
        owner = self.owner
        while not self.done:
            for bucket in owner.in_flight:  # oldest first: each may let the next one go on
                bucket.advance()
            owner.in_flight = [bucket for bucket in owner.in_flight if not bucket.done]
            if not self.done:
                oldest = owner.in_flight[0]  # its stage started: the buckets before it are done
                owner.complete(MPIRequest(owner, oldest.request, 0, f"stage {oldest.started} of a "
                                          f"two-level reduction of {oldest.host.size} values"))


class TwoLevelCommunicator(HostStagedCommunicator):
    """Sums device arrays inside each rank's group, then among the group leaders, then
    broadcasts the total inside each group. Host values and job control use MPI over all ranks.

    ``leader_of[r]`` is the leader of rank r's group (a leader leads itself);
    ``inner_kind`` and ``outer_kind`` ('mpi' or 'nccl') are this rank's group's level and
    the leaders' level. Where every level of every rank is MPI the buckets are pipelined
    (:class:`PipelinedRequest`); elsewhere each bucket runs when it is waited for.
    """

    def __init__(self, backend: Backend, leader_of: Sequence[int], inner_kind: str, outer_kind: str,
                 name: str, world: MPICommunicator | None = None, timeout: float = 0.0) -> None:
        super().__init__(backend, world, timeout)
        self.name, self.leader_of = name, list(leader_of)
        self.made: list[Any] = []  # the MPI communicators made here, which :meth:`free` releases
        leader = self.leader_of[self.rank]
        is_leader = leader == self.rank
        # The leader is its group's root.
        group = self._kept(self._mpi.Split(color=leader, key=0 if is_leader else 1 + self.rank))
        leaders = self._kept(self._mpi.Split(color=0 if is_leader else self.MPI.UNDEFINED, key=self.rank))
        group = group if group.Get_size() > 1 else None
        leaders = leaders if is_leader and leaders.Get_size() > 1 else None
        # Pipelined on every rank or on none: a leader of either kind takes part in the others' reductions.
        self.reduces_during_backward = bool(self._mpi.allreduce(inner_kind == outer_kind == "mpi", op=self.MPI.LAND))
        self.in_flight: list[PipelinedRequest] = []  # this rank's unfinished buckets, oldest first
        self.stages: list[Callable[[Any], Any]] = []
        if self.reduces_during_backward:
            self.stages = self._pipeline_stages(group, leaders, is_leader)
            # Whole-array sums (not buckets) get communicators of their own: a pipeline starts
            # its collectives when its tests find the stage before done, at moments that differ
            # from rank to rank, and two kinds of collective must not interleave on one communicator.
            group, leaders = (None if comm is None else self._kept(comm.Dup()) for comm in (group, leaders))
        self.inner: Level | None = None if group is None else self._level(inner_kind, group)
        self.outer: Level | None = None if leaders is None else self._level(outer_kind, leaders)

    def _pipeline_stages(self, group: Any, leaders: Any, is_leader: bool) -> list[Callable[[Any], Any]]:
        """This rank's collectives of one bucket, each starting on the bucket's host copy
        (``group`` and ``leaders`` None where this rank has no such level). The group's
        broadcasts run on a communicator of their own, so that each communicator sees its
        collectives in the buckets' order."""
        sum_op, in_place = self.MPI.SUM, self.MPI.IN_PLACE
        stages: list[Callable[[Any], Any]] = []
        if group is not None:
            stages.append((lambda host: group.Ireduce(in_place, host, op=sum_op, root=0)) if is_leader
                          else (lambda host: group.Ireduce(host, None, op=sum_op, root=0)))
        if leaders is not None:
            stages.append(lambda host: leaders.Iallreduce(in_place, host, op=sum_op))
        if group is not None:
            broadcasts = self._kept(group.Dup())
            stages.append(lambda host: broadcasts.Ibcast(host, root=0))
        return stages

    def _kept(self, mpi_comm: Any) -> Any:
        """``mpi_comm``, remembered for :meth:`free` (MPI's null communicator needs no release)."""
        if mpi_comm != self.MPI.COMM_NULL:
            self.made.append(mpi_comm)
        return mpi_comm

    def free(self) -> None:
        """Release the MPI communicators this one made (collective over the job's ranks, its
        buckets done); the job's own communicator stays. MPI holds a few thousand per process."""
        for mpi_comm in self.made:
            mpi_comm.Free()
        self.made.clear()

    def _level(self, kind: str, mpi_comm: Any) -> Level:
        if kind == "nccl":
            from pydtnn_lite.comm.nccl import NCCLLevel

            return NCCLLevel(mpi_comm, self, self.backend.xp)
        return MPILevel(mpi_comm, self)

    def allreduce(self, array: Any) -> Any:
        if self.inner is not None:
            self.inner.reduce(array, 0)
        if self.outer is not None:
            self.outer.allreduce(array)
        if self.inner is not None:
            self.inner.broadcast(array, 0)
        return array

    def iallreduce(self, array: Any) -> Request:
        if not self.reduces_during_backward:
            return DeferredRequest(lambda: self.allreduce(array))
        # Buckets that tests completed leave here; a wait prunes those it completes.
        self.in_flight = [bucket for bucket in self.in_flight if not bucket.done]
        bucket = PipelinedRequest(self, self.stage(array), array, self.in_flight[-1] if self.in_flight else None)
        self.in_flight.append(bucket)
        bucket.advance()
        return bucket

    def describe(self) -> str:
        return f"{super().describe()}, summed in {len(set(self.leader_of))} group(s) then among their leaders"
