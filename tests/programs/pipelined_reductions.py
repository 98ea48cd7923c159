"""Check the two-level pipeline on 5 ranks: ``mpiexec -n 5 python pipelined_reductions.py``.

Groups {0, 1}, {2, 3, 4} (led by rank 2) and the leaders 0 and 2. Each rank starts six
bucket reductions at moments of its own, with a whole-array sum between them, and then
only tests the buckets (as backward does) until all are complete: no wait. Every sum must
equal the job-wide one. Then many small buckets, waited for through the last alone, which
waits for all the buckets before it. Last, more two-level communicators made and freed in
turn than MPI holds at once.
"""
import time

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.two_level import TwoLevelCommunicator

BUCKETS, DEADLINE_SECONDS = 6, 30.0
MANY_BUCKETS = 1200  # more than Python's recursion limit
MANY_COMMUNICATORS = 450  # unfreed, the 410th failed here: MPICH holds 2048 per process, each makes up to 5


def main() -> None:
    comm = TwoLevelCommunicator(make_backend("cpu", "float64"), [0, 0, 2, 2, 2], "mpi", "mpi", "hierarchical")
    assert comm.size == 5, "run on 5 ranks"
    assert comm.reduces_during_backward
    rng = np.random.default_rng(comm.rank)
    buckets = [rng.standard_normal(1000 + 37 * index) for index in range(BUCKETS)]
    expected = [np.sum(comm.allgather_object(bucket), axis=0) for bucket in buckets]
    whole = np.full(8, comm.rank + 1.0)
    requests = []
    for index, bucket in enumerate(buckets):
        time.sleep(rng.uniform(0, 0.02))  # the ranks reach each bucket at moments of their own
        requests.append(comm.iallreduce(bucket))
        if index == BUCKETS // 2:  # a whole-array sum while buckets are in flight
            comm.allreduce(whole)
        for request in requests:
            request.test()
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not all(request.test() for request in requests):
        assert time.monotonic() < deadline, f"rank {comm.rank}: buckets not complete by tests alone"
        time.sleep(1e-3)
    for bucket, total in zip(buckets, expected, strict=True):
        np.testing.assert_allclose(bucket, total, rtol=1e-12)
    np.testing.assert_array_equal(whole, np.full(8, 15.0))  # 1 + 2 + 3 + 4 + 5

    small = [np.full(4, comm.rank + index, dtype=np.float64) for index in range(MANY_BUCKETS)]
    requests = [comm.iallreduce(bucket) for bucket in small]
    requests[-1].wait()
    assert all(request.test() for request in requests)
    for index, bucket in enumerate(small):
        np.testing.assert_array_equal(bucket, np.full(4, 10.0 + 5 * index))  # ranks 0-4 plus 5 x index
    comm.barrier()

    for _ in range(MANY_COMMUNICATORS):
        TwoLevelCommunicator(make_backend("cpu", "float64"), [0, 0, 2, 2, 2], "mpi", "mpi", "hierarchical").free()
    comm.free()
    if comm.rank == 0:
        print("pipeline ok")


if __name__ == "__main__":
    main()
