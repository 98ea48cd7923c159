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


def _nonnegative_solutions(s11: np.ndarray, s12: np.ndarray, s22: np.ndarray, s1y: np.ndarray, s2y: np.ndarray,
                           syy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per problem, the (x1, x2) >= 0 of least squared error from the sums of its normal
    equations (column products s11, s12, s22, products with the target s1y, s2y, and the
    target's square syy): the best of x1 alone, x2 alone, both, and neither."""
    zero = np.zeros_like(s11)
    candidates = [(zero, zero, syy)]
    with np.errstate(divide="ignore", invalid="ignore"):
        x1 = s1y / s11
        candidates.append((x1, zero, syy - x1 * s1y))
        x2 = s2y / s22
        candidates.append((zero, x2, syy - x2 * s2y))
        determinant = s11 * s22 - s12 * s12
        x1, x2 = (s22 * s1y - s12 * s2y) / determinant, (s11 * s2y - s12 * s1y) / determinant
        candidates.append((x1, x2, syy - x1 * s1y - x2 * s2y))
    best_error, best1, best2 = np.full(len(s11), math.inf), zero, zero
    for x1, x2, error in candidates:
        better = np.isfinite(x1) & np.isfinite(x2) & (x1 >= 0) & (x2 >= 0) & (error < best_error)
        best_error = np.where(better, error, best_error)
        best1, best2 = np.where(better, x1, best1), np.where(better, x2, best2)
    return best1, best2


class RangeFits:
    """One algorithm's link fitted to the samples of every range of message sizes at once.

    A range runs from one measured size (inclusive) to a larger one (exclusive), the first
    from 0 and the last to infinity. Each range's fit is non-negative least squares of
    relative error for alpha and beta, gamma given: every subset of the two (alpha alone,
    beta alone, both) is solved from the range's normal equations, which prefix sums over
    the samples sorted by size give for all ranges at once, and the best non-negative
    solution kept. Relative error weights small and large messages alike. In all three
    models the beta and gamma terms are proportional (2:1), so timings cannot tell them
    apart: gamma is fixed and beta absorbs the rest of the per-byte cost.
    """

    def __init__(self, algorithm: str, samples: Sequence[tuple[int, float, float]], gamma: float) -> None:
        ordered = sorted(samples, key=lambda sample: sample[1])
        terms = np.array([TERMS[algorithm](p, n) for p, n, _ in ordered])
        times = np.array([t for _, _, t in ordered])
        sizes = np.array([n for _, n, _ in ordered])
        self.gamma = gamma
        self.sizes = sorted(set(sizes.tolist()))
        # Row k of a prefix sum covers the samples below the k-th size; the last row all of them.
        bounds = np.searchsorted(sizes, [*self.sizes, math.inf])
        bounds[-1] = len(sizes)
        first, last = np.triu_indices(len(bounds), k=1)  # every range: [first size, last size)
        scale = max(float(terms[:, 1].max()), 1e-300)  # beta's column near 1, for the normal equations
        columns = np.stack([terms[:, 0], terms[:, 1] / scale], axis=1) / times[:, None]
        target = (times - terms[:, 2] * gamma) / times
        products = np.concatenate([columns[:, [0, 0, 1]] * columns[:, [0, 1, 1]], columns * target[:, None],
                                   (target * target)[:, None]], axis=1)
        prefix = np.vstack([np.zeros(products.shape[1]), np.cumsum(products, axis=0)])[bounds]
        self.alpha, self.beta = _nonnegative_solutions(*(prefix[last] - prefix[first]).T)
        self.beta = self.beta / scale
        predicted = (np.outer(self.alpha, terms[:, 0]) + np.outer(self.beta, terms[:, 1])
                     + gamma * terms[:, 2][None, :])
        within = (np.arange(len(sizes))[None, :] >= bounds[first][:, None]) & \
                 (np.arange(len(sizes))[None, :] < bounds[last][:, None])
        self.errors = np.sum(np.abs(predicted - times) / times * within, axis=1)
        self.index = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(first, last, strict=True))}
        self.position = {size: k for k, size in enumerate(self.sizes)}

    def fit(self, low: float, high: float) -> tuple[Link, float]:
        """The link of the samples of sizes in ``[low, high)`` (0 and infinity, or measured
        sizes), and the sum of their absolute relative errors under it."""
        i = self.index[(self.position.get(low, 0), self.position.get(high, len(self.sizes)))]
        return Link(float(self.alpha[i]), float(self.beta[i]), self.gamma), float(self.errors[i])


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
        ranges = RangeFits(name, samples, gamma)
        for thresholds in _threshold_sets(sizes, regimes):
            bounds = [0.0, *thresholds, math.inf]
            fits = [ranges.fit(low, high) for low, high in itertools.pairwise(bounds)]
            error = sum(range_error for _, range_error in fits) / len(samples)
            if error < best.get(len(fits), (math.inf, None))[0]:
                best[len(fits)] = (error, AllreduceModel(name, tuple(link for link, _ in fits), thresholds))
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
