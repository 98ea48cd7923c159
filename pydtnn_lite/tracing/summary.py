"""Statistics of a trace: per stage, layer and kernel, per rank, and the report that prints them."""
from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from pydtnn_lite.textable import format_table
from pydtnn_lite.tracing.records import COMMUNICATION, DATA_THREAD, TRAIN, KernelRecord, StepRecord

SUMMARY_FILE = "summary.csv"
STAGES = ("DATA", "FP", "BP", "WU", "COMM")
STAT_FIELDS = ("calls", "total_s", "mean_s", "median_s", "min_s", "max_s", "p90_s", "gflops_per_s", "gbytes_per_s")


def statistics(records: Sequence[KernelRecord]) -> dict:
    """Calls, total, mean, median, min, max and p90 seconds, and achieved GFLOP/s and GB/s."""
    seconds = np.array([r.duration for r in records])
    total = float(seconds.sum())
    flops = np.array([r.flops for r in records])
    nbytes = np.array([r.bytes for r in records])

    def rate(amount: np.ndarray) -> float:
        """The sum of ``amount`` in billions per second; NaN when it is unknown or no time passed."""
        return float(np.nansum(amount)) / total / 1e9 if total > 0 and not np.isnan(amount).all() else math.nan

    return {"calls": len(records), "total_s": total, "mean_s": float(seconds.mean()),
            "median_s": float(np.median(seconds)), "min_s": float(seconds.min()), "max_s": float(seconds.max()),
            "p90_s": float(np.percentile(seconds, 90)), "gflops_per_s": rate(flops), "gbytes_per_s": rate(nbytes)}


def grouped(records: Iterable[KernelRecord], key: Callable[[KernelRecord], tuple],
            names: Sequence[str]) -> list[dict]:
    """One row per distinct ``key``: the key's fields under ``names``, then :func:`statistics`."""
    groups: dict[tuple, list[KernelRecord]] = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    return [dict(zip(names, k, strict=True), **statistics(group)) for k, group in sorted(groups.items())]


def kernel_rows(records: Iterable[KernelRecord]) -> list[dict]:
    """Statistics per phase, stage, layer and kernel: the rows of ``summary.csv``."""
    names = ("phase", "stage", "layer", "layer_name", "kernel")
    return grouped(records, lambda r: (r.phase, r.stage, r.layer, r.layer_name, r.kernel), names)


def write_summary(path: str, records: Iterable[KernelRecord]) -> None:
    rows = kernel_rows(records)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=("phase", "stage", "layer", "layer_name", "kernel") + STAT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def rank_rows(records: Sequence[KernelRecord], steps: Sequence[StepRecord]) -> list[dict]:
    """Per rank, means per traced training step: wall time, compute, communication, and
    ``straggler_wait_s``, how much longer the rank spends in communication than the rank
    that spends least. Communication time is mostly waiting for the other ranks, so the
    rank that spends least is the straggler and the others' excess is time lost to it.
    """
    count: defaultdict[int, int] = defaultdict(int)
    wall: defaultdict[int, float] = defaultdict(float)
    for step in steps:
        count[step.rank] += 1
        wall[step.rank] += step.duration
    busy: defaultdict[int, float] = defaultdict(float)
    waiting: defaultdict[int, float] = defaultdict(float)
    for record in records:
        if record.phase == TRAIN and record.thread != DATA_THREAD:
            (waiting if record.thread == COMMUNICATION else busy)[record.rank] += record.duration
    rows = [{"rank": rank, "steps": count[rank], "step_s": wall[rank] / count[rank],
             "compute_s": busy[rank] / count[rank], "communication_s": waiting[rank] / count[rank]}
            for rank in sorted(count)]
    least = min((row["communication_s"] for row in rows), default=0.0)
    for row in rows:
        row["straggler_wait_s"] = row["communication_s"] - least
    return rows


