"""Allreduce time models and their fit to measured times.

With ``P`` ranks, an ``n``-byte message, latency ``alpha`` (s), transfer time ``beta``
(s/byte) and reduction time ``gamma`` (s/byte):

- ring (NCCL's large-message algorithm): ``2(P-1) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``
- MST, a binomial tree (reduce, then broadcast): ``2 ceil(log2 P) (alpha + n beta) + ceil(log2 P) n gamma``
- BKT, bucket (reduce-scatter, then allgather): ``2 P alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``

Measured Allreduce times show regimes: small messages are latency-bound, middle ones go
through eager, cache-resident paths, and large ones stream through memory or the network
at a lower bandwidth. One alpha-beta line fits none of them well, so an
:class:`AllreduceModel` has one parameter set per range of message sizes.

Within a regime MPICH's time still bends with the message size (the last level cache),
which no straight line follows between sparse samples. :class:`InterpolatedAllreduce`
interpolates densely sampled times and keeps a fitted :class:`AllreduceModel` for what
the samples do not cover (other rank counts, larger messages, presets).
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

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


class AllreduceTime(Protocol):
    """Anything that predicts the seconds of one Allreduce."""

    def seconds(self, nbytes: float, procs: int) -> float: ...


def allreduce_seconds(algorithm: str, procs: int, nbytes: float, link: Link) -> float:
    """Predicted time of one Allreduce of ``nbytes`` over ``procs`` ranks."""
    if procs <= 1:
        return 0.0
    a, b, g = TERMS[algorithm](procs, nbytes)
    return a * link.alpha + b * link.beta + g * link.gamma


@dataclass(frozen=True)
class AllreduceModel:
    """An algorithm with one link per message-size regime.

    ``links[i]`` serves messages from ``thresholds[i - 1]`` (inclusive) up to
    ``thresholds[i]`` bytes; one link and no thresholds is a single regime.
    """

    algorithm: str
    links: tuple[Link, ...]
    thresholds: tuple[float, ...] = ()

    def link(self, nbytes: float) -> Link:
        return self.links[bisect.bisect_right(self.thresholds, nbytes)]

    def seconds(self, nbytes: float, procs: int) -> float:
        return allreduce_seconds(self.algorithm, procs, nbytes, self.link(nbytes))

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "links": [asdict(link) for link in self.links],
                "thresholds": list(self.thresholds)}

    @classmethod
    def from_dict(cls, data: dict) -> AllreduceModel:
        return cls(data["algorithm"], tuple(Link(**link) for link in data["links"]),
                   tuple(float(t) for t in data["thresholds"]))


def _fit_link(terms: np.ndarray, times: np.ndarray, gamma: float) -> tuple[Link, float]:
    """Non-negative least squares of relative error for alpha and beta, gamma given, over
    samples whose model coefficients (:data:`TERMS`, a row each) are ``terms`` and whose
    measured seconds are ``times``; the link, and the sum of the samples' absolute relative
    errors under it.

    Relative error weights small and large messages alike. In all three models the beta
    and gamma terms are proportional (2:1), so timings cannot tell them apart: gamma is
    fixed and beta absorbs the rest of the per-byte cost.
    """
    target = times - terms[:, 2] * gamma
    free = terms[:, :2]
    weights = 1.0 / times
    best, best_error = None, math.inf
    # Tiny NNLS: try every subset of free parameters and keep the best non-negative solution.
    for size in range(1, free.shape[1] + 1):
        for subset in itertools.combinations(range(free.shape[1]), size):
            columns = free[:, subset] * weights[:, None]
            solution, *_ = np.linalg.lstsq(columns, target * weights, rcond=None)
            if (solution < 0).any():
                continue
            error = float(np.sum((columns @ solution - target * weights) ** 2))
            if error < best_error:
                full = np.zeros(free.shape[1])
                full[list(subset)] = solution
                best, best_error = full, error
    if best is None:
        best = np.zeros(free.shape[1])
    link = Link(float(best[0]), float(best[1]), gamma)
    predicted = terms @ np.array([link.alpha, link.beta, link.gamma])
    return link, float(np.sum(np.abs(predicted - times) / times))


MIN_REGIME_GAIN = 0.005  # mean relative error an extra regime must save


def _threshold_sets(sizes: Sequence[float], regimes: int) -> list[tuple[float, ...]]:
    """Every way to cut the sorted message ``sizes`` into at most ``regimes`` runs of two or more sizes."""
    cuts = sizes[2:-1]
    out: list[tuple[float, ...]] = [()]
    for count in range(1, regimes):
        for chosen in itertools.combinations(cuts, count):
            bounds = [0.0, *chosen, math.inf]
            if all(sum(1 for n in sizes if low <= n < high) >= 2 for low, high in itertools.pairwise(bounds)):
                out.append(chosen)
    return out


def _range_fitter(algorithm: str, samples: Sequence[tuple[int, float, float]],
                  gamma: float) -> Callable[[float, float], tuple[Link, float]]:
    """A function of a message-size range ``[low, high)`` giving ``algorithm``'s link fitted to
    the samples within it and the sum of their absolute relative errors, each range fitted once
    (many cuts share it)."""
    fitted: dict[tuple[float, float], tuple[Link, float]] = {}
    terms = np.array([TERMS[algorithm](p, n) for p, n, _ in samples])
    sizes = np.array([n for _, n, _ in samples])
    times = np.array([t for _, _, t in samples])

    def fit_range(low: float, high: float) -> tuple[Link, float]:
        if (low, high) not in fitted:
            within = (sizes >= low) & (sizes < high)
            fitted[(low, high)] = _fit_link(terms[within], times[within], gamma)
        return fitted[(low, high)]

    return fit_range


def fit_allreduce(samples: Sequence[tuple[int, float, float]], algorithm: str | None = None,
                  gamma: float = 0.0, regimes: int = 3) -> AllreduceModel:
    """Fit an :class:`AllreduceModel` to ``(procs, nbytes, seconds)`` samples.

    Every cut of the measured message sizes into up to ``regimes`` regimes (latency-bound
    small messages, cache-resident ones, memory-bound large ones) is tried, and with
    ``algorithm`` None every algorithm; the fit with the smallest mean absolute relative
    error wins, and an extra regime must cut that error by a tenth, and by at least half a
    percentage point, to be kept. ``gamma``
    fixes the reduction cost per byte (e.g. from the memory bandwidth); with the default
    0, beta includes it.
    """
    samples = [(int(p), float(n), float(t)) for p, n, t in samples if p > 1 and t > 0]
    if not samples:
        raise ValueError("no Allreduce samples with 2 or more processes: calibrate under mpiexec -n 2 or more")
    sizes = sorted({n for _, n, _ in samples})
    best: dict[int, tuple[float, AllreduceModel]] = {}  # per number of regimes
    for name in ([algorithm] if algorithm else list(TERMS)):
        fit_range = _range_fitter(name, samples, gamma)
        for thresholds in _threshold_sets(sizes, regimes):
            bounds = [0.0, *thresholds, math.inf]
            ranges = [fit_range(low, high) for low, high in itertools.pairwise(bounds)]
            error = sum(range_error for _, range_error in ranges) / len(samples)
            if error < best.get(len(ranges), (math.inf, None))[0]:
                best[len(ranges)] = (error, AllreduceModel(name, tuple(link for link, _ in ranges), thresholds))
    error, model = best[1]
    for count in sorted(best)[1:]:
        if best[count][0] < min(0.9 * error, error - MIN_REGIME_GAIN):
            error, model = best[count]
    return model


def _nondecreasing(values: np.ndarray) -> np.ndarray:
    """The nondecreasing sequence closest to ``values`` in least squares (pool adjacent
    violators): a larger message never takes less time, so a dip is noise, averaged away."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for value in values:
        blocks.append([float(value), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return np.concatenate([np.full(count, mean) for mean, count in blocks])


@dataclass(frozen=True)
class InterpolatedAllreduce:
    """Measured times, interpolated; a fitted model where they do not reach.

    ``curves[procs]`` holds (log bytes, log seconds) of the samples of that rank count,
    sorted, the times made nondecreasing in the size. A message within the sampled sizes of
    its rank count is interpolated linearly in log-log between the two nearest samples (a
    power law between them); any other (rank counts not sampled, messages smaller or
    larger than the samples) gets ``fit``.
    """

    curves: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]
    fit: AllreduceModel

    @classmethod
    def from_samples(cls, samples: Sequence[tuple[int, float, float]], fit: AllreduceModel) -> InterpolatedAllreduce:
        """Interpolate ``(procs, nbytes, seconds)`` samples (the median where a size repeats)."""
        by_procs: dict[int, dict[float, list[float]]] = {}
        for p, n, t in samples:
            if p > 1 and n > 0 and t > 0:
                by_procs.setdefault(int(p), {}).setdefault(float(n), []).append(float(t))
        curves = {}
        for p, times in by_procs.items():
            sizes = sorted(times)
            log_seconds = np.log([float(np.median(times[n])) for n in sizes])
            curves[p] = (tuple(np.log(sizes).tolist()), tuple(_nondecreasing(log_seconds).tolist()))
        return cls(curves, fit)

    @property
    def algorithm(self) -> str:
        return self.fit.algorithm

    def seconds(self, nbytes: float, procs: int) -> float:
        if procs <= 1:
            return 0.0
        curve = self.curves.get(procs)
        if curve is None or nbytes <= 0 or not curve[0][0] <= math.log(nbytes) <= curve[0][-1]:
            return self.fit.seconds(nbytes, procs)
        return float(np.exp(np.interp(math.log(nbytes), *curve)))
