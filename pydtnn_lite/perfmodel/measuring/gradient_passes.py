"""The passes over a whole gradient that no probe network runs, timed on their own.

A step that accumulates gradients (``--accumulate``) starts the running sum with a copy of
the first micro-batch's gradient and adds each later one's; a step that clips
(``--clip-grad-norm``) reads the reduced gradient for its norm, then scales it. Each is one
pass over the flat gradient, whose time follows its length alone. Predicted from the
add of two gradients as long, scaled by bytes, they were off by 0.6-2.5x (the Xeon with
300 MiB of L3, 2026-12-06: VGG11's norm 4.0-4.3 ms a step where the add gave 2.5, its
scaling 2.0-2.2 where it gave 4.9-5.1): the norm sums in float64, the scaling finds its
gradient in the cache, just read by the norm, and the copy that starts the sum reads the
evicted sum before it writes it, so it takes longer than an add.

Every rank times each kernel at once, as a job's ranks run it, over a ladder of lengths
(a longer gradient is predicted as that many passes over the longest), in the state a
step leaves the data in: the gradient just written (by backward, or by the Allreduce), the
running sum last touched a micro-batch of other work ago (evicted).
"""
from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.costs import KernelCost
from pydtnn_lite.perfmodel.measuring.sampling import median_over_ranks, rounded
from pydtnn_lite.perfmodel.measuring.timing import seconds_together
from pydtnn_lite.perfmodel.modelling.regression import KernelSample
from pydtnn_lite.step_costs import accumulation_cost, clipping_costs

LENGTHS = tuple(1 << shift for shift in range(14, 27))  # 16 K .. 64 M elements: LeNet's 62 K to AlexNet's 61 M
QUICK_LENGTHS = (1 << 16, 1 << 20)
REPEATS = 5  # timed calls of each kernel a length; a sample is their median


def gradient_pass_samples(comm: Communicator, backend: Backend, evict: Callable[[], None],
                          lengths: Sequence[int] = LENGTHS, repeats: int = REPEATS) -> dict[str, list[KernelSample]]:
    """Samples of the gradient passes (``start_gradient_sum``, ``accumulate_gradients``,
    ``gradient_norm``, ``scale_gradient``) at each of ``lengths`` elements, each the median of ``repeats``
    calls, the median over the ranks (collective; ``evict()`` pushes the caches' content
    out, e.g. a :class:`~pydtnn_lite.perfmodel.measuring.host.CacheEvictor`)."""
    mine: dict[str, list[KernelSample]] = {}
    for length in sorted(set(lengths)):
        for cost, seconds in _timed_passes(length, comm, backend, evict, repeats):
            mine.setdefault(cost.kernel, []).append(
                KernelSample(tuple(cost.dims), cost.flops, cost.bytes, rounded(statistics.median(seconds))))
    return median_over_ranks(comm.allgather_object(mine))


def _timed_passes(length: int, comm: Communicator, backend: Backend, evict: Callable[[], None],
                  repeats: int) -> list[tuple[KernelCost, list[float]]]:
    """Each gradient pass over ``length`` elements with the seconds of its ``repeats`` calls."""
    itemsize = np.dtype(backend.dtype).itemsize
    gradient, total = (backend.xp.ones(length, dtype=backend.dtype) for _ in range(2))

    def written() -> None:
        evict()
        gradient.fill(1.0)  # what backward or the Allreduce leaves of it in the cache

    timed = functools.partial(seconds_together, comm, synchronize=backend.synchronize)

    def seconds_of(run: Callable[[], object]) -> list[float]:
        return [timed(run, before=written) for _ in range(repeats)]

    norm_cost, scale_cost = clipping_costs(length, itemsize)
    norms, scalings = [], []
    for _ in range(repeats):  # the scaling right after the norm, as clipping runs them
        norms.append(timed(lambda: kernels.gradient_norm(gradient), before=written))
        scalings.append(timed(lambda: kernels.scale_gradient(gradient, 1.0)))
    return [(accumulation_cost(length, itemsize, first=True),
             seconds_of(lambda: kernels.start_gradient_sum(total, gradient))),
            (accumulation_cost(length, itemsize, first=False),
             seconds_of(lambda: kernels.accumulate_gradients(total, gradient))),
            (norm_cost, norms), (scale_cost, scalings)]

