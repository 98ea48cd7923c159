"""Measured against predicted: per kernel, per stage and per step, from a trace directory.

Each traced kernel call is matched with its prediction by its
:class:`~pydtnn_lite.costs.CallKey`, the key that pairs calls with their costs. Per kernel the
measured time is the median over the traced steps and ranks, robust to the odd call that
another job interrupted; a reduction's (batch norm) is the mean: its time is mostly the
wait for the slowest rank, nothing on that rank and much on the others, so its median
says little of what it costs a step, and the prediction is of the mean wait. Where the
ranks time-share the cores every kernel's is the mean: a call is interrupted for the other
ranks' turns with a chance that grows with its length, so most short calls run
uninterrupted and their median leaves out the turns that their mean, as the step, pays
(8 ranks on 2 cores: a VGG11 im2col's median 1x its time alone, its mean about 4x). The metrics
are those of Barrachina et al. (2021, docs/performance-model.md):

- relative error ``RE_k = (T_est - T_meas) / T_meas``;
- weighted relative error ``WRE_k = (T_est - T_meas) / T_avg``, with ``T_avg`` the mean
  measured time of the kernels of k's stage, so that short kernels with large relative
  errors weigh little; the stage's WRE is the mean of ``|WRE_k|`` over its kernels;
- the error of the whole step, loading the batch included.

No prediction can be expected to agree with a measurement better than the measurement
agrees with itself. So every total and stage also carries its *split-half* figures: the
traced steps are dealt alternately into two halves, and the same metrics are computed
between the halves (one half's kernel times standing in for the prediction). A WRE near its
split-half WRE is as good as the run's noise allows.

Where the model times the calls that move overlapped buckets over a network (MPI over TCP:
``channel.py``), COMM is also compared in its parts (:data:`COMM_PARTS`): the posts of the
buckets, the tests between the kernels of backward, and the rest, the wait at the end of
the step (for the buckets that outlast backward and for the slowest rank) with the loss's
reduction. Two parts that miss in opposite directions can leave the total right.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydtnn_lite.costs import (
    ALLREDUCE,
    ALLREDUCE_PROGRESS,
    ALLREDUCE_START,
    COMPUTE_STAGES,
    TRANSFER_CPU,
    CallCounter,
    CallKey,
    Stage,
)
from pydtnn_lite.perfmodel.modelling.prediction import STAGES, StepPrediction
from pydtnn_lite.tracing.records import TRAIN, KernelRecord, StepRecord

NAN = float("nan")
POSTS, TESTS, WAIT = "posts", "tests", "wait"
COMM_PARTS = (POSTS, TESTS, WAIT)


@dataclass(frozen=True)
class KernelComparison:
    """One kernel call of the step, measured (median; mean for a reduction) and predicted."""

    layer: int
    layer_name: str
    stage: str
    kernel: str
    occurrence: int
    measured: float
    predicted: float
    wre: float

    @property
    def key(self) -> CallKey:
        return CallKey(self.layer, self.stage, self.kernel, self.occurrence)

    @property
    def relative_error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else float("nan")


@dataclass(frozen=True)
class Comparison:
    """A total (a stage, the step) measured and predicted.

    ``half_difference`` is the relative difference of the measured total between the two
    halves of the traced steps, ``half_wre`` the WRE of one half's kernel times against
    the other's: how far the measurement repeats itself (NaN with fewer than two steps, and
    ``half_wre`` for totals that have no WRE).
    """

    name: str
    measured: float
    predicted: float
    wre: float = NAN
    half_difference: float = NAN
    half_wre: float = NAN

    @property
    def relative_error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else float("nan")


@dataclass
class Validation:
    kernels: list[KernelComparison]
    stages: list[Comparison]
    step: Comparison
    unmatched: int  # traced calls without a prediction (e.g. reductions in a 1-rank run)
    comm_parts: list[Comparison] = field(default_factory=list)  # COMM by COMM_PARTS, where the model has them


def measured_comm_part(kernel: str) -> str:
    """The part of COMM that a traced call of ``kernel`` belongs to: posting a bucket, a test
    of the outstanding buckets, or the rest (the final wait, the loss's reduction)."""
    return POSTS if kernel == ALLREDUCE_START else TESTS if kernel == ALLREDUCE_PROGRESS else WAIT


def predicted_comm_parts(prediction: StepPrediction, comm_seconds: float) -> dict[str, float]:
    """``comm_seconds``, a prediction's COMM, in :data:`COMM_PARTS`: its posts, its tests (the
    transfer's CPU time inside them, and the tests that start a pipeline's later
    collectives), and the rest; empty where the prediction charges no posts (no network
    whose data moves only inside MPI calls, or no overlap)."""
    comm = [k for k in prediction.kernels if k.stage == Stage.COMM]
    posts = sum(k.seconds for k in comm if k.kernel == ALLREDUCE_START)
    if posts <= 0:
        return {}
    tests = sum(k.seconds for k in comm if k.kernel in (TRANSFER_CPU, ALLREDUCE_PROGRESS))
    return {POSTS: posts, TESTS: tests, WAIT: comm_seconds - posts - tests}


def _occurrences(records: Sequence[KernelRecord]) -> dict[CallKey, list[tuple[int, float]]]:
    """(step, duration) of the calls by their key, the calls counted within each rank's step."""
    counters: dict[tuple[int, int], CallCounter] = defaultdict(CallCounter)
    out: dict[CallKey, list[tuple[int, float]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.rank, r.step, r.start)):
        if record.stage not in COMPUTE_STAGES:
            continue
        key = counters[(record.rank, record.step)].key(record.layer, record.stage, record.kernel)
        out[key].append((record.step, record.duration))
    return out


def weighted_relative_error(estimates: Sequence[float], measured: Sequence[float]) -> float:
    """The paper's stage WRE: mean over kernels of |estimate - measured| / (mean measured time)."""
    mean = statistics.fmean(measured) if measured else 0.0
    if mean <= 0:
        return NAN
    return statistics.fmean(abs(e - m) for e, m in zip(estimates, measured, strict=True)) / mean


def typical(kernel: str, durations: Sequence[float], time_shared: bool = False) -> float:
    """What a kernel's measured calls are compared by: their median, or the mean for a
    reduction, whose time is mostly a wait that the slowest rank does not have, and for
    every kernel of ranks that ``time_shared`` the cores."""
    return statistics.fmean(durations) if kernel == ALLREDUCE or time_shared else statistics.median(durations)


def _relative_difference(first: float, second: float) -> float:
    """|first - second| over their mean (NaN for two zeros)."""
    mean = (first + second) / 2
    return abs(first - second) / mean if mean > 0 else NAN


class _Halves:
    """The traced steps dealt alternately into two halves, and what each half measured."""

    def __init__(self, steps: Sequence[StepRecord], time_shared: bool) -> None:
        self.time_shared = time_shared
        order = sorted({s.step for s in steps})
        self.half = {step: i % 2 for i, step in enumerate(order)}
        self.steps_per_half = (len(order) - len(order) // 2, len(order) // 2)

    @property
    def usable(self) -> bool:
        return min(self.steps_per_half) > 0

    def typical(self, kernel: str, calls: Sequence[tuple[int, float]]) -> tuple[float, float]:
        """The :func:`typical` duration of ``kernel``'s ``calls`` (step, seconds) in each half
        (NaN where a half has none)."""
        split: tuple[list, list] = ([], [])
        for step, duration in calls:
            split[self.half[step]].append(duration)
        first, second = (typical(kernel, part, self.time_shared) if part else NAN for part in split)
        return first, second

    def difference(self, items: Sequence[tuple[int, float]]) -> float:
        """Relative difference between the halves of the per-step total of ``items`` (step, seconds)."""
        if not self.usable:
            return NAN
        sums = [0.0, 0.0]
        for step, seconds in items:
            sums[self.half[step]] += seconds
        return _relative_difference(sums[0] / self.steps_per_half[0], sums[1] / self.steps_per_half[1])


def validate(records: Sequence[KernelRecord], steps: Sequence[StepRecord], overlap: bool,
             predict: Callable[[int], StepPrediction], time_shared: bool = False) -> Validation:
    """Compare the training records of a trace with ``predict(local batch)`` of each rank;
    ``time_shared``: the ranks time-shared the cores (see :func:`typical`)."""
    train = [r for r in records if r.phase == TRAIN]
    batches = {s.rank: s.samples for s in steps}
    predictions = {batch: predict(batch) for batch in set(batches.values())}
    predicted_kernels: dict[CallKey, list[float]] = defaultdict(list)
    for batch in batches.values():
        for k in predictions[batch].kernels:
            predicted_kernels[k.key].append(k.seconds)
    names = {(r.layer, r.stage, r.kernel): r.layer_name for r in train}
    occurrences = _occurrences(train)
    calls = {key: found for key, found in occurrences.items() if key in predicted_kernels}
    matched = {key: typical(key.kernel, [duration for _, duration in found], time_shared)
               for key, found in calls.items()}
    # Keyed by str: a traced call's stage is the plain string that a Stage equals.
    stage_mean: dict[str, float] = {
        stage: statistics.fmean([t for key, t in matched.items() if key.stage == stage] or [0.0])
        for stage in COMPUTE_STAGES}
    kernels = []
    for key, meas in matched.items():  # in the order of the traced step
        pred = statistics.fmean(predicted_kernels[key])
        wre = (pred - meas) / stage_mean[key.stage] if stage_mean[key.stage] > 0 else NAN
        name = names[(key.layer, key.stage, key.kernel)]
        kernels.append(KernelComparison(key.layer, name, key.stage, key.kernel, key.occurrence, meas, pred, wre))

    halves = _Halves(steps, time_shared)
    half_typical = {key: halves.typical(key.kernel, found) for key, found in calls.items()}
    rank_steps = max(len(steps), 1)
    stage_measured: defaultdict[str, float] = defaultdict(float)
    for record in train:
        stage_measured[record.stage] += record.duration / rank_steps
    stage_predicted: defaultdict[str, float] = defaultdict(float)
    part_predicted: defaultdict[str, float] = defaultdict(float)
    for batch in batches.values():
        prediction = predictions[batch]
        for stage in STAGES:
            # COMM: what communication adds to the step (with overlap, what backward does not hide)
            seconds = (prediction.step_seconds(overlap) - prediction.overhead_seconds - prediction.data_in_step(overlap)
                       - sum(prediction.stage_seconds.get(s, 0.0) for s in COMPUTE_STAGES)
                       if stage == Stage.COMM else prediction.stage_seconds.get(stage, 0.0))
            stage_predicted[stage] += seconds / len(batches)
            if stage == Stage.COMM:
                for part, part_seconds in predicted_comm_parts(prediction, seconds).items():
                    part_predicted[part] += part_seconds / len(batches)
    stages = []
    for stage in STAGES:
        in_stage = [k for k in kernels if k.stage == stage]
        wre = weighted_relative_error([k.predicted for k in in_stage], [k.measured for k in in_stage])
        keys = [k.key for k in in_stage]
        half_wre = (weighted_relative_error([half_typical[key][0] for key in keys],
                                             [half_typical[key][1] for key in keys]) if halves.usable else NAN)
        difference = halves.difference([(r.step, r.duration) for r in train if r.stage == stage])
        stages.append(Comparison(stage, stage_measured[stage], stage_predicted[stage], wre, difference, half_wre))
    comm_parts = []
    if part_predicted:
        by_part: defaultdict[str, list[KernelRecord]] = defaultdict(list)
        for record in train:
            if record.stage == Stage.COMM:
                by_part[measured_comm_part(record.kernel)].append(record)
        comm_parts = [Comparison(part, sum(r.duration for r in by_part[part]) / rank_steps, part_predicted[part],
                                 half_difference=halves.difference([(r.step, r.duration) for r in by_part[part]]))
                      for part in COMM_PARTS]
    step_measured = sum(s.duration for s in steps) / rank_steps
    step_predicted = max(predictions[b].step_seconds(overlap) for b in batches.values())
    step_difference = halves.difference([(s.step, s.duration) for s in steps])
    unmatched = sum(len(found) for key, found in occurrences.items() if key not in predicted_kernels)
    return Validation(kernels, stages, Comparison("step", step_measured, step_predicted,
                                                  half_difference=step_difference), unmatched, comm_parts)
