"""NCCL collectives for GPU ranks, through ``cupy.cuda.nccl``.

NCCL reads and writes device memory directly, so gradients never visit the host. Each
collective is queued on a stream of its own: an event recorded on the compute stream
when a bucket is ready orders the collective after the kernels that produced it, and an
event recorded after the collective lets the compute stream (never the host) wait for
the sum. Backward keeps computing while buckets are reduced. The host waits only when a
collective timeout is set, polling the event so that a missing rank is reported instead
of hanging the GPU.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm.base import Request
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.errors import CollectiveTimeout

NCCL_DTYPES = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.float64): "NCCL_FLOAT64"}


def nccl_group(mpi_comm: Any) -> Any:
    """An NcclCommunicator over the ranks of the mpi4py communicator ``mpi_comm``: the
    group's rank 0 makes the unique id and MPI broadcasts it."""
    from cupy.cuda import nccl

    rank = mpi_comm.Get_rank()
    unique_id = mpi_comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    return nccl.NcclCommunicator(mpi_comm.Get_size(), unique_id, rank)


class NCCLRequest(Request):
    """A collective queued on the NCCL stream; complete once its event has passed."""

    def __init__(self, level: NCCLLevel, done: Any, what: str) -> None:
        self.level, self.done, self.what = level, done, what
        self.finished = False

    def test(self) -> bool:
        self.finished = self.finished or self.done.done
        return self.finished

    def wait(self) -> None:
        self.level.order_after(self.done, self.what)
        self.finished = True


class NCCLLevel:
    """NCCL over one group of GPU ranks (all ranks, a node, or the GPU ranks of a mixed job).

    ``owner`` is the job's MPI communicator: its timeout bounds the waits and its
    ``blocked_seconds`` counts them.
    """

    def __init__(self, mpi_comm: Any, owner: MPICommunicator, cupy: Any) -> None:
        from cupy.cuda import nccl

        self.nccl, self.cupy, self.owner = nccl, cupy, owner
        self.group = nccl_group(mpi_comm)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def _queue(self, array: Any, launch: Callable[[int, int, int, int], None]) -> Any:
        """Queue ``launch(pointer, count, nccl dtype, stream)`` on ``array`` after the compute
        stream's work so far; return the event that marks its end."""
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        launch(array.data.ptr, array.size, getattr(self.nccl, NCCL_DTYPES[np.dtype(array.dtype)]), self.stream.ptr)
        return self.stream.record()

    def start_allreduce(self, array: Any) -> NCCLRequest:
        """Queue the sum of ``array`` over the group, in place."""
        total = self.nccl.NCCL_SUM
        done = self._queue(array, lambda data, count, dtype, stream:
                           self.group.allReduce(data, data, count, dtype, total, stream))
        return NCCLRequest(self, done, f"NCCL Allreduce of {array.size} values")

    def allreduce(self, array: Any) -> Any:
        self.start_allreduce(array).wait()
        return array

    def reduce(self, array: Any, root: int) -> Any:
        """Sum ``array`` over the group into root's ``array``."""
        total = self.nccl.NCCL_SUM
        done = self._queue(array, lambda data, count, dtype, stream:
                           self.group.reduce(data, data, count, dtype, total, root, stream))
        self.order_after(done, f"NCCL Reduce of {array.size} values")
        return array

    def broadcast(self, array: Any, root: int) -> Any:
        """Overwrite every rank's ``array`` with root's."""
        done = self._queue(array, lambda data, count, dtype, stream:
                           self.group.bcast(data, count, dtype, root, stream))
        self.order_after(done, f"NCCL Bcast of {array.size} values")
        return array

    def order_after(self, done: Any, what: str) -> None:
        """Make the compute stream wait for ``done``; with a timeout, wait on the host first, bounded."""
        owner = self.owner
        if owner.timeout > 0:
            owner.poll_until(lambda: done.done, lambda: CollectiveTimeout(
                f"rank {owner.rank} waited more than {owner.timeout:g} s for {what}: a GPU rank is stuck or far "
                "slower; raise --collective-timeout if such delays are expected"))
        self.cupy.cuda.get_current_stream().wait_event(done)


class NCCLCommunicator(MPICommunicator):
    """Every rank on its own GPU: gradient and batch-norm reductions through NCCL, overlapped
    with backward; host values, objects and job control through MPI."""

    name = "nccl"

    def __init__(self, backend: Backend, world: MPICommunicator | None = None, timeout: float = 0.0) -> None:
        super().__init__(world, timeout)
        self.level = NCCLLevel(self._mpi, self, backend.xp)

    def allreduce(self, array: Any) -> Any:
        return self.level.allreduce(array)

    def iallreduce(self, array: Any) -> Request:
        return self.level.start_allreduce(array)

    def broadcast(self, array: Any, root: int = 0) -> Any:
        return self.level.broadcast(array, root)

    def describe(self) -> str:
        from cupy.cuda import nccl

        return f"{self.size} GPU ranks, NCCL {nccl.get_version()} (host values over {super().describe()})"
