"""Allreduce time models and their fit to measured times.

With ``P`` ranks, an ``n``-byte message, latency ``alpha`` (s), transfer time ``beta``
(s/byte) and reduction time ``gamma`` (s/byte):

- ring (NCCL's large-message algorithm): ``2(P-1) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``
- MST, a binomial tree (reduce, then broadcast): ``2 ceil(log2 P) (alpha + n beta) + ceil(log2 P) n gamma``
- BKT, bucket (reduce-scatter, then allgather): ``2 P alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``

Measured Allreduce times show two regimes: small messages go through eager, cache-resident
paths and large ones stream through memory or the network at a lower bandwidth. One
alpha-beta line fits neither well, so an :class:`AllreduceModel` has a parameter set for
messages below a threshold and one for those above it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Link:
    """alpha (s per message step), beta (s per byte sent), gamma (s per byte reduced)."""

    alpha: float
    beta: float
    gamma: float = 0.0


def _terms_ring(p: int, n: float) -> tuple[float, float, float]:
    return 2.0 * (p - 1), 2.0 * (p - 1) / p * n, (p - 1) / p * n


def _terms_mst(p: int, n: float) -> tuple[float, float, float]:
    depth = math.ceil(math.log2(p))
    return 2.0 * depth, 2.0 * depth * n, depth * n


def _terms_bkt(p: int, n: float) -> tuple[float, float, float]:
    return 2.0 * p, 2.0 * (p - 1) / p * n, (p - 1) / p * n


# Each model is linear in (alpha, beta, gamma): these give the three coefficients.
TERMS: dict[str, Callable[[int, float], tuple[float, float, float]]] = {
    "ring": _terms_ring, "mst": _terms_mst, "bkt": _terms_bkt}


def allreduce_seconds(algorithm: str, procs: int, nbytes: float, link: Link) -> float:
    """Predicted time of one Allreduce of ``nbytes`` over ``procs`` ranks."""
    if procs <= 1:
        return 0.0
    a, b, g = TERMS[algorithm](procs, nbytes)
    return a * link.alpha + b * link.beta + g * link.gamma


@dataclass(frozen=True)
class AllreduceModel:
    """An algorithm with one link for messages below ``threshold`` bytes and one for the rest."""

    algorithm: str
    small: Link
    large: Link
    threshold: float = math.inf

    def seconds(self, nbytes: float, procs: int) -> float:
        link = self.small if nbytes < self.threshold else self.large
        return allreduce_seconds(self.algorithm, procs, nbytes, link)

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "small": asdict(self.small), "large": asdict(self.large),
                "threshold": None if math.isinf(self.threshold) else self.threshold}

    @classmethod
    def from_dict(cls, data: dict) -> "AllreduceModel":
        threshold = data.get("threshold")
        return cls(data["algorithm"], Link(**data["small"]), Link(**data["large"]),
                   math.inf if threshold is None else float(threshold))


def _fit_link(algorithm: str, samples: Sequence[tuple[int, float, float]], gamma: float) -> Link:
    """Non-negative least squares of relative error for alpha and beta, gamma given.

    Relative error weights small and large messages alike. In all three models the beta
    and gamma terms are proportional (2:1), so timings cannot tell them apart: gamma is
    fixed and beta absorbs the rest of the per-byte cost.
    """
    terms = np.array([TERMS[algorithm](p, n) for p, n, _ in samples])
    times = np.array([t for _, _, t in samples])
    target = times - terms[:, 2] * gamma
    terms = terms[:, :2]
    weights = 1.0 / times
    best, best_error = None, math.inf
    # Tiny NNLS: try every subset of free parameters and keep the best non-negative solution.
    for size in range(1, terms.shape[1] + 1):
        for subset in itertools.combinations(range(terms.shape[1]), size):
            columns = terms[:, subset] * weights[:, None]
            solution, *_ = np.linalg.lstsq(columns, target * weights, rcond=None)
            if (solution < 0).any():
                continue
            error = float(np.sum((columns @ solution - target * weights) ** 2))
            if error < best_error:
                full = np.zeros(terms.shape[1])
                full[list(subset)] = solution
                best, best_error = full, error
    if best is None:
        best = np.zeros(terms.shape[1])
    return Link(float(best[0]), float(best[1]), gamma)


def relative_errors(model: AllreduceModel, samples: Sequence[tuple[int, float, float]]) -> np.ndarray:
    """(predicted - measured) / measured of every sample."""
    return np.array([(model.seconds(n, p) - t) / t for p, n, t in samples])


def fit_allreduce(samples: Sequence[tuple[int, float, float]], algorithm: Optional[str] = None,
                  gamma: float = 0.0) -> AllreduceModel:
    """Fit an :class:`AllreduceModel` to ``(procs, nbytes, seconds)`` samples.

    Every message size is tried as the threshold between the two regimes (and none), and
    with ``algorithm`` None every algorithm; the fit with the smallest mean absolute
    relative error wins. ``gamma`` fixes the reduction cost per byte (e.g. from the
    memory bandwidth); with the default 0, beta includes it.
    """
    samples = [(int(p), float(n), float(t)) for p, n, t in samples if p > 1 and t > 0]
    if not samples:
        raise ValueError("no Allreduce samples with 2 or more processes: calibrate under mpiexec -n 2 or more")
    sizes = sorted({n for _, n, _ in samples})
    best, best_error = None, math.inf
    for name in ([algorithm] if algorithm else list(TERMS)):
        # Thresholds keep at least two message sizes on each side; infinity means one regime.
        for threshold in [math.inf] + sizes[2:-1]:
            small = _fit_link(name, [s for s in samples if s[1] < threshold], gamma)
            large = small if math.isinf(threshold) else _fit_link(name, [s for s in samples if s[1] >= threshold],
                                                                  gamma)
            model = AllreduceModel(name, small, large, threshold)
            error = float(np.mean(np.abs(relative_errors(model, samples))))
            if error < best_error:
                best, best_error = model, error
    return best
