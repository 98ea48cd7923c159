"""Communication: the communicator interface, its MPI implementation, gradient synchronisation."""
from __future__ import annotations

from pydtnn_lite.comm.base import Communicator, Request, SerialCommunicator
from pydtnn_lite.comm.gradients import GradientSynchronizer, make_gradient_synchronizer


def make_communicator(timeout: float = 0.0) -> Communicator:
    """MPI across the ranks of an ``mpirun`` job; a plain single process when there is one rank."""
    from pydtnn_lite.comm.mpi import MPICommunicator

    comm = MPICommunicator(timeout=timeout)
    return comm if comm.size > 1 else SerialCommunicator()


__all__ = ["Communicator", "Request", "SerialCommunicator", "GradientSynchronizer",
           "make_gradient_synchronizer", "make_communicator"]
