"""How a job's gradients are summed, from where its ranks run (--comm, --device)."""
from __future__ import annotations

import json
import os
import re

import pytest

from pydtnn_lite.comm.strategy import Placement, check_strategy, gpu_leaders, group_kind, node_leaders, resolve_auto
from pydtnn_lite.errors import UserError
from pydtnn_lite.run_config import device_of_rank

from mpi import REPO, assert_one_line_error, assert_same_weights, run, train_cli, train_small, train_small_output

LENET = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--epochs", "1", "--steps-per-epoch", "1",
         "--eval-steps", "0")
MIXED = Placement(("cpu", "gpu:0", "gpu:1", "cpu", "cpu"), (0, 0, 0, 1, 1))


def test_auto_takes_mpi_for_cpu_jobs_nccl_for_gpu_jobs_and_times_mixed_ones():
    assert resolve_auto(Placement(("cpu", "cpu"), (0, 0))) == "mpi"
    assert resolve_auto(Placement(("gpu:0", "gpu:0"), (0, 1))) == "nccl"
    assert resolve_auto(MIXED) == ""


def test_hierarchical_groups_are_nodes_led_by_their_lowest_rank():
    placement = Placement(("gpu:0", "gpu:1", "gpu:0", "gpu:1", "cpu"), (0, 0, 1, 1, 1))
    assert node_leaders(placement) == [0, 0, 2, 2, 2]
    assert group_kind(placement, node_leaders(placement), 0) == "nccl"  # node 0: GPU ranks only
    assert group_kind(placement, node_leaders(placement), 2) == "mpi"  # node 1 has a CPU rank


def test_gpu_side_deals_cpu_ranks_to_gpu_ranks_of_their_node_first():
    # rank 0 joins a GPU of its node; node 1 has no GPU, so ranks 3 and 4 are dealt to any GPU rank, in turn
    assert gpu_leaders(MIXED) == [1, 1, 2, 2, 1]
    assert gpu_leaders(Placement(("gpu:0", "cpu", "cpu", "cpu"), (0, 0, 0, 0))) == [0, 0, 0, 0]


@pytest.mark.parametrize("choice,placement,message", [
    ("nccl", MIXED, "rank(s) 0, 3, 4 run on the CPU"),
    ("gpu-side", Placement(("cpu", "cpu"), (0, 0)), "needs at least one GPU rank"),
    ("auto", Placement(("gpu:0", "gpu:0"), (0, 0)), "several ranks of node 0 share gpu:0"),
    ("ring", MIXED, "unknown --comm 'ring'"),
])
def test_impossible_strategies_are_refused(choice, placement, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_strategy(choice, placement)


def test_ranks_sharing_a_gpu_may_only_use_host_staged_mpi():
    """Two ranks on one GPU: MPI through host buffers works; every strategy that may put them in one
    NCCL group (which needs a GPU per rank) is refused."""
    shared = Placement(("gpu:0", "gpu:0"), (0, 0))
    check_strategy("mpi", shared)  # raises nothing
    for choice in ("auto", "nccl", "hierarchical", "gpu-side"):
        with pytest.raises(UserError, match="several ranks of node 0 share gpu:0"):
            check_strategy(choice, shared)


def test_device_is_one_value_or_one_per_rank():
    assert device_of_rank("gpu", 2, 3) == "gpu"
    assert device_of_rank("cpu,gpu,gpu", 0, 3) == "cpu"
    assert device_of_rank("cpu,gpu,gpu", 2, 3) == "gpu"
    with pytest.raises(UserError, match="once per rank"):
        device_of_rank("cpu,gpu", 0, 3)
    with pytest.raises(UserError, match="got 'tpu'"):
        device_of_rank("tpu", 0, 1)


def test_nccl_on_cpu_ranks_is_a_one_line_error():
    assert_one_line_error(train_cli(2, *LENET, "--comm", "nccl"), "--comm nccl needs every rank on a GPU")


def test_timing_the_candidates_keeps_the_faster_and_releases_the_other():
    """A mixed job's --comm auto times a flat and a two-level communicator: the one kept
    still sums, and a two-level one that lost leaves no MPI communicator behind."""
    result = run(2, [os.path.join(REPO, "tests", "programs", "fastest_candidate.py")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fastest ok" in result.stdout


def test_hierarchical_strategy_trains_as_one_process(tmp_path):
    """--comm hierarchical on the CPU ranks of one node (one group, led by rank 0, summed with MPI) gives the
    weights, batch-norm statistics and validation figures of one process."""
    weights, output = train_small_output(tmp_path, 2, "--comm", "hierarchical")
    assert "hierarchical strategy" in output and "summed in 1 group(s)" in output
    assert_same_weights(train_small(tmp_path, 1), weights)


def test_a_traced_hierarchical_run_probes_the_machine_and_records_its_strategy(tmp_path):
    """The machine-state probes of a traced run go over MPI (a probe over a two-level communicator
    whose requests completed only when waited for never ended), and the trace says that the
    buckets were reduced during backward, for the model."""
    trace = tmp_path / "trace"
    result = train_cli(2, *LENET, "--steps-per-epoch", "2", "--comm", "hierarchical", "--trace", str(trace),
                       "--run-dir", str(tmp_path / "runs"), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((trace / "meta.json").read_text())
    assert meta["strategy"] == "hierarchical" and meta["nodes"] == 1 and meta["reduces_during_backward"]
    assert meta["machine_state"]["allreduce_seconds"] > 0
    # The kernel probe, as the run started and ended, timed every kernel of the zoo's steps,
    # each call with its cost.
    assert len(meta["kernel_probes"]) == 2
    for probed in meta["kernel_probes"]:
        assert {"gemm", "im2col", "batchnorm_sums", "maxpool", "add", "sgd_update", "adam_update"} <= set(
            probed["calls"])
        assert all(seconds > 0 for seconds in probed["calls"]["im2col"]["seconds"])
        assert len(probed["outside"]) == 8 * 2  # each network's step, on each of the 2 probing ranks
        assert probed["meeting_ranks"] == 2  # which ran together, as the job's ranks do
        assert [samples for samples, _ in probed["data"]["digits"]] == [16, 64, 16, 64]
