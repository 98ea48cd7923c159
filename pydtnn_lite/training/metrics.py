"""Per-step figures of a run: ``metrics.csv`` in the run directory, and TensorBoard events with --tensorboard.

Rank 0 writes them; the figures are global (every rank's samples) already. A line is
flushed as each step ends, so a run that stops early keeps every step it trained, and
a resumed run appends to the file it finds.
"""
from __future__ import annotations

import csv
import os
from typing import Any

from pydtnn_lite.errors import UserError
from pydtnn_lite.training.trainer import StepResult

METRICS_FILE = "metrics.csv"
COLUMNS = ("run_id", "step", "epoch", "loss", "accuracy", "learning_rate", "images_per_second", "step_seconds")
TENSORBOARD_HINT = "pip install 'pydtnn_lite[tensorboard]' (tensorboardX), or drop --tensorboard"


def tensorboard_writer(directory: str) -> Any:
    """A tensorboardX SummaryWriter of event files in ``directory``; UserError when tensorboardX is missing."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise UserError(f"--tensorboard writes with tensorboardX, which is not installed: {TENSORBOARD_HINT}") from None
    return SummaryWriter(logdir=directory, flush_secs=10)


class StepMetrics:
    """Writes each training step's loss, accuracy, learning rate, images/s and step time to
    ``directory/metrics.csv`` and, when ``tensorboard``, to TensorBoard event files there; each
    line names the run (``run_id``) that wrote it."""

    def __init__(self, directory: str, tensorboard: bool = False, run_id: str = "") -> None:
        self.run_id = run_id
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, METRICS_FILE)
        self.writer = tensorboard_writer(directory) if tensorboard else None
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self.file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115  (closed by close())
        self.rows = csv.writer(self.file)
        if new:
            self.rows.writerow(COLUMNS)
            self.file.flush()

    def step(self, global_step: int, epoch: int, result: StepResult, learning_rate: float) -> None:
        """Record training step ``global_step`` (counted from 1) of ``epoch`` (from 1)."""
        rate = result.samples / max(result.seconds, 1e-9)
        values = {"loss": result.loss, "accuracy": result.accuracy, "learning_rate": learning_rate,
                  "images_per_second": rate, "step_seconds": result.seconds}
        self.rows.writerow([self.run_id, global_step, epoch, *(f"{values[name]:.6g}" for name in COLUMNS[3:])])
        self.file.flush()
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(f"train/{name}", value, global_step)

    def validation(self, global_step: int, result: StepResult) -> None:
        """Record an evaluation after ``global_step`` (TensorBoard only: the CSV holds training steps)."""
        if self.writer is not None:
            self.writer.add_scalar("validation/loss", result.loss, global_step)
            self.writer.add_scalar("validation/accuracy", result.accuracy, global_step)

    def close(self) -> None:
        """Flush and close the files."""
        self.file.close()
        if self.writer is not None:
            self.writer.close()
