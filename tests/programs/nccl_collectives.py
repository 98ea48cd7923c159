"""Check the NCCL collectives against hand-computed sums; one GPU per rank.

Run as ``mpiexec -n P python nccl_collectives.py`` with P no more than the node's GPUs.
"""
import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.nccl import NCCLCommunicator
from pydtnn_lite.comm.two_level import TwoLevelCommunicator


def main() -> None:
    world = MPICommunicator()
    backend = make_backend("gpu", "float32", gpu_id=world.local_rank)
    cupy, size, rank = backend.xp, world.size, world.rank
    expected = sum(np.arange(1000, dtype=np.float32) * (r + 1) for r in range(size))
    communicators = [NCCLCommunicator(backend, timeout=60),
                     TwoLevelCommunicator(backend, [0] * size, "nccl", "mpi", "nccl-in-group", timeout=60),
                     TwoLevelCommunicator(backend, list(range(size)), "mpi", "nccl", "nccl-among-leaders", timeout=60)]
    for comm in communicators:
        blocking = cupy.arange(1000, dtype=cupy.float32) * (rank + 1)
        comm.allreduce(blocking)
        overlapped = cupy.arange(1000, dtype=cupy.float32) * (rank + 1)
        request = comm.iallreduce(overlapped)
        request.wait()
        shared = cupy.full(10, float(rank), dtype=cupy.float32)
        comm.broadcast(shared, root=0)
        np.testing.assert_allclose(blocking.get(), expected, err_msg=comm.name)
        np.testing.assert_allclose(overlapped.get(), expected, err_msg=comm.name)
        np.testing.assert_array_equal(shared.get(), np.zeros(10, dtype=np.float32), err_msg=comm.name)
    if rank == 0:
        print(f"nccl collectives ok on {size} rank(s)")


if __name__ == "__main__":
    main()
