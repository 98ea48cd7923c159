"""Shares of the global batch: fixed by --partition, or following measured speeds (--balance)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from pydtnn_lite.training.balance import LoadBalancer, step_seconds

from mpi import assert_one_line_error, assert_same_weights, train_cli

LENET = ("--model", "lenet", "--dataset", "digits", "--batch-size", "64", "--eval-steps", "0")


def test_step_time_is_set_by_the_slowest_rank():
    assert step_seconds([1, 1], [1.0, 3.0]) == pytest.approx(0.5)
    assert step_seconds([1, 3], [1.0, 3.0]) == pytest.approx(0.25)  # shares follow speeds: all finish together


def test_balancer_weights_follow_smoothed_speeds_when_it_pays():
    balancer = LoadBalancer(2, warmup=3, every=2, smoothing=0.5)
    balancer.observe([32, 32], [9.0, 9.0])  # the first step is ignored
    balancer.observe([32, 32], [1.0, 3.0])
    assert balancer.propose([1, 1]) is None  # still warming up
    balancer.observe([32, 32], [1.0, 2.0])
    # speeds: (32, 10.67) then halfway to (32, 16) -> (32, 13.33)
    np.testing.assert_allclose(balancer.speeds, [32.0, 13.333333], rtol=1e-6)
    np.testing.assert_allclose(balancer.propose([1, 1]), [1.0, 13.333333 / 32], rtol=1e-6)
    balancer.observe([40, 24], [1.25, 1.8])
    assert balancer.propose([1, 0.4]) is None  # not due (every 2 steps)
    balancer.observe([40, 24], [1.25, 1.8])
    assert balancer.propose([1, 0.42]) is None  # due, but the gain is under 5 %


def test_an_empty_share_keeps_the_last_speed():
    balancer = LoadBalancer(2, warmup=1, every=1)
    balancer.observe([8, 8], [1.0, 1.0])
    balancer.observe([8, 8], [1.0, 4.0])
    balancer.observe([16, 0], [2.0, 0.0])
    np.testing.assert_allclose(balancer.speeds, [8.0, 2.0])


def load(path):
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def test_fixed_uneven_partition_equals_one_process(tmp_path):
    common = (*LENET, "--steps-per-epoch", "3", "--run-dir", str(tmp_path))
    single = train_cli(1, *common, "--save-weights", str(tmp_path / "one.npz"))
    three = train_cli(3, *common, "--partition", "10,20,34", "--save-weights", str(tmp_path / "three.npz"))
    assert single.returncode == 0 and three.returncode == 0, three.stderr[-2000:]
    assert "per-rank shares [10, 20, 34]" in three.stdout
    assert_same_weights(load(tmp_path / "one.npz"), load(tmp_path / "three.npz"))


@pytest.mark.parametrize("prefetch", ["0", "2"])
def test_a_slower_rank_gets_a_smaller_share_and_the_weights_stay_exact(tmp_path, prefetch):
    # 2 ms of loading per sample against well under 0.5 ms of compute: read in the step (--prefetch 0)
    # or read ahead (--prefetch 2, where the loading overlaps the step and the time between steps),
    # the delayed rank is many times slower. The first re-weighting follows one step's measurement
    # (a busy machine can slow the other rank too); every later one follows smoothed speeds.
    common = (*LENET, "--steps-per-epoch", "12", "--run-dir", str(tmp_path), "--prefetch", prefetch)
    single = train_cli(1, *common, "--save-weights", str(tmp_path / "one.npz"))
    balanced = train_cli(2, *common, "--balance", "--balance-warmup", "2", "--balance-every", "3",
                         "--inject-delay", "1:2", "--save-weights", str(tmp_path / "two.npz"))
    assert single.returncode == 0 and balanced.returncode == 0, balanced.stderr[-2000:]
    changes = [tuple(map(int, change)) for change in
               re.findall(r"per-rank shares now \[(\d+), (\d+)\]", balanced.stdout)]
    assert changes, balanced.stdout
    assert all(fast + slow == 64 for fast, slow in changes) and changes[0][1] < changes[0][0], changes
    assert all(slow < fast / 3 for fast, slow in changes[1:]), changes
    assert_same_weights(load(tmp_path / "one.npz"), load(tmp_path / "two.npz"))


@pytest.mark.parametrize("flags,message", [
    (("--partition", "1,2,3"), "--partition needs 2 weights (one per rank), got 3"),
    (("--partition", "1,x"), "argument --partition: must be comma-separated numbers"),
    (("--inject-delay", "1"), "argument --inject-delay: must be RANK:VALUE"),
    (("--balance-every", "0"), "argument --balance-every: must be an integer at least 1, got '0'"),
])
def test_bad_partition_flags(tmp_path, flags, message):
    assert_one_line_error(train_cli(2, *LENET, "--run-dir", str(tmp_path), *flags, cwd=str(tmp_path)), message)
