"""The communicator interface is abstract, the serial communicator does the one-process thing,
the MPI communicator's sub-communicators work, and every planner uses one first-bucket default."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pydtnn_lite import kernels
from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator, Request, SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.comm.base import CompletedRequest
from pydtnn_lite.comm.gradients import FIRST_BUCKET_MB, MIB, GradientSynchronizer, plan_buckets
from pydtnn_lite.layers import StepContext
from pydtnn_lite.perfmodel.modelling.channel import NO_TRANSFER_COST
from pydtnn_lite.perfmodel.modelling.prediction import predict_step
from pydtnn_lite.perfmodel.modelling.workload import build_workload

from mpi import REPO, run

COLLECTIVES = ("allreduce", "iallreduce", "broadcast", "allreduce_host", "allgather_object", "broadcast_object",
               "gather_object", "barrier", "split", "free", "abort", "describe")


def test_every_collective_is_abstract():
    assert Communicator.__abstractmethods__ == frozenset(COLLECTIVES)
    assert Request.__abstractmethods__ == frozenset(("test", "wait"))
    with pytest.raises(TypeError):
        Communicator()
    with pytest.raises(TypeError):
        Request()


@pytest.mark.parametrize("missing", COLLECTIVES)
def test_a_communicator_that_omits_a_collective_cannot_be_made(missing):
    methods = {name: getattr(SerialCommunicator, name) for name in COLLECTIVES if name != missing}
    partial = type("Partial", (Communicator,), methods)
    with pytest.raises(TypeError, match=missing):
        partial()
    complete = type("Complete", (Communicator,), {**methods, missing: getattr(SerialCommunicator, missing)})
    assert isinstance(complete(), Communicator)


def test_a_request_that_omits_wait_cannot_be_made():
    with pytest.raises(TypeError, match="wait"):
        type("Partial", (Request,), {"test": lambda self: True})()


def test_serial_collectives_return_the_single_process_results():
    comm = SerialCommunicator()
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size) == (0, 1, 0, 1)
    assert comm.blocked_seconds == 0.0 and comm.describe() == "1 process"
    array = np.arange(5, dtype=np.float32)
    assert comm.allreduce(array) is array and comm.broadcast(array, root=0) is array
    request = comm.iallreduce(array)
    assert isinstance(request, CompletedRequest) and request.test()
    request.wait()
    np.testing.assert_array_equal(array, np.arange(5, dtype=np.float32))
    host = comm.allreduce_host([1.5, 2])
    assert host.dtype == np.float64 and host.tolist() == [1.5, 2.0]
    obj = {"loss": 0.5}
    assert comm.allgather_object(obj) == [obj] and comm.gather_object(obj) == [obj]
    assert comm.broadcast_object(obj) is obj
    assert comm.barrier() is None
    # Alone in any group: a split gives the communicator itself, or none outside every group.
    assert comm.split(0, key=0) is comm and comm.split(None, key=0) is None and comm.free() is None
    with pytest.raises(SystemExit) as ended:
        comm.abort(3)
    assert ended.value.code == 3


def test_mpi_communicator_splits_and_times_on_sub_communicators():
    result = run(3, [os.path.join(REPO, "tests", "programs", "comm_split.py")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "split ok" in result.stdout


def test_host_arrays_are_summed_where_they_are_and_others_through_a_copy():
    """A gradient bucket (a contiguous slice of the flat gradients) goes to MPI as it is:
    four copies of it a bucket cost the ranks of a two-level reduction CPU they compute with."""
    backend = make_backend("cpu", "float32")
    grads = np.arange(12, dtype=np.float32)
    bucket = grads[4:8]
    host = backend.staged(bucket)
    assert np.shares_memory(host, grads)
    host += 100  # what a reduction in place does
    assert backend.copy_from_host(host, bucket) is bucket
    np.testing.assert_array_equal(grads, np.r_[np.arange(4), np.arange(4, 8) + 100, np.arange(8, 12)])
    every_other = grads[::2]
    staged = backend.staged(every_other)
    assert not np.shares_memory(staged, grads) and staged.tolist() == every_other.tolist()
    staged[:] = -1
    backend.copy_from_host(staged, every_other)
    assert (grads[::2] == -1).all() and (grads[1::2] != -1).all()


def test_two_level_buckets_complete_in_the_tests_backward_makes():
    """Hierarchical reductions move while backward computes: buckets started at different
    moments on each rank, a whole-array sum among them, all complete by tests alone with
    the job-wide sums; a wait for the last of many buckets completes them all; and freeing
    a two-level communicator releases the MPI communicators it made."""
    result = run(5, [os.path.join(REPO, "tests", "programs", "pipelined_reductions.py")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pipeline ok" in result.stdout


class Machine:
    """Every kernel and every Allreduce a millisecond: enough to plan a prediction's buckets."""

    overlaps_communication = True
    starts_inside_calls = False
    pipelines_in_tests = False

    def kernel_seconds(self, kernel: str, cost: object) -> float:
        return 1e-3

    def kernel_seconds_of(self, kernel: str, costs: list) -> list[float]:
        return [1e-3] * len(costs)

    def allreduce_seconds(self, nbytes: float, procs: int) -> float:
        return 1e-3

    def link_seconds(self, nbytes: float, procs: int) -> float:
        return 1e-3

    def sync_wait_seconds(self, segment: float, procs: int) -> float:
        return 0.0

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        return 0.0

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        return 0.0

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float:
        return 1.0

    def bucket_share_left(self, nbytes: float, procs: int) -> float:
        return 1.0

    transfer_cost = NO_TRANSFER_COST


