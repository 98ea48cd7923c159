"""Two-level reductions predicted from Allreduce timed between and inside nodes, and --comm auto by that model."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pydtnn_lite.calibrate import report
from pydtnn_lite.comm.strategy import Placement, spans_nodes_in_groups
from pydtnn_lite.perfmodel.measuring import transfer_cost
from pydtnn_lite.perfmodel.modelling.allreduce import AllreduceModel, Link
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.channel import NO_TRANSFER_COST, TransferCost
from pydtnn_lite.perfmodel.modelling.drift import Drift
from pydtnn_lite.perfmodel.modelling.machines import (
    AdjustedMachine,
    CalibratedMachine,
    adjusted_machine,
    calibrated_machine,
    faster_strategy,
)
from pydtnn_lite.perfmodel.modelling.network import (
    NetworkTimings,
    TwoLevelAllreduce,
)
from pydtnn_lite.perfmodel.modelling.placement import Placement as RankPlacement
from pydtnn_lite.perfmodel.modelling.synchronization import SyncWaitModel
from pydtnn_lite.perfmodel.modelling.trace_validation import run_machines
from pydtnn_lite.perfmodel.modelling.workload import build_workload

SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 22)
GBIT = 1e9 / 8  # bytes per second of one Gbit/s


def timings(ranks_per_node: int = 2) -> NetworkTimings:
    """2 nodes on a 1 Gbit/s link (50 us per message), a node's ranks 10x faster among
    themselves, a millisecond of CPU per MiB moved beside the computation and 3 MiB moving
    between two tests."""
    inter = tuple((float(n), 50e-6 + n / GBIT) for n in SIZES)
    intra = tuple((float(n), 5e-6 + n / (10 * GBIT)) for n in SIZES) if ranks_per_node > 1 else ()
    return NetworkTimings(2, ranks_per_node, 1.0, inter, intra, TransferCost(1e-3 / (1 << 20), 3 << 20))


def flat(beta: float) -> AllreduceModel:
    """A ring over all ranks, ``beta`` seconds per byte sent."""
    return AllreduceModel("ring", (Link(50e-6, beta),))


def test_two_level_is_the_inter_node_plus_the_intra_node_time_at_sampled_sizes():
    model = TwoLevelAllreduce.from_timings(timings())
    for n in SIZES:
        expected = (50e-6 + n / GBIT) + (5e-6 + n / (10 * GBIT))
        assert model.seconds(n, 4) == pytest.approx(expected, rel=1e-9)
    between = model.seconds(3 << 19, 4)  # 1.5 MiB: between the 1 and 4 MiB samples
    assert model.seconds(1 << 20, 4) < between < model.seconds(1 << 22, 4)


def test_one_rank_per_node_has_no_intra_node_level():
    model = TwoLevelAllreduce.from_timings(timings(ranks_per_node=1))
    assert model.intra is None
    assert model.seconds(1 << 20, 2) == pytest.approx(50e-6 + (1 << 20) / GBIT, rel=1e-9)


def test_another_rank_count_is_refused():
    with pytest.raises(ValueError, match="2 node"):
        TwoLevelAllreduce.from_timings(timings()).seconds(1 << 20, 8)


def test_auto_takes_the_strategy_of_the_shorter_predicted_step_on_the_nodes_the_calibration_timed():
    """The model predicts a whole step each way, its overlap included: two levels where the
    flat reduction is slow across the links, flat where it is fast; no choice where the job's
    nodes are not the calibration's."""
    calibration = Calibration({"ranks": 4, "ranks_per_node": 4, "usable_cores": 4}, 1e11, 1e10, {},
                              [(4, 1024.0, 1e-4)], allreduce_ranks=4, network=timings())
    network, optimizer = build_workload("mlp", "synthetic")
    ranks = RankPlacement(4, 4, 4, 1)

    def choice(beta: float, nodes: tuple[int, ...] = (0, 0, 1, 1)) -> str | None:
        machine = CalibratedMachine(calibration, flat(beta), overlaps_communication=True)
        return faster_strategy(machine, network, optimizer, 32, ranks, nodes)

    assert choice(10 / GBIT) == "hierarchical"  # flat: 15x the link's time per byte
    assert choice(0.01 / GBIT) == "mpi"  # flat 100x cheaper per byte than the link
    assert choice(10 / GBIT, (0, 0, 0, 1)) is None  # uneven nodes
    assert choice(10 / GBIT, (0, 0, 1, 1, 2, 2)) is None  # more nodes
    unnetworked = dataclasses.replace(calibration, network=None)
    assert faster_strategy(CalibratedMachine(unnetworked, flat(1 / GBIT)), network, optimizer, 32, ranks,
                           (0, 0, 1, 1)) is None


