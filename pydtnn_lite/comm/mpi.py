"""Communicator over MPI, through mpi4py's buffer interface (no pickling on the gradient path)."""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from pydtnn_lite.comm.base import Communicator, Request


ARRIVAL_TAG = 7301
POLL_SECONDS = 1e-4


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than the limit: some ranks never arrived."""


class MPIRequest(Request):
    def __init__(self, request: Any) -> None:
        self.request = request
        self.done = False

    def test(self) -> bool:
        if not self.done:
            self.done = bool(self.request.Test())
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.request.Wait()
            self.done = True


class MPICommunicator(Communicator):
    """MPI.COMM_WORLD (or a given communicator).

    ``timeout`` seconds bounds the wait of the small host collectives that every step
    makes (loss, counts): past it, the job reports which ranks have not arrived and
    aborts, instead of hanging silently.
    """

    name = "mpi"

    def __init__(self, comm: Any = None, timeout: float = 0.0) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.timeout = timeout

    def allreduce(self, array: Any) -> Any:
        self.comm.Allreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)
        return array

    def iallreduce(self, array: Any) -> MPIRequest:
        return MPIRequest(self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM))

    def broadcast(self, array: Any, root: int = 0) -> Any:
        self.comm.Bcast(array, root=root)
        return array

    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        buffer = np.asarray(values, dtype=np.float64).copy()
        if self.timeout <= 0 or self.size == 1:
            self.comm.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
            return buffer
        # Every rank announces its arrival to every other rank before the reduction, so that
        # a rank that times out can name the ranks whose announcement never came.
        peers = [r for r in range(self.size) if r != self.rank]
        arrived = {r: np.zeros(1, dtype=np.int64) for r in peers}
        receives = {r: self.comm.Irecv(arrived[r], source=r, tag=ARRIVAL_TAG) for r in peers}
        token = np.ones(1, dtype=np.int64)
        sends = [self.comm.Isend(token, dest=r, tag=ARRIVAL_TAG) for r in peers]
        reduction = self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        deadline = time.monotonic() + self.timeout
        while not reduction.Test():
            if time.monotonic() > deadline:
                missing = [r for r in peers if not receives[r].Test()]
                raise CollectiveTimeout(
                    f"rank {self.rank} waited more than {self.timeout:g} s for ranks "
                    f"{', '.join(map(str, missing)) or '(unknown)'} to reach the same collective: "
                    "one is stuck or far slower; raise --collective-timeout if that is expected")
            time.sleep(POLL_SECONDS)
        self.MPI.Request.Waitall(list(receives.values()) + sends)
        return buffer

    def allgather_object(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)
        os._exit(code)  # Abort does not return; this line only guards a broken MPI

    def describe(self) -> str:
        version = self.MPI.Get_library_version().splitlines()[0].strip()
        return f"{self.size} MPI ranks ({version})"
