"""Run programs under the mpiexec of the Python environment running the tests, and check what they leave."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_SMALL = os.path.join(REPO, "tests", "programs", "train_small.py")


def run(ranks: int, args: Sequence[str], timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python args...``; output captured as text."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def train_cli(ranks: int, *flags: str, timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess:
    """The trainer's command line under mpiexec."""
    return run(ranks, ["-m", "pydtnn_lite.train", "--no-progress", *flags], timeout=timeout, cwd=cwd)


def train_small(directory, ranks: int, *flags: str) -> dict[str, np.ndarray]:
    """Final weights of ``programs/train_small.py`` run on ``ranks`` ranks with ``flags``."""
    return train_small_output(directory, ranks, *flags)[0]


def train_small_output(directory, ranks: int, *flags: str) -> tuple[dict[str, np.ndarray], str]:
    """Final weights of ``programs/train_small.py`` on ``ranks`` ranks with ``flags``, and what it printed."""
    out = directory / f"weights-{ranks}-{'-'.join(flags) or 'default'}.npz"
    result = run(ranks, [TRAIN_SMALL, str(out), *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as archive:
        return {name: archive[name] for name in archive.files}, result.stdout


def assert_same_weights(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> None:
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


def assert_one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    """The job exited 2 with ``message`` in one error line (rank 0's alone) and no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "error:" in line]
    assert len(errors) == 1, result.stdout + result.stderr
    assert message in errors[0]
    assert "Traceback" not in result.stderr
