"""Communicator over MPI, through mpi4py's buffer interface (no pickling on the gradient path)."""
from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pydtnn_lite.comm.base import Communicator, Request
from pydtnn_lite.errors import CollectiveTimeout
from pydtnn_lite.runtime import usable_cores

STUCK_TAG = 7301
SPIN_SECONDS = 0.01  # poll without sleeping this long, with a core per rank: most collectives finish within it


class MPIRequest(Request):
    """A non-blocking collective whose wait is bounded by the communicator's timeout."""

    def __init__(self, communicator: MPICommunicator, request: Any, sequence: int, what: str) -> None:
        self.communicator, self.request = communicator, request
        self.sequence, self.what = sequence, what
        self.done = False

    def test(self) -> bool:
        if not self.done:
            self.done = bool(self.request.Test())
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.communicator.complete(self)
            self.done = True


class MPICommunicator(Communicator):
    """MPI over the ranks of the job, or over those of a :meth:`split`.

    With ``timeout`` > 0 every collective of a step (batch-norm sums, gradient buckets,
    the loss) waits at most that many seconds. Past it, the ranks that are stuck tell each
    other where they wait, and the error names the ranks that never arrived, instead of
    the job hanging silently. Collectives are numbered in the order each rank starts them,
    which is identical on all ranks in a correct program, so a rank waiting in a
    different collective is reported too.
    """

    name = "mpi"

    def __init__(self, world: MPICommunicator | None = None, timeout: float = 0.0) -> None:
        """Over the ranks of ``world`` (MPI.COMM_WORLD when None)."""
        from mpi4py import MPI

        self._attach(MPI.COMM_WORLD if world is None else world._mpi, timeout)

    def _attach(self, handle: Any, timeout: float) -> None:
        """Span the ranks of the mpi4py communicator ``handle`` (private: other code uses the methods)."""
        from mpi4py import MPI

        self.MPI, self._mpi = MPI, handle
        self.rank, self.size = handle.Get_rank(), handle.Get_size()
        # The ranks on this machine by host name: MPICH's shared-memory split puts every rank
        # in a node of its own under MPIR_CVAR_NOLOCAL (emulated clusters), though they share the cores.
        hosts = handle.allgather(platform.node())
        here = [rank for rank, host in enumerate(hosts) if host == hosts[self.rank]]
        self.local_rank, self.local_size = here.index(self.rank), len(here)
        # With more ranks than cores, a rank that spins while waiting takes the core of one that computes.
        self.oversubscribed = self.local_size > usable_cores()
        self.spin_seconds = 0.0 if self.oversubscribed else SPIN_SECONDS
        self.timeout = timeout
        self.blocked_seconds = 0.0
        self.started = 0  # collectives started by this rank, for matching across ranks
        self._notices: list[Any] = []  # sends of a timed-out rank, kept alive until the abort

    # ------------------------------------------------------------- collectives
    def allreduce(self, array: Any) -> Any:
        return self.allreduce_buffer(array)

    def iallreduce(self, array: Any) -> Request:
        return self.iallreduce_buffer(array)

    def broadcast(self, array: Any, root: int = 0) -> Any:
        self.started += 1
        self._mpi.Bcast(array, root=root)
        return array

    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        return self.allreduce_buffer(np.asarray(values, dtype=np.float64).copy())

    def allreduce_buffer(self, buffer: np.ndarray) -> np.ndarray:
        """Sum the host ``buffer`` over all ranks, in place, within the timeout.

        The host path of every reduction; subclasses that move device arrays another way
        (host staging, NCCL) override :meth:`allreduce` and keep this one.
        """
        if self.timeout <= 0:
            self.started += 1
            began = time.perf_counter()
            self._mpi.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
            self.blocked_seconds += time.perf_counter() - began
        else:
            self.iallreduce_buffer(buffer).wait()
        return buffer

    def iallreduce_buffer(self, buffer: np.ndarray) -> MPIRequest:
        """Start summing the host ``buffer`` over all ranks, in place."""
        self.started += 1
        request = self._mpi.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        return MPIRequest(self, request, self.started, f"Allreduce of {buffer.size} values")

    def wait_for(self, request: Any, what: str) -> None:
        """Complete the mpi4py ``request`` of a collective on a sub-communicator, within the
        timeout (such collectives are not numbered: not every rank takes part in them)."""
        self.complete(MPIRequest(self, request, 0, what))

    def allgather_object(self, obj: Any) -> list:
        self.started += 1
        return self._mpi.allgather(obj)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        self.started += 1
        return self._mpi.bcast(obj, root=root)

    def gather_object(self, obj: Any, root: int = 0) -> list | None:
        self.started += 1
        return self._mpi.gather(obj, root=root)

    def barrier(self) -> None:
        self.started += 1
        self._mpi.Barrier()

    # ------------------------------------------------------------- sub-communicators and timing
    def split(self, color: int | None, key: int) -> MPICommunicator | None:
        """:meth:`Communicator.split`, the new communicator with this one's timeout."""
        handle = self._mpi.Split(self.MPI.UNDEFINED if color is None else color, key)
        if color is None:
            return None
        sub = MPICommunicator.__new__(MPICommunicator)  # over the new handle, not over a communicator's ranks
        sub._attach(handle, self.timeout)
        return sub

    def free(self) -> None:
        """Release the MPI communicator of a :meth:`split` (collective over its ranks)."""
        self._mpi.Free()

    def allreduce_bare(self, buffer: np.ndarray) -> np.ndarray:
        """Sum the host ``buffer`` over all ranks, in place, with MPI's Allreduce and nothing
        else: no timeout, not counted in ``started`` or ``blocked_seconds``, so that timing
        it times MPI alone (the calibration's Allreduce samples)."""
        self._mpi.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        return buffer

    def reduce_broadcast_bare(self, buffer: np.ndarray) -> np.ndarray:
        """Sum the host ``buffer`` onto rank 0 with MPI's Reduce, then Bcast it back, as
        :meth:`allreduce_bare` runs MPI alone: a two-level reduction's level inside a node
        (:class:`~pydtnn_lite.comm.two_level.TwoLevelCommunicator`), timed by the calibration."""
        if self.rank == 0:
            self._mpi.Reduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM, root=0)
        else:
            self._mpi.Reduce(buffer, None, op=self.MPI.SUM, root=0)
        self._mpi.Bcast(buffer, root=0)
        return buffer

    # ------------------------------------------------------------- bounded waits
    def complete(self, request: MPIRequest) -> None:
        """Wait for ``request``; past the timeout raise CollectiveTimeout naming the missing ranks."""
        if self.timeout > 0:
            self.poll_until(request.request.Test, lambda: self._timeout_error(request))
            return
        began = time.perf_counter()
        request.request.Wait()
        self.blocked_seconds += time.perf_counter() - began

    def poll_until(self, finished: Callable[[], bool], timed_out: Callable[[], Exception]) -> None:
        """Poll ``finished()`` until it is true, counting the time as blocked; raise
        ``timed_out()`` once the wait passes the timeout (which must be set)."""
        began = time.perf_counter()
        try:
            while not finished():
                waited = time.perf_counter() - began
                if waited > self.timeout:
                    raise timed_out()
                if waited > self.spin_seconds:
                    time.sleep(min(1e-3, waited / 100))
        finally:
            self.blocked_seconds += time.perf_counter() - began

    def _timeout_error(self, request: MPIRequest) -> CollectiveTimeout:
        """Tell every peer which collective this rank is stuck in, listen for a grace period
        to the peers that are stuck too, and describe who never arrived."""
        notice = np.array([request.sequence], dtype=np.int64)
        peers = [r for r in range(self.size) if r != self.rank]
        self._notices += [self._mpi.Isend(notice, dest=r, tag=STUCK_TAG) for r in peers]
        heard: dict[int, int] = {}
        status, received = self.MPI.Status(), np.zeros(1, dtype=np.int64)
        deadline = time.monotonic() + min(self.timeout, 2.0)
        while len(heard) < len(peers) and time.monotonic() < deadline:
            if self._mpi.Iprobe(source=self.MPI.ANY_SOURCE, tag=STUCK_TAG, status=status):
                self._mpi.Recv(received, source=status.Get_source(), tag=STUCK_TAG)
                heard[status.Get_source()] = int(received[0])
            else:
                time.sleep(1e-3)
        absent = [r for r in peers if r not in heard]
        elsewhere = [f"rank {r} in collective #{s}" for r, s in sorted(heard.items()) if s != request.sequence]
        where = f"collective #{request.sequence}" if request.sequence else "a collective of its rank group"
        parts = [f"rank {self.rank} waited more than {self.timeout:g} s in {where} ({request.what})"]
        if absent:
            parts.append(f"rank(s) {', '.join(map(str, absent))} never arrived (stuck or far slower)")
        if elsewhere:
            parts.append("waiting in a different collective: " + ", ".join(elsewhere))
        return CollectiveTimeout("; ".join(parts) + "; raise --collective-timeout if such delays are expected")

    # ------------------------------------------------------------- job control
    def abort(self, code: int) -> None:
        self._mpi.Abort(code)
        os._exit(code)  # Abort does not return; this line only guards a broken MPI

    def describe(self) -> str:
        version = " ".join(self.MPI.Get_library_version().splitlines()[0].split())
        crowded = f", {self.local_size} on {usable_cores()} cores here" if self.oversubscribed else ""
        return f"{self.size} MPI ranks ({version}){crowded}"
