"""Shares of the global batch that follow each rank's measured speed.

In a synchronous step every rank waits for the slowest, so a step lasts
``max_r(b_r / v_r)`` for shares ``b_r`` and speeds ``v_r`` (samples per second of work).
Shares proportional to the speeds make every rank finish together. Speeds are measured
on the training steps themselves: each rank's busy time (loading, forward, backward and
update, without the time blocked in collectives) over the samples it trained; with batches
read ahead, at least the time its loader took to read the batch, since a rank whose data
arrives late cannot go faster than its loader, however the reading overlaps. They are
smoothed, and shares change only when the change is predicted to pay, so noise does not
move samples back and forth. Every rank sees the same measurements (they are summed over
ranks) and so computes the same shares: the ranks never disagree on the partition.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


def step_seconds(weights: npt.ArrayLike, speeds: npt.ArrayLike) -> float:
    """Relative step time of shares proportional to ``weights`` on ranks of ``speeds``."""
    shares = np.asarray(weights, dtype=np.float64)
    shares = shares / shares.sum()
    return float(np.max(shares / np.asarray(speeds, dtype=np.float64)))


@dataclass
class LoadBalancer:
    """Decides every ``every`` steps, after ``warmup`` steps, whether to re-weight the shares.

    ``smoothing`` is the weight of the newest measurement in the running speed of each
    rank; ``min_gain`` the predicted fraction of the step time a change must save.
    ``speeds`` holds NaN for a rank until it has been measured.
    """

    ranks: int
    warmup: int = 3
    every: int = 10
    smoothing: float = 0.5
    min_gain: float = 0.05
    speeds: np.ndarray = field(init=False)
    observed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.speeds = np.full(self.ranks, np.nan)

    def observe(self, samples: npt.ArrayLike, busy_seconds: npt.ArrayLike) -> None:
        """Add one step's samples and busy seconds of every rank (a rank with no samples keeps its speed)."""
        counts = np.asarray(samples, dtype=np.float64)
        busy = np.maximum(np.asarray(busy_seconds, dtype=np.float64), 1e-9)
        self.observed += 1
        if self.observed <= 1:  # the first step pays one-off costs (allocation, caches)
            return
        measured = counts / busy
        smoothed = np.where(np.isnan(self.speeds), measured,
                            (1 - self.smoothing) * self.speeds + self.smoothing * measured)
        self.speeds = np.where(counts > 0, smoothed, self.speeds)

    def propose(self, weights: Sequence[float]) -> list[float] | None:
        """New share weights when they are due and predicted to save ``min_gain``; else None."""
        due = self.observed >= self.warmup and (self.observed - self.warmup) % self.every == 0
        if not due or np.isnan(self.speeds).any():
            return None
        proposal = [float(v) for v in self.speeds / self.speeds.max()]
        if step_seconds(proposal, self.speeds) <= (1 - self.min_gain) * step_seconds(weights, self.speeds):
            return proposal
        return None
