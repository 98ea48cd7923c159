"""Training on GPUs: CuPy ranks, NCCL, host-staged and mixed CPU+GPU jobs. Skipped without a GPU."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pydtnn_lite.backend import gpu_available

from mpi import REPO, run, train_cli, train_small

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def assert_close_weights(expected: dict, actual: dict) -> None:
    """cuBLAS and BLAS sum in different orders: float32 results agree to about 1e-4 after a few steps."""
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=2e-3, atol=2e-4, err_msg=name)


@pytest.fixture(scope="module")
def cpu_single(tmp_path_factory):
    return train_small(tmp_path_factory.mktemp("cpu"), 1)


def test_one_gpu_trains_as_the_cpu(cpu_single, tmp_path):
    assert_close_weights(cpu_single, train_small(tmp_path, 1, "--device", "gpu"))


# Not the bare id "mpi": pytest-mpi skips a test whose keywords hold "mpi" unless run --with-mpi.
@pytest.mark.parametrize("strategy", ["mpi", "gpu-side", "auto"], ids=["comm-mpi", "comm-gpu-side", "comm-auto"])
def test_a_cpu_rank_and_a_gpu_rank_train_as_one_process(cpu_single, tmp_path, strategy):
    assert_close_weights(cpu_single, train_small(tmp_path, 2, "--device", "cpu,gpu", "--comm", strategy))


def test_gpu_ranks_sharing_a_gpu_reduce_through_the_host(cpu_single, tmp_path):
    assert_close_weights(cpu_single, train_small(tmp_path, 2, "--device", "gpu", "--comm", "mpi"))


def test_nccl_collectives():
    ranks = min(gpus(), 2)
    result = run(ranks, [os.path.join(REPO, "tests", "programs", "nccl_collectives.py")])
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(not gpu_available() or gpus() < 2, reason="NCCL needs a GPU per rank: two GPUs")
def test_two_nccl_ranks_train_as_one_process(cpu_single, tmp_path):
    assert_close_weights(cpu_single, train_small(tmp_path, 2, "--device", "gpu", "--comm", "nccl"))


def test_gpu_training_from_the_command_line_with_a_trace(tmp_path):
    trace = tmp_path / "trace"
    result = train_cli(1, "--model", "vgg11", "--device", "gpu", "--batch-size", "32", "--steps-per-epoch", "3",
                       "--eval-steps", "1", "--trace", str(trace))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "device gpu:" in result.stdout
    summary = (trace / "summary.csv").read_text()
    assert "gemm" in summary and "im2col" in summary
