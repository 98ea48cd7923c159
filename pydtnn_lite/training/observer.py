"""The training loop's hook points: how an observer (the tracer) learns what runs when.

A :class:`~pydtnn_lite.training.Trainer` calls its ``observer`` at the start and end of
every training step and evaluation, and routes its two pieces of host work, reading the
batch and copying it to the device, through :meth:`TrainingObserver.run`; a batch read
ahead on the prefetching thread is reported afterwards, by :meth:`TrainingObserver.done_elsewhere`. The base class
observes nothing and adds one method call, so an untraced trainer pays nothing to speak
of. Compute kernels and collectives are observed elsewhere, from outside the code that
calls them (``kernels.instrument`` and a wrapping communicator).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydtnn_lite.costs import DATA_LOAD, H2D_COPY

__all__ = ["TRAIN", "EVAL", "DATA_LOAD", "H2D_COPY", "TrainingObserver", "NO_OBSERVER"]

TRAIN, EVAL = "train", "eval"  # the phases of a step

T = TypeVar("T")


class TrainingObserver:
    """Observes nothing: the hook points a trainer calls, for a subclass to override."""

    def step_started(self, phase: str, step: int, samples: int) -> None:
        """A step of ``phase`` (TRAIN, or EVAL for a whole evaluation) begins, on ``samples`` local samples.

        Called again, with the same step, when a step begun by loading its batch starts
        computing: an observer keeps the step it already has.
        """

    def step_finished(self) -> None:
        """The step (or evaluation) begun last has ended."""

    def run(self, kernel: str, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)``, the host work named ``kernel`` (DATA_LOAD or H2D_COPY)."""
        return function(*args)

    def done_elsewhere(self, kernel: str, started: float, finished: float) -> None:
        """Host work ``kernel`` (DATA_LOAD) for the current step ran on another thread, from
        ``started`` to ``finished`` (time.perf_counter seconds)."""


NO_OBSERVER = TrainingObserver()
