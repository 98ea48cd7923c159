"""Which samples each rank trains on at each step.

The global batch of step s in epoch e is a contiguous run of a permutation seeded by
(seed, e), the same on every rank; rank r takes its share of that run. Shares follow
``partition``; a short last batch is shared the same way, and a rank whose share is
empty still takes part in the step's collectives.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def partition(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` samples in proportion to ``weights`` (largest-remainder rounding, sums exactly)."""
    ratios = np.asarray(weights, dtype=np.float64)
    if total < 0 or len(ratios) == 0 or (ratios < 0).any() or ratios.sum() <= 0:
        raise ValueError(f"cannot split {total} samples by weights {list(ratios)}")
    exact = total * ratios / ratios.sum()
    shares = np.floor(exact).astype(int)
    for index in np.argsort(-(exact - shares), kind="stable")[: total - shares.sum()]:
        shares[index] += 1
    return shares.tolist()


def local_rows(batch_size: int, weights: Sequence[float], rank: int) -> slice:
    """Rows of a global batch of ``batch_size`` that ``rank`` trains on, shares following ``weights``."""
    shares = partition(batch_size, weights)
    start = sum(shares[:rank])
    return slice(start, start + shares[rank])


@dataclass
class EpochSampler:
    """Global-batch schedule of one data set: ``steps_per_epoch`` steps of ``global_batch`` samples."""

    num_samples: int
    global_batch: int
    seed: int = 0
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ValueError(f"the batch size must be at least 1, got {self.global_batch}")
        if self.num_samples < 1:
            raise ValueError("the data set is empty")

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.num_samples // self.global_batch)  # rounded up: the last batch may be short

    def order(self, epoch: int) -> np.ndarray:
        """Sample order of ``epoch``: identical on every rank (computed once per epoch)."""
        if getattr(self, "_order_epoch", None) != epoch:
            self._order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
                           if self.shuffle else np.arange(self.num_samples))
            self._order_epoch = epoch
        return self._order

    def batch(self, epoch: int, step: int) -> np.ndarray:
        """Indices of the global batch of ``step`` in ``epoch``."""
        start = (step % self.steps_per_epoch) * self.global_batch
        return self.order(epoch)[start:start + self.global_batch]
