"""Kernel samples: train a probe network for a few steps under the tracer and pair each call with its cost.

The tracer times every kernel call of a step with its (layer, stage, kernel); each call
is paired with its entry of :func:`~pydtnn_lite.step_costs.step_costs`, which gives its
``dims``, FLOPs and bytes, by their :class:`~pydtnn_lite.costs.CallKey`. A sample is one
call of the step with the median of its times over the repeated steps.

The ranks train their copies of a probe in step with each other and wait for the slowest
where a training job's ranks do: at each batch-norm reduction and after each step's
backward (:class:`ProbeSynchronizer`).
A probe is a small network whose optimizer state would stay in the cache from one step
to the next, where a real network's does not: its updates are timed after a cache
eviction.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm import Communicator, GradientSynchronizer, SerialCommunicator
from pydtnn_lite.costs import COMPUTE_STAGES, NO_LAYER, CallCounter, CallKey, KernelCost, keyed_costs
from pydtnn_lite.data import Dataset
from pydtnn_lite.network import Network
from pydtnn_lite.optim import LearningRateSchedule
from pydtnn_lite.perfmodel.measuring.probes import Probe
from pydtnn_lite.perfmodel.modelling.regression import KernelSample
from pydtnn_lite.step_costs import h2d_copy_cost, step_costs
from pydtnn_lite.tracing import KernelRecord, StepRecord, Tracer
from pydtnn_lite.tracing.records import COMPUTE, TRAIN
from pydtnn_lite.training import TrainerSettings, build_trainer

LEARNING_RATE = 1e-4  # small enough that no probe's loss diverges on random labels
# Where a probe's ranks meet, as a calibration records it: its samples are not to be pooled
# with those of files whose ranks met only after each step (written before 2026-12-06).
RANKS_MEET = "at each batch-norm reduction and after backward"
MAX_STEPS = 20
# After an eviction a small network's kernels run slow for a while (MLP b32's GEMMs 1.3x in
# the next 5 ms step, 1.05x after 15 ms, as trained by 20 ms): a sample starts this long after.
SETTLE_SECONDS = 0.025
MAX_PERIOD = 8  # steps a sample at most: the first after an eviction and the sample itself at least


def rounded(seconds: float) -> float:
    """A measured time kept to 4 significant digits: the noise of a timing on a shared machine
    is far larger, and the calibration file a third smaller."""
    return float(f"{seconds:.4g}")


def median_of_slowest(per_rank: Sequence[Sequence[float]]) -> float:
    """The median over calls of the slowest rank's seconds, ``per_rank`` holding each rank's
    seconds of the same calls in the same order: a collective lasts until its slowest rank is done."""
    return statistics.median(max(call) for call in zip(*per_rank, strict=True))


class RandomImages(Dataset):
    """Any number of samples of ``input_shape``, served from one random batch: the probes
    time the kernels of a step, so the loading must cost little and fit any shape."""

    name = "random"

    def __init__(self, size: int, batch: int, input_shape: tuple, num_classes: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.size, self.input_shape, self.num_classes = size, tuple(input_shape), num_classes
        self.images = rng.standard_normal((batch,) + self.input_shape, dtype=np.float32)
        self.labels = rng.integers(num_classes, size=batch)

    def __len__(self) -> int:
        return self.size

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(indices) % len(self.images)
        return self.images[rows], self.labels[rows]


class MeetingCommunicator(SerialCommunicator):
    """One process's collectives, but a blocking sum first calls ``meet``: a probe's
    batch-norm reductions sum its own statistics only, and meet the other ranks where a
    job's ranks meet."""

    def __init__(self, meet: Callable[[], None]) -> None:
        self.meet = meet

    def allreduce(self, array: Any) -> Any:
        """``array`` unchanged, once every rank has reached a reduction."""
        self.meet()
        return array