def _milliseconds(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def report(records: Sequence[KernelRecord], steps: Sequence[StepRecord], meta: dict, top: int = 10) -> str:
    """The text summary: per stage, per layer, the top kernels and each rank's wait."""
    train = [r for r in records if r.phase == TRAIN]
    rank_steps = max(len(steps), 1)  # (rank, step) pairs: per-step figures are means over ranks too
    mean_step = sum(s.duration for s in steps) / rank_steps
    lines = [f"{meta.get('model', '?')} on {meta.get('dataset', '?')}: global batch {meta.get('global_batch', '?')}, "
             f"{meta.get('ranks', '?')} rank(s), device {meta.get('device', '?')}; "
             f"{len({s.step for s in steps})} traced step(s), mean step {_milliseconds(mean_step)} ms", ""]

    read_ahead = [r for r in train if r.thread == DATA_THREAD]
    train = [r for r in train if r.thread != DATA_THREAD]
    stage_rows = {row["stage"]: row for row in grouped(train, lambda r: (r.stage,), ("stage",))}
    lines += ["Per stage (ms per step, mean over ranks)", format_table(
        ("stage", "ms/step", "% of step", "GFLOP/s", "GB/s"),
        [(stage, _milliseconds(row["total_s"] / rank_steps), f"{100 * row['total_s'] / rank_steps / mean_step:.1f}",
          _rate(row["gflops_per_s"]), _rate(row["gbytes_per_s"]))
         for stage in STAGES if (row := stage_rows.get(stage))]), ""]
    if read_ahead:
        lines += [f"Batches read ahead on the data thread (outside the step): "
                  f"{_milliseconds(sum(r.duration for r in read_ahead) / rank_steps)} ms per step", ""]

    by_layer: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    flops: dict[tuple, float] = defaultdict(float)
    for r in train:
        if r.layer >= 0:
            column = "comm" if r.thread == COMMUNICATION else r.stage
            by_layer[(r.layer, r.layer_name, r.layer_type)][column] += r.duration / rank_steps
            if r.thread != COMMUNICATION and not math.isnan(r.flops):
                flops[(r.layer, r.layer_name, r.layer_type)] += r.flops
    layer_lines = []
    for key in sorted(by_layer):
        times = by_layer[key]
        compute = sum(v for k, v in times.items() if k != "comm")
        stage_times = (_milliseconds(times.get(stage, 0.0)) for stage in ("FP", "BP", "WU", "comm"))
        achieved = _rate(flops[key] / rank_steps / compute / 1e9) if compute else "-"
        layer_lines.append((f"{key[0]} {key[1]}", key[2], *stage_times, achieved))
    lines += ["Per layer (ms per step)",
              format_table(("layer", "type", "FP", "BP", "WU", "comm", "GFLOP/s"), layer_lines), ""]

    kernels = sorted(grouped(train, lambda r: (r.kernel,), ("kernel",)), key=lambda row: -row["total_s"])[:top]
    lines += [f"Top {len(kernels)} kernels", format_table(
        ("kernel", "calls/step", "ms/step", "% of step", "mean ms", "GFLOP/s", "GB/s"),
        [(row["kernel"], f"{row['calls'] / rank_steps:.1f}", _milliseconds(row["total_s"] / rank_steps),
          f"{100 * row['total_s'] / rank_steps / mean_step:.1f}", _milliseconds(row["mean_s"]),
          _rate(row["gflops_per_s"]), _rate(row["gbytes_per_s"])) for row in kernels]), ""]

    ranks = rank_rows(records, steps)
    lines += ["Per rank (ms per step): communication is mostly waiting for the slowest rank", format_table(
        ("rank", "steps", "step", "compute", "communication", "straggler wait"),
        [(row["rank"], row["steps"], _milliseconds(row["step_s"]), _milliseconds(row["compute_s"]),
          _milliseconds(row["communication_s"]), _milliseconds(row["straggler_wait_s"])) for row in ranks])]
    if len(ranks) > 1:
        slowest = min(ranks, key=lambda row: row["communication_s"])
        worst = max(row["straggler_wait_s"] for row in ranks)
        lines.append(f"rank {slowest['rank']} is the straggler: the others wait up to {_milliseconds(worst)} ms "
                     "per step for it")
    return "\n".join(lines)
