"""The communicator interface the trainer talks to, and its single-process implementation.

Arrays passed to collectives are backend arrays (NumPy here; CuPy for a device-aware
implementation), reduced in place with SUM. Small host-side values (loss, counts,
timings) travel through ``allreduce_host`` and the ``*_object`` calls.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class Request:
    """A started non-blocking collective."""

    def test(self) -> bool:
        """Drive progress; True once complete."""
        return True

    def wait(self) -> None:
        """Block until complete."""


class Communicator:
    """Rank, size and the collectives of synchronous data-parallel training."""

    rank = 0
    size = 1
    local_rank = 0  # rank among the processes of this node
    local_size = 1  # processes of this job on this node
    name = "serial"
    blocked_seconds = 0.0  # time spent blocked in collectives so far (waiting for data or other ranks)

    def allreduce(self, array: Any) -> Any:
        """Sum ``array`` over all ranks, in place; return it."""
        return array

    def iallreduce(self, array: Any) -> Request:
        """Start summing ``array`` over all ranks, in place."""
        return Request()

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """Overwrite ``array`` on every rank with root's, in place; return it."""
        return array

    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        """Sum a few float64 host values over all ranks."""
        return np.asarray(values, dtype=np.float64)

    def allgather_object(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order."""
        return [obj]

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather_object(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on ``root``; None on the other ranks."""
        return [obj]

    def barrier(self) -> None:
        """Wait for every rank."""

    def abort(self, code: int) -> None:
        """End every process of the job now (never returns)."""
        raise SystemExit(code)

    def describe(self) -> str:
        return "1 process"


SerialCommunicator = Communicator
