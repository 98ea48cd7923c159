"""One run per output directory: a second writer is refused, a dead run's lock is taken over."""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pydtnn_lite import output_lock
from pydtnn_lite.errors import UserError
from pydtnn_lite.output_lock import LOCK_NAME, Holder, OutputLock, lock_directory, process_start

from mpi import assert_one_line_error, train_cli

QUICK = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0")


def write_holder(directory, **fields) -> None:
    holder = dict(run_id="other-run", pid=os.getppid(), host=platform.node(), started="2026-01-01 00:00:00",
                  command="python -m pydtnn_lite.train", process_start=process_start(os.getppid()))
    holder.update(fields)
    (directory / LOCK_NAME).write_text(json.dumps(holder))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_holder_is_named_and_its_lock_kept(tmp_path):
    write_holder(tmp_path)
    with pytest.raises(UserError, match=r"--trace .* is in use by run other-run \(process \d+ on .*started "
                                        r"2026-01-01 00:00:00: python -m pydtnn_lite.train\)"):
        OutputLock(str(tmp_path), "--trace", "mine").acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["run_id"] == "other-run"


@pytest.mark.parametrize("holder", [
    {"pid": -1},  # replaced below by a process that has ended
    {"process_start": "1"},  # the process id lives on in another process
])
def test_the_lock_of_an_ended_run_is_taken_over(tmp_path, holder):
    write_holder(tmp_path, **({"pid": dead_pid()} if holder == {"pid": -1} else holder))
    lock = OutputLock(str(tmp_path), "--checkpoint-dir", "mine")
    note = lock.acquire()
    assert note is not None and "taking over the lock of run other-run" in note and "which has ended" in note
    assert json.loads((tmp_path / LOCK_NAME).read_text())["run_id"] == "mine"
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_torn_lock_record_is_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text('{"run_id": "x", "pi')
    assert "taking over" in OutputLock(str(tmp_path), "--trace", "mine").acquire()


def test_a_lock_held_from_another_host_is_never_taken_over(tmp_path):
    write_holder(tmp_path, host="some-other-node", pid=dead_pid())
    with pytest.raises(UserError, match=f"delete {tmp_path / LOCK_NAME}"):
        OutputLock(str(tmp_path), "--trace", "mine").acquire()


def test_one_process_locks_a_directory_once_whatever_flags_name_it(tmp_path, monkeypatch):
    monkeypatch.setattr(output_lock, "_held", {})
    assert lock_directory(str(tmp_path / "out"), "--trace", "mine") is None
    assert lock_directory(str(tmp_path / "out"), "--checkpoint-dir", "mine") is None
    assert Holder(**json.loads((tmp_path / "out" / LOCK_NAME).read_text())).pid == os.getpid()
    output_lock.release_all()
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def start_long_run(tmp_path, *flags: str) -> subprocess.Popen:
    """A training run that holds its outputs until it is interrupted, started once it holds them."""
    run = subprocess.Popen([sys.executable, "-m", "pydtnn_lite.train", "--no-progress", *QUICK, "--epochs", "1000",
                            "--run-dir", str(tmp_path / "runs"), *flags],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lock = tmp_path / "out" / LOCK_NAME
    deadline = time.monotonic() + 60
    while not lock.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.1)
    return run


def test_two_concurrent_writers_one_is_refused_and_nothing_is_mixed(tmp_path):
    outputs = ("--checkpoint-dir", str(tmp_path / "out"), "--trace", str(tmp_path / "out"))
    first = start_long_run(tmp_path, *outputs)
    try:
        second = train_cli(2, *QUICK, "--steps-per-epoch", "2", "--run-dir", str(tmp_path / "runs"), *outputs)
        assert_one_line_error(second, "--checkpoint-dir")
        assert "is in use by run" in second.stdout and f"process {first.pid}" in second.stdout
        assert not (tmp_path / "out" / "events.csv").exists()  # the refused run wrote nothing there
    finally:
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=60)
    # Ctrl-C: one line, status 130, the lock given back.
    assert first.returncode == 130, err
    assert [line for line in err.splitlines() if line.strip()] == [
        line for line in err.splitlines() if "interrupted at step" in line]
    assert "Traceback" not in err
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_a_killed_run_s_lock_and_unfinished_checkpoint_write_are_cleaned_up(tmp_path):
    run = start_long_run(tmp_path, "--checkpoint-dir", str(tmp_path / "out"))
    run.kill()
    run.communicate()
    (tmp_path / "out" / ".checkpoint-abc123.npz").write_bytes(np.zeros(1000).tobytes())  # a write cut short
    result = train_cli(1, *QUICK, "--steps-per-epoch", "2", "--run-dir", str(tmp_path / "runs"), "--checkpoint-dir",
                       str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "taking over the lock of run" in result.stdout and f"process {run.pid}" in result.stdout
    assert "removed 1 unfinished checkpoint write(s)" in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_NAME + ".guard", "checkpoint.npz"]
