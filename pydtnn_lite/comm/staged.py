"""MPI for arrays on a device that MPI cannot read: each reduction goes through host memory.

The wheel-installed MPICH is not CUDA-aware, so a GPU rank copies a gradient bucket to a
page-locked host buffer, reduces it there with the other ranks, and copies the sum back.
This is the "host-staged" strategy of a job that mixes CPU and GPU ranks; on a CPU the
copies are plain memory copies and the results are those of :class:`MPICommunicator`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm.base import Request
from pydtnn_lite.comm.mpi import MPICommunicator


class StagedRequest(Request):
    """A host-side reduction in flight whose result is copied back to the device once it completes."""

    def __init__(self, host_request: Request, copy_back: Callable[[], Any]) -> None:
        self.host_request, self.copy_back = host_request, copy_back
        self.done = False

    def test(self) -> bool:
        if not self.done and self.host_request.test():
            self.copy_back()
            self.done = True
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.host_request.wait()
            self.copy_back()
            self.done = True


class HostStagedCommunicator(MPICommunicator):
    """An :class:`MPICommunicator` whose array collectives stage device arrays through host buffers."""

    name = "mpi-host-staged"

    def __init__(self, backend: Backend, world: MPICommunicator | None = None, timeout: float = 0.0) -> None:
        super().__init__(world, timeout)
        self.backend = backend

    def stage(self, array: Any) -> Any:
        """``array``'s values in host memory (:meth:`Backend.staged`): a device array's copied to a
        buffer the device can copy to at full speed, a host array's where they are."""
        return self.backend.staged(array)

    def allreduce(self, array: Any) -> Any:
        host = self.allreduce_buffer(self.stage(array))
        return self.backend.copy_from_host(host, array)

    def iallreduce(self, array: Any) -> Request:
        host = self.stage(array)
        return StagedRequest(self.iallreduce_buffer(host), lambda: self.backend.copy_from_host(host, array))

    def broadcast(self, array: Any, root: int = 0) -> Any:
        host = super().broadcast(self.stage(array), root)
        return self.backend.copy_from_host(host, array)

    def describe(self) -> str:
        staged = ", device arrays staged through host memory" if self.backend.on_gpu else ""
        return super().describe() + staged
