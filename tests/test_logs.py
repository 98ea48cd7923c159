"""A run's messages: Python's logging with a rank prefix, timestamps off a terminal, no bar in a log file."""
from __future__ import annotations

import io
import re

from pydtnn_lite.logs import setup_logging
from pydtnn_lite.progress import ProgressBar, StepLines, make_progress
from pydtnn_lite.training import StepResult

from mpi import run, train_cli

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_file_gets_timestamps_and_the_rank_a_terminal_the_message_alone():
    log_file, terminal = io.StringIO(), Terminal()
    setup_logging("info", rank=1, size=4, stream=log_file).info("hello")
    assert re.fullmatch(STAMP + r"\[rank 1/4\] hello\n", log_file.getvalue())
    logger = setup_logging("warning", stream=terminal)
    logger.info("quiet")
    logger.warning("loud")
    assert terminal.getvalue() == "loud\n"


def test_step_lines_come_every_n_steps_and_after_the_last():
    stream = io.StringIO()
    setup_logging("info", stream=stream)
    lines = make_progress("epoch 1/1", steps=7, done=0, every=3, terminal=False)
    assert isinstance(lines, StepLines)
    for step in range(1, 8):
        lines.after_step(step, StepResult(0.5, 0.25, 10, 0.1))
    steps = re.findall(r"step (\d)/7 \(global (\d)\): loss 0.5000, accuracy 25.00%, 100.0 img/s", stream.getvalue())
    assert steps == [("3", "3"), ("6", "6"), ("7", "7")]
    assert isinstance(make_progress("epoch 1/1", 7, 0, 3, terminal=True), ProgressBar)


def test_a_job_writing_to_a_file_logs_plain_lines_with_time_and_rank(tmp_path):
    result = run(2, ["-m", "pydtnn_lite.train", "--model", "lenet", "--dataset", "digits", "--batch-size", "16",
                     "--steps-per-epoch", "4", "--eval-steps", "0", "--run-dir", str(tmp_path), "--log-every", "2"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stdout + result.stderr
    steps = re.findall(STAMP + r"\[rank 0/2\] epoch 1/1 step (\d)/4", result.stdout)
    assert steps == ["2", "4"]
    assert "this rank:" not in result.stdout  # a debug line


def test_debug_lines_come_from_every_rank(tmp_path):
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "1",
                       "--eval-steps", "0", "--run-dir", str(tmp_path), "--log-level", "debug")
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in (0, 1):
        assert f"[rank {rank}/2] this rank: device cpu, 8 of each batch's samples" in result.stdout
    quiet = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "1",
                      "--eval-steps", "0", "--run-dir", str(tmp_path), "--log-level", "warning")
    assert quiet.returncode == 0 and "epoch 1/1" not in quiet.stdout
