"""The wait for the slowest rank at every point where the ranks synchronise.

Two ranks never compute at exactly the same speed: the same work takes a little longer
on one than on the other, differently in every stretch (other jobs, the memory system,
the operating system). A blocking collective ends only when the last rank arrives, so
the other ranks wait, and a step pays that wait once for each synchronising collective:
the batch-norm reductions in FP and BP, and the gradient and loss reductions at the end.

The wait after a stretch of T seconds of work grows with T, but no faster than T: the
calibration measures the ranks' mean wait at a barrier after each probe step and fits
``wait = coefficient * T ** exponent`` (docs/performance-model.md, 'Synchronisation: the
wait for the slowest rank'). The exponent is held between 1/2 (ranks whose speeds wander
independently from moment to moment) and 1 (a rank slower by the same fraction all
along): a step's stretches run up to ten times longer than the probes', and a power fitted
beyond those bounds over the probes' narrow range (2.1 in one calibration, from probe
steps of 45-220 ms) predicted a wait of 180 ms at the end of an 8-rank VGG11 step of
580 ms, whose communication, waits included, measured 160 ms.

For P ranks whose times vary independently, the mean wait is the expected maximum of P
draws minus their mean, i.e. sigma * E[max of P standard normals]; so a wait measured on
``ranks`` ranks is scaled to P ranks by the ratio of those expected maxima
(:func:`expected_maximum`): 0.56 for 2 ranks, 1.03 for 4, 1.42 for 8, 2.34 for 64.

A core that stays slower than the others by the same fraction is another matter: its
wait is ``imbalance * T`` on any number of ranks, and none where ranks time-share the
cores. The calibration's fit holds both, so the part its own cores' imbalance explains
is taken off before the rest is scaled, and the run's imbalance is added back
(``AdjustedMachine.sync_wait_seconds``).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@functools.cache
def expected_maximum(procs: int) -> float:
    """E[max of ``procs`` independent standard normal draws] (0 for one draw)."""
    if procs <= 1:
        return 0.0
    x, step = np.linspace(-12.0, 12.0, 48001, retstep=True)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    density = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    # E[max] = integral of x P pdf(x) cdf(x)**(P-1); smooth and vanishing at both ends of the
    # grid, so a plain sum is as exact as the trapezoidal rule.
    integrand = x * procs * density * cdf ** (procs - 1)
    return float(integrand.sum() * step)


@dataclass(frozen=True)
class SyncWaitModel:
    """Mean seconds each rank waits for the slowest at a synchronisation after ``segment``
    seconds of work: ``coefficient * segment ** exponent`` on ``ranks`` ranks, scaled to
    other rank counts by :func:`expected_maximum`."""

    coefficient: float
    exponent: float
    ranks: int

    def seconds(self, segment: float, procs: int, imbalance: float = 0.0) -> float:
        """The fitted wait, less the part that cores apart in speed by ``imbalance`` all
        along explained on the calibration's ranks (``imbalance * segment``, see
        :meth:`~pydtnn_lite.perfmodel.modelling.drift.CoreRates.imbalance`): the rest, the
        ranks' independent wandering, scaled to ``procs`` ranks."""
        if procs <= 1 or segment <= 0:
            return 0.0
        scale = expected_maximum(procs) / expected_maximum(self.ranks)
        return scale * max(0.0, self.coefficient * segment ** self.exponent - imbalance * segment)

    def to_dict(self) -> dict:
        return {"coefficient": self.coefficient, "exponent": self.exponent, "ranks": self.ranks}

    @classmethod
    def from_dict(cls, data: dict) -> SyncWaitModel:
        return cls(float(data["coefficient"]), float(data["exponent"]), int(data["ranks"]))


NO_WAIT = SyncWaitModel(0.0, 1.0, 2)  # a machine whose ranks never wait for each other


EXPONENT_BOUNDS = (0.5, 1.0)  # independent wandering .. a constant slowdown (see above)


def fit_sync_wait(samples: Sequence[tuple[float, float]], ranks: int) -> SyncWaitModel:
    """A power law through (segment seconds, mean wait seconds) samples: its exponent the
    slope of a least-squares line in log-log (the shape, on relative errors), held within
    :data:`EXPONENT_BOUNDS` (outside them, the nearer bound); its coefficient the samples'
    summed wait over their summed ``segment ** exponent``, so that the model gives the mean
    wait. A step pays the sum of its waits, and waits are skewed, mostly short with a few
    long: the log-log line's own coefficient is their geometric mean, which put the 300 MiB
    Xeon's waits at 2.3 % of the segment where they averaged 5.2 %. A sample without a wait
    (a timer reading of 0) counts in the mean, not in the slope. No wait at all (one rank,
    or no samples) gives the model of no wait."""
    measured = [(segment, wait) for segment, wait in samples if segment > 0 and wait >= 0]
    usable = [(segment, wait) for segment, wait in measured if wait > 0]
    if ranks <= 1 or len(usable) < 2:
        return NO_WAIT
    log_segment, log_wait = np.log(np.array(usable)).T
    exponent = float(np.clip(np.polyfit(log_segment, log_wait, 1)[0], *EXPONENT_BOUNDS))
    coefficient = sum(wait for _, wait in measured) / sum(segment ** exponent for segment, _ in measured)
    return SyncWaitModel(float(coefficient), exponent, ranks)
