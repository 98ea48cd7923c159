"""Fault injection, for testing a job's failure handling: a failing, a hanging and a slower rank."""
from __future__ import annotations

import time
from dataclasses import dataclass

from pydtnn_lite.data import Dataset, SlowedDataset
from pydtnn_lite.training.trainer import StepResult

STALL_SECONDS = 600  # long enough for any --collective-timeout under test to fire first


@dataclass(frozen=True)
class FaultInjection:
    """``failure``: (rank, global step) after which that rank raises; ``stall``: (rank, step)
    after which it hangs; ``delay``: (rank, seconds) of extra loading per sample on that rank."""

    failure: tuple[int, int] | None = None
    stall: tuple[int, int] | None = None
    delay: tuple[int, float] | None = None

    def slowed(self, data: Dataset, rank: int) -> Dataset:
        """``data``, loading slower on the delayed rank."""
        if self.delay is not None and self.delay[0] == rank:
            return SlowedDataset(data, self.delay[1])
        return data

    def after_step(self, rank: int, global_step: int, result: StepResult) -> None:
        """The step callback of ``rank``: fail or hang where asked to."""
        if self.failure == (rank, global_step):
            raise RuntimeError(f"failure injected by --inject-failure after step {global_step}")
        if self.stall == (rank, global_step):
            time.sleep(STALL_SECONDS)