@pytest.mark.parametrize("bucket_mb", [0.01, 4.0])
def test_one_first_bucket_default_for_synchronizers_and_predictions(bucket_mb):
    """The first bucket holds at most the smaller of FIRST_BUCKET_MB and the bucket size,
    however the synchronizer is made, and the prediction plans the same buckets."""
    network, optimizer = build_workload("lenet", "mnist")
    expected = plan_buckets(network, bucket_mb * MIB)
    assert expected[0].size * 4 <= min(FIRST_BUCKET_MB, bucket_mb) * MIB
    comm = SerialCommunicator()
    assert GradientSynchronizer(network, comm, bucket_mb).buckets == expected
    assert make_gradient_synchronizer(network, comm, bucket_mb, overlap=True).buckets == expected
    predicted = predict_step(network, optimizer, 8, 2, Machine(), bucket_mb)
    assert predicted.bucket_bytes == [b.size * 4.0 for b in expected]


class TwoRanks(SerialCommunicator):
    """A serial communicator that says it has two ranks, whose reductions never complete
    until waited for, and which counts the tests of them."""

    size = 2

    def __init__(self) -> None:
        super().__init__()
        self.tests = 0

    def iallreduce(self, array: np.ndarray) -> Request:
        comm = self

        class Outstanding(Request):
            def test(self) -> bool:
                comm.tests += 1
                return False

            def wait(self) -> None:
                pass
        return Outstanding()


def test_outstanding_buckets_are_tested_after_every_kernel_of_backward_and_the_kernels_restored_after():
    """MPI moves a bucket only inside an MPI call: while buckets are outstanding, each kernel
    call tests them, not only each layer's end; finish puts the plain kernel entries back."""
    network, _ = build_workload("lenet", "mnist")
    comm = TwoRanks()
    # A first bucket of the last layer's gradient alone, outstanding all through backward.
    synchronizer = GradientSynchronizer(network, comm, bucket_mb=4.0, first_bucket_mb=0.001, overlap=True)
    assert len(synchronizer.buckets) == 2
    plain = {name: getattr(kernels, name) for name in kernels.__all__}
    x = np.random.default_rng(0).normal(size=(4, *network.input_shape)).astype(np.float32)
    logits = network.forward(x, StepContext(training=True, global_batch=4, step=1))
    network.backward(np.ones_like(logits), on_layer_done=synchronizer.layer_done)
    assert comm.tests > 2 * len(network.layers)  # tests after kernels, beyond one at each layer's end
    assert any(getattr(kernels, name) is not kernel for name, kernel in plain.items())
    synchronizer.finish()
    assert all(getattr(kernels, name) is kernel for name, kernel in plain.items())
