"""Rank 0's report of an epoch's steps: a tqdm bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns, which a log file (SLURM's output) keeps as
one long garbled line per refresh; there a line every N steps says the same.
"""
from __future__ import annotations

import sys

from pydtnn_lite.logs import LOGGER
from pydtnn_lite.training import StepResult


def rate(result: StepResult) -> float:
    """Images per second of one step."""
    return result.samples / max(result.seconds, 1e-9)


class ProgressBar:
    """A tqdm bar over one epoch's steps: loss, accuracy and images/s of the last step."""

    def __init__(self, label: str, steps: int, done: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=steps, initial=done, desc=label, unit="step", dynamic_ncols=True, file=sys.stderr)

    def after_step(self, global_step: int, result: StepResult) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{result.loss:.4f}", acc=f"{result.accuracy:.1%}", img_s=f"{rate(result):.1f}")

    def close(self) -> None:
        self.bar.close()


class StepLines:
    """One log line every ``every`` steps of an epoch, and after its last step."""

    def __init__(self, label: str, steps: int, done: int, every: int) -> None:
        self.label, self.steps, self.step, self.every = label, steps, done, every

    def after_step(self, global_step: int, result: StepResult) -> None:
        self.step += 1
        if self.step % self.every == 0 or self.step == self.steps:
            LOGGER.info(f"{self.label} step {self.step}/{self.steps} (global {global_step}): loss {result.loss:.4f}, "
                        f"accuracy {result.accuracy:.2%}, {rate(result):.1f} img/s")

    def close(self) -> None:
        """Nothing to close: every line is already written."""


def make_progress(label: str, steps: int, done: int, every: int,
                  terminal: bool | None = None) -> ProgressBar | StepLines:
    """A bar when stdout is a ``terminal`` (default: ask it), else lines every ``every`` steps."""
    if terminal is None:
        terminal = sys.stdout.isatty()
    return ProgressBar(label, steps, done) if terminal else StepLines(label, steps, done, every)
