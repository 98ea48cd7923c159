"""Ctrl-C in a terminal reaches every rank of an mpiexec job: one line, status 130, outputs released."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pydtnn_lite import interruption
from pydtnn_lite.output_lock import LOCK_NAME

from mpi import MPIEXEC


def test_ctrl_c_ends_every_rank_with_one_line_and_status_130(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "pydtnn_lite.train", "--no-progress",
                            "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0",
                            "--epochs", "1000", "--run-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(ckpt)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 60
    while not (ckpt / "checkpoint.npz").exists():  # training, past its first epoch
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the launcher and every rank
    started = time.monotonic()
    out, err = job.communicate(timeout=30)
    assert time.monotonic() - started < 15
    assert job.returncode == 130, err
    ours = [line for line in (out + err).splitlines() if "pydtnn_lite" in line]
    assert len(ours) == 1 and "pydtnn_lite.train: interrupted at step" in ours[0], out + err
    assert "Traceback" not in err and "failed" not in err
    assert not (ckpt / LOCK_NAME).exists()


def frame_of(path: str):
    """A frame whose code claims to come from ``path``."""
    scope: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", path, "exec"), scope)
    return scope["frame"]


def test_ctrl_c_inside_numba_s_compiler_comes_again_once_it_has_returned(monkeypatch):
    """A KeyboardInterrupt inside llvmlite's callbacks left a run hung in its first kernel call."""
    resent = []

    class Timer:
        def __init__(self, seconds, function, args):
            resent.append((seconds, function, args))

        def start(self):
            pass

    monkeypatch.setattr(interruption.threading, "Timer", Timer)
    for path in (f"{os.sep}venv{os.sep}numba{os.sep}core{os.sep}dispatcher.py",
                 f"{os.sep}venv{os.sep}llvmlite{os.sep}binding{os.sep}executionengine.py"):
        interruption._interrupt(signal.SIGINT, frame_of(path))  # deferred: no exception
    assert resent == [(interruption.RETRY_SECONDS, os.kill, (os.getpid(), signal.SIGINT))] * 2
    with pytest.raises(KeyboardInterrupt):
        interruption._interrupt(signal.SIGINT, frame_of(f"{os.sep}work{os.sep}pydtnn_lite{os.sep}train.py"))
    assert len(resent) == 2
