"""Measured against predicted: per kernel, per stage and per step, from a trace directory.

Each traced kernel call is matched with its prediction by (layer, stage, kernel,
occurrence), the same key the tracer uses to pair calls with their costs. Per kernel the
measured time is the median over the traced steps and ranks. The metrics are those of the
paper (../shared/seeds/003_*):

- relative error ``RE_k = (T_est - T_meas) / T_meas``;
- weighted relative error ``WRE_k = (T_est - T_meas) / T_avg``, with ``T_avg`` the mean
  measured time of the kernels of k's stage, so that short kernels with large relative
  errors weigh little; the stage's WRE is the mean of ``|WRE_k|`` over its kernels;
- the error of the whole step, measured without data loading.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from pydtnn_lite.perfmodel.prediction import STAGES, StepPrediction
from pydtnn_lite.tracing.records import TRAIN, KernelRecord, StepRecord

COMPUTE_STAGES = ("FP", "BP", "WU")


@dataclass(frozen=True)
class KernelComparison:
    """One kernel call of the step, measured (median) and predicted."""

    layer: int
    layer_name: str
    stage: str
    kernel: str
    occurrence: int
    measured: float
    predicted: float
    wre: float

    @property
    def relative_error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else float("nan")


@dataclass(frozen=True)
class Comparison:
    """A total (a stage, the step) measured and predicted."""

    name: str
    measured: float
    predicted: float
    wre: float = float("nan")

    @property
    def relative_error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else float("nan")


@dataclass
class Validation:
    kernels: list[KernelComparison]
    stages: list[Comparison]
    step: Comparison
    unmatched: int  # traced calls without a prediction (e.g. reductions in a 1-rank run)


def _occurrences(records: Sequence[KernelRecord]) -> dict[tuple, list[float]]:
    """Durations per (layer, stage, kernel, occurrence), the occurrence counted within each rank's step."""
    seen: dict[tuple, int] = defaultdict(int)
    out: dict[tuple, list[float]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.rank, r.step, r.start)):
        if record.stage not in COMPUTE_STAGES:
            continue
        step_key = (record.rank, record.step, record.layer, record.stage, record.kernel)
        out[(record.layer, record.stage, record.kernel, seen[step_key])].append(record.duration)
        seen[step_key] += 1
    return out


def validate(records: Sequence[KernelRecord], steps: Sequence[StepRecord], overlap: bool,
             predict: Callable[[int], StepPrediction]) -> Validation:
    """Compare the training records of a trace with ``predict(local batch)`` of each rank."""
    train = [r for r in records if r.phase == TRAIN]
    batches = {s.rank: s.samples for s in steps}
    predictions = {batch: predict(batch) for batch in set(batches.values())}
    predicted_kernels: dict[tuple, list[float]] = defaultdict(list)
    for batch in batches.values():
        for k in predictions[batch].kernels:
            predicted_kernels[(k.layer, k.stage, k.kernel, k.occurrence)].append(k.seconds)
    names = {(r.layer, r.stage, r.kernel): r.layer_name for r in train}
    measured = _occurrences(train)
    matched = {key: statistics.median(times) for key, times in measured.items() if key in predicted_kernels}
    stage_mean = {stage: statistics.fmean([t for key, t in matched.items() if key[1] == stage] or [0.0])
                  for stage in COMPUTE_STAGES}
    kernels = []
    for key, meas in matched.items():  # in the order of the traced step
        layer, stage, kernel, occurrence = key
        pred = statistics.fmean(predicted_kernels[key])
        wre = (pred - meas) / stage_mean[stage] if stage_mean[stage] > 0 else float("nan")
        kernels.append(KernelComparison(layer, names[key[:3]], stage, kernel, occurrence, meas, pred, wre))

    rank_steps = max(len(steps), 1)
    stage_measured = defaultdict(float)
    for record in train:
        stage_measured[record.stage] += record.duration / rank_steps
    stage_predicted = defaultdict(float)
    for batch in batches.values():
        prediction = predictions[batch]
        for stage in STAGES:
            seconds = (prediction.step_seconds(overlap) - sum(prediction.stage_seconds[s] for s in COMPUTE_STAGES)
                       if stage == "COMM" else prediction.stage_seconds[stage])
            stage_predicted[stage] += seconds / len(batches)
    stages = []
    for stage in STAGES:
        in_stage = [abs(k.wre) for k in kernels if k.stage == stage]
        stages.append(Comparison(stage, stage_measured[stage], stage_predicted[stage],
                                 statistics.fmean(in_stage) if in_stage else float("nan")))
    step_measured = sum(s.duration for s in steps) / rank_steps - stage_measured["DATA"]
    step_predicted = max(predictions[b].step_seconds(overlap) for b in batches.values())
    unmatched = sum(len(times) for key, times in measured.items() if key not in predicted_kernels)
    return Validation(kernels, stages, Comparison("step", step_measured, step_predicted), unmatched)
