"""P ranks train exactly as one rank with the same global batch (spawned mpiexec jobs)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi import REPO, run

PROGRAM = os.path.join(REPO, "tests", "programs", "train_small.py")


def train(tmp_path, ranks, *flags):
    out = tmp_path / f"weights-{ranks}-{'-'.join(flags) or 'default'}.npz"
    result = run(ranks, [PROGRAM, str(out), *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as archive:
        return {name: archive[name] for name in archive.files}


def assert_same_weights(expected, actual):
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), 1)


def test_training_moves_the_weights(single, tmp_path):
    """Guards the comparisons below: one step must change what they compare."""
    before = train(tmp_path, 1, "--steps", "0")
    assert any(not np.allclose(before[k], single[k]) for k in single)


@pytest.mark.parametrize("ranks,flags", [(2, ()), (2, ("--no-overlap",)), (4, ()), (4, ("--no-overlap",))])
def test_ranks_equal_one_process(single, tmp_path, ranks, flags):
    """24 samples over 2 or 4 ranks, BN statistics and dropout masks included, overlap on and off."""
    assert_same_weights(single, train(tmp_path, ranks, *flags))


def test_uneven_shares_equal_one_process(single, tmp_path):
    """3 ranks holding 4, 8 and 12 of the 24 samples of each batch."""
    assert_same_weights(single, train(tmp_path, 3, "--weights", "1", "2", "3"))


def test_a_rank_with_an_empty_share(single, tmp_path):
    """A rank holding no sample (weight 0) still joins every collective, and the result is unchanged."""
    assert_same_weights(single, train(tmp_path, 3, "--weights", "1", "1", "0"))