def test_auto_asks_the_model_only_where_flat_and_hierarchical_differ():
    cpu = ("cpu",) * 4
    assert spans_nodes_in_groups(Placement(cpu, (0, 0, 1, 1)))
    assert not spans_nodes_in_groups(Placement(cpu, (0, 1, 2, 3)))  # one rank per node: no node level
    assert not spans_nodes_in_groups(Placement(cpu, (0, 0, 0, 0)))  # one node


def test_the_timings_survive_the_calibration_file_and_older_files_read_without_them(tmp_path):
    calibration = Calibration({"ranks": 4, "ranks_per_node": 4}, 1e11, 1e10, {}, [(4, 1024.0, 1e-4)],
                              allreduce_ranks=4, network=timings())
    path = str(tmp_path / "network.json")
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded.network == timings()
    recorded = dataclasses.replace(calibration, network=dataclasses.replace(timings(), ranks_per_host=4))
    recorded.save(path)
    assert Calibration.load(path).network.ranks_per_host == 4
    pipelined = TransferCost(2e-3 / (1 << 20), 1 << 20, 2e-3, post_test_seconds=0.4e-3)
    recorded = dataclasses.replace(calibration, network=dataclasses.replace(timings(), two_level_transfer=pipelined))
    recorded.save(path)
    assert Calibration.load(path).network.two_level_transfer == pipelined
    calibration.save(path)
    assert CalibratedMachine(loaded, None).transfer_cost == TransferCost(1e-3 / (1 << 20), 3 << 20)
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    for key in ("transfer_cpu_per_byte", "window_bytes"):  # a file written before the transfer was measured
        del data["network"][key]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    assert CalibratedMachine(Calibration.load(path), None).transfer_cost == NO_TRANSFER_COST
    del data["network"]  # a file written before the network timings
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    assert Calibration.load(path).network is None


def test_the_transfer_cost_is_scaled_from_the_sharing_it_was_measured_in_to_the_jobs():
    """Measured with 4 ranks on the 2 cores (an emulated 2 x 2 cluster), the CPU per byte
    already holds two ranks to a core: a job placed so keeps it, a job of a rank per core
    pays half, whatever the placement of the calibration's kernels (a rank per core). A
    post and the test right after it, short calls timed as medians, hold no sharing: the
    job's doubles them. A pipeline's later starts are scaled as the CPU per byte."""
    measured = TransferCost(2e-3 / (1 << 20), 3 << 20, 1e-3, start_seconds=3e-3, post_test_seconds=0.5e-3)
    network = NetworkTimings(2, 2, 1.0, timings().inter_node, timings().intra_node, measured, ranks_per_host=4)
    calibration = Calibration({"ranks": 2, "ranks_per_node": 2, "usable_cores": 2}, 1e11, 1e10, {},
                              [(4, 1024.0, 1e-4)], allreduce_ranks=2, network=network)
    machine = CalibratedMachine(calibration, None)
    shared = adjusted_machine(machine, RankPlacement(4, 4, 2)).transfer_cost
    assert (shared.cpu_per_byte, shared.post_seconds, shared.post_test_seconds, shared.start_seconds) == pytest.approx(
        (measured.cpu_per_byte, 2e-3, 1e-3, 3e-3))
    alone = adjusted_machine(machine, RankPlacement(2, 2, 2)).transfer_cost
    assert (alone.cpu_per_byte, alone.post_seconds, alone.post_test_seconds, alone.start_seconds) == pytest.approx(
        (measured.cpu_per_byte / 2, 1e-3, 0.5e-3, 1.5e-3))
    assert alone.window_bytes == measured.window_bytes
    unrecorded = dataclasses.replace(calibration, network=dataclasses.replace(network, ranks_per_host=None))
    older = adjusted_machine(CalibratedMachine(unrecorded, None), RankPlacement(4, 4, 2)).transfer_cost
    assert older.cpu_per_byte == pytest.approx(2 * measured.cpu_per_byte)  # as if measured a rank per core


