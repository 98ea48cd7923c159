"""Run programs under the mpiexec of the Python environment running the tests."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(ranks: int, args: Sequence[str], timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python args...``; output captured as text."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def train_cli(ranks: int, *flags: str, timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess:
    """The trainer's command line under mpiexec."""
    return run(ranks, ["-m", "pydtnn_lite.train", "--no-progress", *flags], timeout=timeout, cwd=cwd)