class ProbeSynchronizer(GradientSynchronizer):
    """A probe's gradient synchronizer, between backward and the update of every step.

    Each rank trains its own copy of the probe (nothing to sum), but the ranks meet at a
    barrier wherever a training job's ranks meet at a blocking reduction: at each batch-norm
    reduction of the statistics (:class:`MeetingCommunicator`) and here, after backward. They
    then run every kernel in step with each other, sharing the memory system as a job's
    ranks do: after a job's batch-norm reduction both ranks run the same memory-bound pass at
    once, and ranks that drifted apart would time it alone. Each meeting measures how long
    the rank waits for the slowest after its work since the last one (``waits``: a list a
    step of (seconds of work, seconds at the barrier) a meeting, in the order the step
    meets). After the last meeting of every ``period``-th step (``evicted``: one flag a
    step; none while ``period`` is 0) the caches are evicted and the ranks meet again
    (``untraced``: the seconds of each step's last meeting and eviction, which no traced
    call covers), so that the update reads the optimizer state from memory, as every update
    of a network whose state exceeds the cache does: an update timed from the cache
    under-estimates it (docs/performance-model.md, 'What is measured'). Only the evicted
    steps are samples: their forward and backward follow ``period - 1`` steps that ran as a
    job's do. The steps just after an eviction are not: they find their data, BLAS buffers
    and activations gone from the cache, where a small network keeps them all from one step
    to the next (MLP's GEMMs took 1.2-1.4x their trained time, sampled right after one).
    """

    def __init__(self, network: Network, ranks: Communicator, evict: Callable[[], None]) -> None:
        super().__init__(network, MeetingCommunicator(self.meet), overlap=False)
        self.ranks, self.evict = ranks, evict
        self.waits: list[list[tuple[float, float]]] = []
        self.meetings: list[tuple[float, float]] = []  # the current step's so far
        self.untraced: list[float] = []
        self.evicted: list[bool] = []
        self.period = 0
        self.last_met = time.perf_counter()

    def meet(self) -> None:
        """Wait for every rank at a barrier; note the work since the last meeting and the wait."""
        arrived = time.perf_counter()
        self.ranks.barrier()
        met = time.perf_counter()
        self.meetings.append((arrived - self.last_met, met - arrived))
        self.last_met = met

    def finish(self) -> None:
        super().finish()
        arrived = time.perf_counter()
        self.meet()
        self.waits.append(self.meetings)
        self.meetings = []
        evicting = self.period > 0 and len(self.evicted) % self.period == self.period - 1
        if evicting:
            self.evict()
            self.ranks.barrier()  # no rank computes while another still streams through memory
        self.evicted.append(evicting)
        self.untraced.append(time.perf_counter() - arrived)


@dataclass
class ProbeMeasurement:
    """What one probe measured: kernel samples by kernel name, the (work, wait) seconds
    of each meeting of the ranks in each traced step (see :class:`ProbeSynchronizer`), the
    step's compute kernel calls with the median seconds of a step outside every traced call,
    and the samples of the calls that follow other work (``cold_starts``, by kernel name)."""

    samples: dict[str, list[KernelSample]]
    waits: list[list[tuple[float, float]]]
    overhead: tuple[float, float]
    cold_starts: dict[str, list[KernelSample]]

    def kernel_seconds(self) -> dict[str, float]:
        """Seconds a step by kernel name, over every sampled call, those that follow other
        work included (a network's first update, say: its largest)."""
        totals: dict[str, float] = defaultdict(float)
        for group in (self.samples, self.cold_starts):
            for name, calls in group.items():
                totals[name] += sum(call.seconds for call in calls)
        return dict(totals)


def measure_probe(probe: Probe, backend: Backend, ranks: Communicator, repeats: int, evict: Callable[[], None],
                  min_seconds: float = 0.0, seed: int = 0, reduced: bool = False,
                  period: int | None = None, eviction_seconds: float = 0.0) -> ProbeMeasurement:
    """Train the probe on every rank of ``ranks`` at once (collective) and sample every
    kernel call of its training step.

    After untraced warm-up steps, ``repeats`` steps are sampled, or more (up to
    ``MAX_STEPS``, the same number on every rank) until they span about ``min_seconds``:
    a step of a small probe takes a few milliseconds, and its median over a longer span is
    less at the mercy of whatever else the machine runs at that moment. ``evict()`` runs
    between backward and the update of each sampled step (e.g. a
    :class:`~pydtnn_lite.perfmodel.measuring.host.CacheEvictor`), which follows steps
    without one for ``SETTLE_SECONDS`` (up to ``MAX_PERIOD - 1`` steps;
    :class:`ProbeSynchronizer`); or, where
    ``period`` is given, each ``period``-th step, the warm-up's included (1: every step,
    right after an eviction, as calibrations sampled before 2026-12-07). A sample's span
    counts ``eviction_seconds``, what an eviction takes (a
    :class:`~pydtnn_lite.perfmodel.measuring.host.CacheEvictor`'s last), as each sample
    pays one: a small probe's span is mostly that. ``reduced``: the ranks
    sum their gradients instead, with the trainer's bucketed Allreduce overlapped with
    backward, as a training job's step does (no waits, no eviction): what calibrating
    samples can be set against (``benchmarks/probe_tracking.py``).
    """
    most = max(repeats, MAX_STEPS)
    warm_up_steps = 1 if period else 2  # the second, a step as the others run, times the period
    network, optimizer = probe.trainable(backend, seed)
    synchronizer = None if reduced else ProbeSynchronizer(network, ranks, evict)
    if synchronizer is not None and period is not None:
        synchronizer.period = period
    global_batch = probe.batch * (ranks.size if reduced else 1)  # each rank trains on the probe's batch
    data = RandomImages(global_batch * (MAX_PERIOD * most + warm_up_steps), probe.batch, probe.input_shape,
                        probe.classes, seed)
    trainer = build_trainer(network, data, TrainerSettings(global_batch, seed=seed, steps_per_epoch=warm_up_steps),
                            comm=ranks if reduced else None, optimizer=optimizer,
                            schedule=LearningRateSchedule(LEARNING_RATE), synchronizer=synchronizer)
    step_seconds: list[float] = []
    trainer.train_epoch(0, callbacks=[lambda _, result: step_seconds.append(result.seconds)])
    # A period of steps, and a number of samples, agreed by every rank from its slowest.
    if period is None:
        period = 1 if reduced else int(np.clip(1 + math.ceil(SETTLE_SECONDS / step_seconds[-1]), 2, MAX_PERIOD))
    sample_seconds = period * step_seconds[-1] + (0.0 if reduced else eviction_seconds)
    wanted = int(np.clip(math.ceil(min_seconds / sample_seconds), repeats, most))
    period, steps = map(max, zip(*ranks.allgather_object((period, wanted)), strict=True))
    trainer.steps_per_epoch = warm_up_steps + period * steps
    if synchronizer is not None:
        synchronizer.period = period
        synchronizer.waits.clear()
        synchronizer.untraced.clear()
        synchronizer.evicted.clear()
    tracer = Tracer(trainer, skip_steps=1).attach()
    try:
        trainer.train_epoch(0)
    finally:
        tracer.detach()
    costs = keyed_costs(step_costs(network, optimizer, probe.batch)
                        + [(NO_LAYER, h2d_copy_cost(probe.batch, probe.input_shape))])
    if synchronizer is None:  # a job's step: no barrier, no eviction, every step a sample
        steps_kept, waits, untraced = tracer.steps, [], [0.0] * len(tracer.steps)
    else:
        kept = [index for index, evicted in enumerate(synchronizer.evicted) if evicted]
        steps_kept = [tracer.steps[index] for index in kept]
        waits = [synchronizer.waits[index] for index in kept]
        untraced = [synchronizer.untraced[index] for index in kept]
    sampled_steps = {step.step for step in steps_kept}
    records = [record for record in tracer.kernels if record.step in sampled_steps]
    warm, cold = paired_samples(records, costs)
    return ProbeMeasurement(warm, waits, step_overhead(records, steps_kept, untraced), cold)