def test_time_shared_ranks_wait_for_the_slowest_as_the_network_calibration_measured_them():
    """Waits measured with 4 ranks on the 2 cores (wait = 0.03 * work ** 0.5 on 4 ranks)
    predict a time-shared job's, scaled to its ranks; a job of a rank per core keeps the
    calibration's own model, as do files without them."""
    waits = tuple((work, 0.03 * work ** 0.5) for work in (0.05, 0.2, 0.8))
    network = dataclasses.replace(timings(), ranks_per_host=4, straggler_waits=waits)
    assert NetworkTimings.from_dict(json.loads(json.dumps(network.to_dict()))) == network
    calibration = Calibration({"ranks": 2, "ranks_per_node": 2, "usable_cores": 2}, 1e11, 1e10, {},
                              [(4, 1024.0, 1e-4)], allreduce_ranks=2, network=network,
                              sync_wait=SyncWaitModel(0.01, 1.0, 2))
    machine = CalibratedMachine(calibration, None)
    shared = adjusted_machine(machine, RankPlacement(4, 4, 2))
    assert shared.sync_wait_seconds(0.5, 4) == pytest.approx(0.03 * 0.5 ** 0.5)
    assert shared.sync_wait_seconds(0.5, 8) == pytest.approx(0.03 * 0.5 ** 0.5 * 1.4236 / 1.0294, rel=1e-3)
    assert shared.sync_wait_seconds(0.5, 1) == 0.0
    alone = adjusted_machine(machine, RankPlacement(2, 2, 2))
    assert alone.sync_wait_seconds(0.5, 2) == pytest.approx(0.005)  # the calibration's 2 ranks' own wandering
    older = dataclasses.replace(calibration, network=dataclasses.replace(network, straggler_waits=()))
    assert adjusted_machine(CalibratedMachine(older, None), RankPlacement(4, 4, 2)).sync_wait_seconds(0.5, 4) == \
        pytest.approx(0.005 * 1.0294 / 0.5642, rel=1e-3)
    written_before = network.to_dict()
    del written_before["straggler_waits"]
    assert NetworkTimings.from_dict(written_before).straggler_waits == ()
    # calibrate's report gives the fitted wait, and nothing where none was timed.
    assert "4 ranks, sharing the cores, wait for the slowest 30 ms x (seconds of work) ^ 0.50" in report(calibration)
    assert "wait for the slowest 30 ms" not in report(older)


def test_a_hierarchical_trace_is_validated_with_the_two_level_model():
    calibration = Calibration({"ranks": 4, "ranks_per_node": 4, "usable_cores": 2}, 1e11, 1e10, {},
                              [(4, float(n), 1e-3 + n / GBIT) for n in SIZES], allreduce_ranks=4, network=timings())
    machine = CalibratedMachine(calibration, flat(1 / GBIT), overlaps_communication=True)
    meta = {"ranks": 4, "ranks_per_node": 4, "cores_per_node": 2}
    two_level = TwoLevelAllreduce.from_timings(timings()).seconds(1 << 20, 4)
    for raw_or_corrected in run_machines(machine, dict(meta, strategy="hierarchical")):
        assert raw_or_corrected.allreduce_seconds(1 << 20, 4) == pytest.approx(two_level)
        assert not raw_or_corrected.overlaps_communication  # traced before pipelining: reduced after backward
    inter_node = TwoLevelAllreduce.from_timings(timings()).inter
    pipelined = dataclasses.replace(machine, inter_node=inter_node)
    for raw_or_corrected in run_machines(pipelined, dict(meta, strategy="hierarchical", reduces_during_backward=True)):
        assert raw_or_corrected.allreduce_seconds(1 << 20, 4) == pytest.approx(two_level)
        assert raw_or_corrected.overlaps_communication
        # The links carry the leaders' Allreduce; the rest happens inside the nodes.
        assert raw_or_corrected.link_seconds(1 << 20, 4) == pytest.approx(inter_node.seconds(1 << 20, 2))
    for raw_or_corrected in run_machines(machine, dict(meta, strategy="mpi")):
        assert raw_or_corrected.allreduce_seconds(1 << 20, 4) == pytest.approx(flat(1 / GBIT).seconds(1 << 20, 4))
        assert raw_or_corrected.overlaps_communication


def test_a_pipelined_hierarchical_trace_is_predicted_with_the_pipelines_own_transfer_cost():
    """The pipeline's levels inside the nodes take the ranks' cores in their posts and tests,
    and a bucket's stages wait for the tests that find the one before done: its calibration
    measures them apart from the flat reduction's; files without them keep the flat one's."""
    pipelined = TransferCost(2e-3 / (1 << 20), 1 << 20, 2e-3)
    network = dataclasses.replace(timings(), two_level_transfer=pipelined)
    calibration = Calibration({"ranks": 4, "ranks_per_node": 4, "usable_cores": 4}, 1e11, 1e10, {},
                              [(4, float(n), 1e-3 + n / GBIT) for n in SIZES], allreduce_ranks=4, network=network)
    machine = CalibratedMachine(calibration, flat(1 / GBIT), overlaps_communication=True)
    meta = {"ranks": 4, "ranks_per_node": 4, "cores_per_node": 4, "reduces_during_backward": True}
    for raw_or_corrected in run_machines(machine, dict(meta, strategy="hierarchical")):
        assert raw_or_corrected.transfer_cost == pipelined
    for raw_or_corrected in run_machines(machine, dict(meta, strategy="mpi")):
        assert raw_or_corrected.transfer_cost == timings().transfer
    older = dataclasses.replace(machine, calibration=dataclasses.replace(calibration, network=timings()))
    for raw_or_corrected in run_machines(older, dict(meta, strategy="hierarchical")):
        assert raw_or_corrected.transfer_cost == timings().transfer


