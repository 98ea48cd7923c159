"""Check that timing the candidates keeps one: ``mpiexec -n 2 python fastest_candidate.py``.

A mixed job's ``--comm auto`` builds a flat and a two-level communicator and keeps the
faster. Here the second candidate timed always wins. A two-level candidate that loses
releases the MPI communicators it made; one that wins keeps them and still sums.
"""
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.strategy import fastest
from pydtnn_lite.comm.two_level import TwoLevelCommunicator


def second_is_faster() -> Callable[[float], float]:
    """An ``agree`` under which the first candidate timed took 2 s and the second 1 s."""
    seconds = iter((2.0, 1.0))
    return lambda _: next(seconds)


def main() -> None:
    backend = make_backend("cpu", "float64")
    world = MPICommunicator()
    assert world.size == 2, "run on 2 ranks"
    for two_level_first in (True, False):
        flat = MPICommunicator(world)
        two_level = TwoLevelCommunicator(backend, [0, 0], "mpi", "mpi", "hierarchical", world)
        made = list(two_level.made)
        assert made, "a two-level communicator makes MPI communicators of its own"
        order = ("hierarchical", "mpi") if two_level_first else ("mpi", "hierarchical")
        candidates = {name: {"hierarchical": two_level, "mpi": flat}[name] for name in order}
        best = fastest(candidates, 1000, backend, second_is_faster())
        if two_level_first:
            assert best == "mpi", best
            assert all(handle == MPI.COMM_NULL for handle in made), "the losing candidate kept its communicators"
        else:
            assert best == "hierarchical", best
            assert not any(handle == MPI.COMM_NULL for handle in made), "the winner lost its communicators"
            total = two_level.allreduce(np.full(5, world.rank + 1.0))
            np.testing.assert_array_equal(total, np.full(5, 3.0))
            two_level.free()
        np.testing.assert_array_equal(flat.allreduce(np.ones(3)), np.full(3, 2.0))
    if world.rank == 0:
        print("fastest ok")


if __name__ == "__main__":
    main()
