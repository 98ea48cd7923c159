"""Check MPICommunicator's declared sub-communicator access on 3 ranks: ``mpiexec -n 3 python comm_split.py``.

Rank 2 joins no sub-communicator of the first split, whose two ranks sum with Allreduce
and with Reduce and Bcast; the Allreduce timing runs on the first 2 ranks, then on all 3.
"""
import numpy as np

from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.allreduce_timing import allreduce_samples


def main() -> None:
    world = MPICommunicator()
    assert world.size == 3, "run on 3 ranks"
    same = MPICommunicator(world)
    assert (same.rank, same.size) == (world.rank, world.size)

    pair = world.split(0 if world.rank < 2 else None, key=-world.rank)  # ranked in reverse
    if world.rank == 2:
        assert pair is None
    else:
        assert (pair.rank, pair.size) == (1 - world.rank, 2)
        values = pair.allreduce_bare(np.full(4, world.rank + 1, dtype=np.float32))
        np.testing.assert_array_equal(values, np.full(4, 3, dtype=np.float32))  # ranks 0 and 1: 1 + 2
        summed_at_root = pair.reduce_broadcast_bare(np.full(4, 10 * world.rank + 1, dtype=np.float32))
        np.testing.assert_array_equal(summed_at_root, np.full(4, 12, dtype=np.float32))  # 1 + 11, on both
        assert pair.started == 0 and pair.blocked_seconds == 0.0  # bare: not counted
        pair.free()

    samples = allreduce_samples(world, [1024])
    assert [(p, n) for p, n, _ in samples] == [(2, 1024), (3, 1024)]
    assert all(seconds > 0 for _, _, seconds in samples)
    world.barrier()
    if world.rank == 0:
        print("split ok")


if __name__ == "__main__":
    main()