class _Clock:
    """A clock that the fake calls below move on by what each costs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _ClockedRequest:
    """A bucket's reduction done at its second test; a test costs 0.5 s of ``clock``.
    ``pipelined``: two collectives, the second started at the second test, done at the third."""

    def __init__(self, clock: _Clock, pipelined: bool) -> None:
        self.clock, self.tests, self.pipelined = clock, 0, pipelined
        self.collectives_started = 1

    def test(self) -> bool:
        self.clock.now += 0.5
        self.tests += 1
        if self.pipelined and self.tests == 2:
            self.collectives_started = 2
        return self.tests >= 2 + self.pipelined


class _ClockedComm:
    """Posting a bucket costs 1 s of ``clock``."""

    def __init__(self, clock: _Clock, pipelined: bool = False) -> None:
        self.clock, self.pipelined = clock, pipelined

    def barrier(self) -> None:
        """Nothing to wait for."""

    def iallreduce(self, bucket: object) -> _ClockedRequest:
        self.clock.now += 1.0
        return _ClockedRequest(self.clock, self.pipelined)


def test_a_post_is_timed_with_the_test_the_trainer_makes_right_after_it(monkeypatch):
    """The trainer tests its buckets as soon as it has posted them (the test that takes the
    peer's first share in over TCP, counted as communication in the trace): the calibration
    times a post the same way, the post and, apart as the trace has them, that test, and
    leaves the rest to the kernels."""
    clock = _Clock()
    monkeypatch.setattr(transfer_cost.time, "perf_counter", clock)
    comm = _ClockedComm(clock)

    def kernel() -> None:
        clock.now += 10.0
    run = transfer_cost.overlapped_kernels(comm, kernel, [object(), object()])
    assert (run.kernels, run.posting, run.post_testing) == (1, 2 * 1.0, 2 * 0.5)
    assert run.seconds == 2 * (1.0 + 0.5) + 10.0 + 2 * 0.5
    assert run.testing == 2 * 0.5  # the two tests after the kernel
    assert transfer_cost.lone_post_round(comm, kernel, [object(), object()]) == (1.0, 0.5, 0.0)


def test_through_a_pipeline_the_tests_that_start_a_buckets_next_collective_are_timed_apart(monkeypatch):
    """The hierarchical pipeline starts a bucket's later collectives inside tests, each
    costing about what the post does wherever the bytes then move: the calibration times
    them apart from the other tests, as a cost per bucket."""
    clock = _Clock()
    monkeypatch.setattr(transfer_cost.time, "perf_counter", clock)
    comm = _ClockedComm(clock, pipelined=True)

    def kernel() -> None:
        clock.now += 10.0
    run = transfer_cost.overlapped_kernels(comm, kernel, [object()])
    # The post (1 s) and the test right after it, the test that starts the second
    # collective after the first kernel, then the test that finds it done.
    assert (run.kernels, run.posting, run.post_testing, run.starting, run.testing) == (2, 1.0, 0.5, 0.5, 0.5)
    assert transfer_cost.lone_post_round(comm, kernel, [object(), object()]) == (1.0, 0.5, 0.5)


def test_the_transfer_cpu_is_split_between_the_tests_and_the_kernels_they_slow(monkeypatch):
    """Kernels of 10 s alone take 12 beside the reduction (the network stack's interrupts):
    of the 3 s per round that the reduction adds besides the posts, 1 is inside the tests
    (two of 0.5 s after the kernel) and 2 in the kernel."""
    clock = _Clock()
    monkeypatch.setattr(transfer_cost.time, "perf_counter", clock)
    comm = _ClockedComm(clock)
    calls = []

    def kernel() -> None:
        clock.now += 10.0 if len(calls) < transfer_cost.ALONE_KERNELS else 12.0
        calls.append(clock.now)
    buckets = [np.ones(4, dtype=np.float32), np.ones(4, dtype=np.float32)]
    cpu, in_tests = transfer_cost.transfer_round(comm, kernel, buckets)
    assert (cpu, in_tests) == (pytest.approx(3.0 / 32), pytest.approx(1.0 / 32))


def test_a_flat_reduction_across_nodes_of_several_ranks_holds_the_links_for_the_inter_node_part(tmp_path):
    """On 2 nodes of 2 ranks, MPICH's halving and doubling cross the link in half their
    steps: the links carry what an Allreduce among the two leaders moves, the rest stays
    inside the nodes. With one rank per node, or another rank count than the calibration's,
    the links carry the whole reduction."""
    def machine(network: NetworkTimings) -> CalibratedMachine:
        path = str(tmp_path / f"{network.ranks_per_node}.json")
        Calibration({"ranks": 4, "ranks_per_node": 4}, 1e11, 1e10, {},
                    [(p, float(n), 3 * (50e-6 + n / GBIT)) for p in (2, 4) for n in SIZES],
                    allreduce_ranks=4, network=network).save(path)
        return calibrated_machine(path)
    two_by_two, two_by_one = machine(timings()), machine(timings(ranks_per_node=1))
    n = 1 << 20
    assert two_by_two.link_seconds(n, 4) == pytest.approx(50e-6 + n / GBIT, rel=1e-6)
    assert two_by_two.allreduce_seconds(n, 4) == pytest.approx(3 * (50e-6 + n / GBIT), rel=1e-6)
    assert two_by_two.link_seconds(n, 2) == two_by_two.allreduce_seconds(n, 2)
    assert two_by_one.link_seconds(n, 2) == two_by_one.allreduce_seconds(n, 2)


def test_a_links_rate_does_not_move_with_the_machine_but_a_nodes_own_reductions_do():
    """The run's communication probe scales the reductions; between nodes the links' hold on
    a bucket stays the calibrated one, while on one node it is the cores' work and moves."""
    placement = RankPlacement(2, 2, 2)  # emulated nodes share the machine's cores
    slower = Drift(communication=1.5)
    samples = [(2, float(n), 50e-6 + n / GBIT) for n in SIZES]
    across = CalibratedMachine(Calibration({"ranks": 2, "ranks_per_node": 1}, 1e11, 1e10, {}, samples,
                                           network=timings(ranks_per_node=1)), flat(1 / GBIT))
    inside = CalibratedMachine(Calibration({"ranks": 2, "ranks_per_node": 2}, 1e11, 1e10, {}, samples),
                               flat(1 / GBIT))
    n = 1 << 22
    for base in (across, inside):
        assert AdjustedMachine(base, placement, slower).allreduce_seconds(n, 2) == pytest.approx(
            1.5 * base.allreduce_seconds(n, 2))
    assert AdjustedMachine(across, placement, slower).link_seconds(n, 2) == pytest.approx(across.link_seconds(n, 2))
    assert AdjustedMachine(inside, placement, slower).link_seconds(n, 2) == pytest.approx(
        1.5 * inside.link_seconds(n, 2))


def test_the_transfer_is_measured_on_buckets_lying_in_one_gradient_past_its_start(monkeypatch):
    """The trainer's buckets are views into its flat gradient, none at the start of the
    allocation but the last one it posts; over an emulated link a bucket 16 bytes into its
    page posted 1.4x slower than one further in. The calibration posts buckets that lie as
    most of the trainer's do: one array, each bucket a view past its start."""
    seen: list[list[np.ndarray]] = []

    def recording(result):
        def measure(comm, kernel, buckets):
            seen.append(list(buckets))
            return result
        return measure
    monkeypatch.setattr(transfer_cost, "transfer_round", recording((1e-9, 0.5e-9)))
    monkeypatch.setattr(transfer_cost, "lone_post_round", recording((1e-3, 0.1e-3, 0.0)))
    monkeypatch.setattr(transfer_cost, "window_round", recording(3.0 * (1 << 20)))
    monkeypatch.setattr(transfer_cost, "gemm_kernel", lambda: (lambda: None))

    class OneRank:
        def allgather_object(self, value):
            return [value]
    cost = transfer_cost.measure_transfer(OneRank(), rounds=1)
    assert (cost.post_seconds, cost.post_test_seconds) == (1e-3, 0.1e-3)
    buckets = seen[0]
    assert len(buckets) == transfer_cost.BUCKETS and all(b.nbytes == transfer_cost.BUCKET_BYTES for b in buckets)
    gradient = buckets[0].base
    assert gradient is not None and all(b.base is gradient for b in buckets)
    assert min(b.ctypes.data for b in buckets) - gradient.ctypes.data >= 32  # none at the allocation's start
