"""P ranks train exactly as one rank with the same global batch (spawned mpiexec jobs)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mpi import REPO, assert_same_weights, run, train_small


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train_small(tmp_path_factory.mktemp("single"), 1)


def test_training_moves_the_weights(single, tmp_path):
    """Guards the comparisons below: one step must change what they compare."""
    before = train_small(tmp_path, 1, "--steps", "0")
    assert any(not np.allclose(before[k], single[k]) for k in single)


@pytest.mark.parametrize("ranks,flags", [(2, ()), (2, ("--no-overlap",)), (4, ()), (4, ("--no-overlap",))])
def test_ranks_equal_one_process(single, tmp_path, ranks, flags):
    """24 samples over 2 or 4 ranks, BN statistics, dropout masks and validation figures included, overlap on
    and off."""
    assert_same_weights(single, train_small(tmp_path, ranks, *flags))


def test_uneven_shares_equal_one_process(single, tmp_path):
    """3 ranks holding 4, 8 and 12 of the 24 samples of each batch."""
    assert_same_weights(single, train_small(tmp_path, 3, "--weights", "1", "2", "3"))


def test_a_rank_with_an_empty_share(single, tmp_path):
    """A rank holding no sample (weight 0) still joins every collective, and the result is unchanged."""
    assert_same_weights(single, train_small(tmp_path, 3, "--weights", "1", "1", "0"))


@pytest.mark.parametrize("ranks,flags", [
    (3, ("--staged",)),
    (3, ("--staged", "--no-overlap")),
    (3, ("--leaders", "0", "0", "2")),  # a group of two and a rank alone
    (4, ("--leaders", "1", "1", "3", "3")),  # leaders that are not the lowest rank of the job
    (4, ("--leaders", "0", "0", "0", "0", "--no-overlap")),  # one group: no leader level
])
def test_host_staged_and_two_level_reductions_equal_one_process(single, tmp_path, ranks, flags):
    """The reductions of GPU ranks (host-staged, hierarchical, gpu-side), run with MPI at every level."""
    assert_same_weights(single, train_small(tmp_path, ranks, *flags))


def test_float32_batchnorm_far_from_zero_on_ranks_equals_one_process(tmp_path):
    """Inputs near 1e4 shared 4/8/12 over 3 ranks: unit spread, and one process's outputs,
    input gradients and running statistics, in both steps."""
    program = os.path.join(REPO, "tests", "programs", "batchnorm_ranks.py")
    results = {}
    for ranks in (1, 3):
        out = tmp_path / f"bn-{ranks}.npz"
        result = run(ranks, [program, str(out)])
        assert result.returncode == 0, result.stderr[-3000:]
        with np.load(out) as archive:
            results[ranks] = {name: archive[name] for name in archive.files}
    for step_outputs in results[3]["outputs"]:
        np.testing.assert_allclose(step_outputs.reshape(-1, 3).std(axis=0, dtype=np.float64), 1.0, atol=1e-3)
    for name, expected in results[1].items():
        np.testing.assert_allclose(results[3][name], expected, rtol=1e-4, atol=1e-4, err_msg=name)
