"""Time a training step spends outside its compute kernels: the interpreter between calls,
and loading the batch.

Every kernel call costs the interpreter a little on top of the kernel itself: the layer's
method, the scope it runs in, the arguments, the loops of the network and optimizer. For
VGG11 that is a few percent of a step; for a small model (an MLP, LeNet), whose kernels
take microseconds, it is a large part of the step. So is reading the batch: the embedded
synthetic data set draws every image from its own generator. A prediction of the kernels
alone falls short for small models.

Both are affine: the calibration fits ``fixed + per_unit * units`` to the seconds of the
probes' steps that no traced call covers (units: the step's compute kernel calls), and to
the seconds of loading batches of each embedded data set (units: samples).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AffineCost:
    """Seconds of ``fixed + per_unit * units``."""

    fixed: float = 0.0
    per_unit: float = 0.0

    def seconds(self, units: float) -> float:
        return self.fixed + self.per_unit * units

    def to_dict(self) -> dict:
        return {"fixed": self.fixed, "per_unit": self.per_unit}

    @classmethod
    def from_dict(cls, data: dict) -> AffineCost:
        return cls(float(data["fixed"]), float(data["per_unit"]))


NO_COST = AffineCost()


def fit_affine(samples: Sequence[tuple[float, float]]) -> AffineCost:
    """Non-negative least squares of (units, seconds) samples, on relative errors (the
    samples span orders of magnitude); fewer than two samples fit none."""
    usable = [(units, seconds) for units, seconds in samples if units > 0 and seconds > 0]
    if len(usable) < 2:
        return NO_COST
    units, seconds = np.array(usable, dtype=float).T
    design = np.stack([np.ones_like(units), units], axis=1) / seconds[:, None]
    target = np.ones_like(seconds)
    # Two unknowns: the unconstrained solution, or the best with either term at zero.
    candidates = [np.linalg.lstsq(design, target, rcond=None)[0]]
    candidates += [np.array([float(design[:, 0] @ target / (design[:, 0] @ design[:, 0])), 0.0]),
                   np.array([0.0, float(design[:, 1] @ target / (design[:, 1] @ design[:, 1]))])]
    feasible = [solution for solution in candidates if (solution >= 0).all()]
    best = min(feasible, key=lambda solution: float(np.sum((design @ solution - target) ** 2)))
    return AffineCost(float(best[0]), float(best[1]))