def step_overhead(records: Sequence[KernelRecord], steps: Sequence[StepRecord],
                  untraced: Sequence[float]) -> tuple[float, float]:
    """(compute kernel calls per step, median seconds per step outside every traced call
    and outside the ``untraced`` seconds of each step, e.g. the probes' barrier)."""
    covered: dict[int, float] = defaultdict(float)
    calls: dict[int, int] = defaultdict(int)
    for record in records:
        if record.phase == TRAIN:
            covered[record.step] += record.duration
            calls[record.step] += record.thread == COMPUTE and record.stage in COMPUTE_STAGES
    gaps = [max(step.duration - covered[step.step] - extra, 0.0) for step, extra in zip(steps, untraced, strict=True)]
    return float(statistics.median(calls[step.step] for step in steps)), rounded(statistics.median(gaps))


def paired_samples(records: Sequence[KernelRecord], costs: dict[CallKey, KernelCost]
                   ) -> tuple[dict[str, list[KernelSample]], dict[str, list[KernelSample]]]:
    """One sample per call of a step that ``costs`` lists: its cost, and the median duration
    of its calls over the traced training steps; by kernel name, the calls that follow other
    work (``KernelCost.cold_start``) apart from the rest, which a kernel's model fits."""
    durations: dict[CallKey, list[float]] = defaultdict(list)
    for step in sorted({r.step for r in records}):
        counter = CallCounter()
        for record in records:
            if record.step != step or record.phase != TRAIN or record.thread != COMPUTE:
                continue
            key = counter.key(record.layer, record.stage, record.kernel)
            if key in costs:
                durations[key].append(record.duration)
    warm: dict[str, list[KernelSample]] = defaultdict(list)
    cold: dict[str, list[KernelSample]] = defaultdict(list)
    for key, seconds in durations.items():
        cost = costs[key]
        (cold if cost.cold_start else warm)[key.kernel].append(
            KernelSample(tuple(cost.dims), cost.flops, cost.bytes, rounded(statistics.median(seconds))))
    return dict(warm), dict(cold)


def median_over_ranks(per_rank: list[dict[str, list[KernelSample]]]) -> dict[str, list[KernelSample]]:
    """Every rank ran the same grid in the same order: one sample per call, its seconds the
    median over the ranks."""
    merged = {}
    for name, first in per_rank[0].items():
        columns = [rank_samples[name] for rank_samples in per_rank]
        if any(len(column) != len(first) for column in columns):
            raise RuntimeError(f"the ranks measured different numbers of {name} calls")
        merged[name] = [KernelSample(calls[0].dims, calls[0].flops, calls[0].bytes,
                                     rounded(float(np.median([call.seconds for call in calls]))))
                        for calls in zip(*columns, strict=True)]
    return merged
