"""Two-level reductions: sum inside groups of ranks, then among the groups' leaders.

One algorithm serves two strategies. Hierarchical: a group is a node, summed with NCCL
when all its ranks are GPU ranks, and the node leaders sum with MPI. GPU-side, for a job
that mixes CPU and GPU ranks: a group is a GPU rank with the CPU ranks attached to it;
the CPU gradients reach the GPU rank over MPI, the GPU ranks sum with NCCL, and the
result goes back the same way. Each level is MPI or NCCL, chosen per group.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm.base import Request
from pydtnn_lite.comm.mpi import MPICommunicator
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


class TwoLevelCommunicator(HostStagedCommunicator):
    """Sums device arrays inside each rank's group, then among the group leaders, then
    broadcasts the total inside each group. Host values and job control use MPI over all ranks.

    ``leader_of[r]`` is the leader of rank r's group (a leader leads itself);
    ``inner_kind`` and ``outer_kind`` ('mpi' or 'nccl') are this rank's group's level and
    the leaders' level.
    """

    def __init__(self, backend: Backend, leader_of: Sequence[int], inner_kind: str, outer_kind: str,
                 name: str, world: MPICommunicator | None = None, timeout: float = 0.0) -> None:
        super().__init__(backend, world, timeout)
        self.name, self.leader_of = name, list(leader_of)
        leader = self.leader_of[self.rank]
        is_leader = leader == self.rank
        group = self._mpi.Split(color=leader, key=0 if is_leader else 1 + self.rank)  # the leader is the group's root
        leaders = self._mpi.Split(color=0 if is_leader else self.MPI.UNDEFINED, key=self.rank)
        self.inner: Level | None = self._level(inner_kind, group) if group.Get_size() > 1 else None
        self.outer: Level | None = None
        if is_leader and leaders.Get_size() > 1:
            self.outer = self._level(outer_kind, leaders)

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
        return DeferredRequest(lambda: self.allreduce(array))

    def describe(self) -> str:
        return f"{super().describe()}, summed in {len(set(self.leader_of))} group(s) then among their leaders"
