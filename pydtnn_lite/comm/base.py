"""The communicator interface the trainer talks to, and its single-process implementation.

Arrays passed to collectives are backend arrays (NumPy here; CuPy for a device-aware
implementation), reduced in place with SUM. Small host-side values (loss, counts,
timings) travel through ``allreduce_host`` and the ``*_object`` calls.

Both classes are abstract so that an implementation that forgets a method fails when it
is instantiated instead of silently behaving as a single process.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Request(ABC):
    """A started non-blocking collective."""

    @abstractmethod
    def test(self) -> bool:
        """Drive progress; True once complete."""

    @abstractmethod
    def wait(self) -> None:
        """Block until complete."""

    @property
    def collectives_started(self) -> int:
        """The collectives this request has started on this rank so far: one, started when the
        request was made (a pipeline of several starts each next one inside a test)."""
        return 1


class CompletedRequest(Request):
    """A collective that was complete when it started (one process has no one to wait for)."""

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        """Nothing to wait for."""


class Communicator(ABC):
    """Rank, size and the collectives of synchronous data-parallel training."""

    rank: int
    size: int
    local_rank: int  # rank among the processes of this node
    local_size: int  # processes of this job on this node
    oversubscribed: bool  # more processes of this job on this node than cores they may use
    name: str
    blocked_seconds: float  # time spent blocked in collectives so far (waiting for data or other ranks)
    # Whether a started reduction moves in the tests of backward, before its wait (False
    # where it runs only when waited for).
    reduces_during_backward: bool = True

    @abstractmethod
    def allreduce(self, array: Any) -> Any:
        """Sum ``array`` over all ranks, in place; return it."""

    @abstractmethod
    def iallreduce(self, array: Any) -> Request:
        """Start summing ``array`` over all ranks, in place."""

    @abstractmethod
    def broadcast(self, array: Any, root: int = 0) -> Any:
        """Overwrite ``array`` on every rank with root's, in place; return it."""

    @abstractmethod
    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        """Sum a few float64 host values over all ranks."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order."""

    @abstractmethod
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Root's ``obj``, on every rank."""

    @abstractmethod
    def gather_object(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on ``root``; None on the other ranks."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""

    @abstractmethod
    def split(self, color: int | None, key: int) -> Communicator | None:
        """Collective: a communicator over the ranks that pass the same ``color``, ranked by
        ``key``; None for a rank that passes None (it joins none). Release it with :meth:`free`."""

    @abstractmethod
    def free(self) -> None:
        """Release a communicator of :meth:`split` (collective over its ranks)."""

    @abstractmethod
    def abort(self, code: int) -> None:
        """End every process of the job now (never returns)."""

    @abstractmethod
    def describe(self) -> str:
        """The processes and library, for the first line of a run."""


class SerialCommunicator(Communicator):
    """One process: every collective's result is this process's own contribution."""

    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    oversubscribed = False  # one process has a core
    name = "serial"
    blocked_seconds = 0.0  # there is no other rank to wait for

    def allreduce(self, array: Any) -> Any:
        """The sum over one rank is ``array`` itself, unchanged."""
        return array

    def iallreduce(self, array: Any) -> Request:
        """``array`` already holds the sum: a request that is complete."""
        return CompletedRequest()

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """This process is the root: ``array`` is unchanged."""
        return array

    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        """The values themselves, as float64 like the other implementations return them."""
        return np.asarray(values, dtype=np.float64)

    def allgather_object(self, obj: Any) -> list:
        """The only rank's ``obj``."""
        return [obj]

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """This process is the root: ``obj`` itself."""
        return obj

    def gather_object(self, obj: Any, root: int = 0) -> list | None:
        """This process is the root: the list of the only rank's ``obj``."""
        return [obj]

    def barrier(self) -> None:
        """No other rank to wait for."""

    def split(self, color: int | None, key: int) -> Communicator | None:
        """The only rank, alone in its group: this communicator, or None outside every group."""
        return None if color is None else self

    def free(self) -> None:
        """No library resources to release."""

    def abort(self, code: int) -> None:
        """The job is this process: exit it with ``code``."""
        raise SystemExit(code)

    def describe(self) -> str:
        """No MPI library to name: one process."""
        return "1 process"
