"""Several calibrations of one machine as one: their samples pooled, their snapshots averaged.

A calibration is a snapshot of a machine that moves: on a shared host the same kernels run
5-8 % faster or slower from one hour to the next, and a file measured in a fast hour
predicts every run after it short (on 2026-11-26 the 16:36 file predicted the zoo's steps
+0.2 to +5.5 % long on average, the 19:24 file -2.5 to -8.6 % short, over the same four
sets of runs). Pooling the samples of calibrations taken at different times fits models of
the machine's typical pace, as the drift correction assumes a calibration to be.

What is pooled: every kernel's samples (the models are fitted again on them by the
caller, ``python -m pydtnn_lite.calibrate --merge``), the samples of calls that follow
other work, of the waits for the slowest rank, of loading data and of reading ahead;
each file's Allreduce as one median a rank count and size (:func:`_once_a_size`); the
probe networks' time outside the kernels (the zoo networks sampled whole, the same jobs
in each file, as the mean of their times); and the runs of the kernel probe, so that a
run's probe is set against all of them. The machine-state probe becomes the geometric
mean of the files' probes, its spread that of their centre; the thread scaling the
geometric mean of the files' (of one placement, so of one thread count). The roofs are
geometric means; the network timings (an emulated cluster's) are those of the
first file that has them. A kernel whose code changed between the files
(``costs.KERNEL_REVISIONS``) keeps only what the files of its newest revision timed: its
samples, best rates and calls in the kernel probe's runs.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.drift import MachineState
from pydtnn_lite.perfmodel.modelling.placement import ThreadScaling
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels

# How the kernels were sampled, by settings key, and what a difference says: samples taken
# two ways are not pooled.
_SAMPLING_SETTINGS = {
    "ranks_meet": "the calibrations' ranks met at different points of a probe's step (files written before "
                  "2026-12-06 met only after backward)",
    "sampled_after_seconds": "the calibrations sampled steps at different distances from a cache eviction (files "
                             "written before 2026-12-07 sampled the step right after one)",
}
# What must agree for calibrations to describe one machine placed one way.
SAME_MACHINE = ("cpu_model", "cores", "usable_cores", "ranks", "ranks_per_node", "blas_threads", "device", "dtype")


def merge_calibrations(calibrations: Sequence[Calibration]) -> Calibration:
    """One calibration holding the samples of all of ``calibrations`` (at least two, of one
    machine, placement and set of jobs sampled whole; each one's Allreduce as a median a
    size), its kernel models those of the first until the caller fits them again.
    ValueError naming what differs otherwise."""
    if len(calibrations) < 2:
        raise ValueError("merging needs at least two calibrations")
    first = calibrations[0]
    for other in calibrations[1:]:
        differing = [key for key in SAME_MACHINE if first.machine.get(key) != other.machine.get(key)]
        if "cpu_model" not in differing:
            ours, theirs = Processor.of(first.machine), Processor.of(other.machine)
            if not ours.same_vector_unit(theirs):
                differing.append("vector_unit")
            elif not ours.same_cache(theirs):
                differing.append("last-level cache")
            elif not ours.same_generation(theirs):
                differing.append("processor generation")
        if blas_kernels(first.machine) != blas_kernels(other.machine):
            differing.append("BLAS kernels")
        if differing:
            raise ValueError(f"the calibrations differ in {', '.join(differing)}: merge calibrations of one machine "
                             "placed one way")
        if first.settings.get("jobs", []) != other.settings.get("jobs", []):
            raise ValueError("the calibrations sampled different networks whole (calibrate --models): merge "
                             "calibrations made with the same --models")
        for setting, differs in _SAMPLING_SETTINGS.items():
            if first.settings.get(setting) != other.settings.get(setting):
                raise ValueError(f"{differs}: calibrate again and merge the new files")
    revisions = _newest_revisions(calibrations)
    calibrations = [_without_kernels(c, {kernel for kernel, revision in revisions.items()
                                         if c.revision(kernel) < revision}) for c in calibrations]
    dates = sorted(str(c.machine.get("date", "")) for c in calibrations)
    # A file written before the generation was recorded matches any: the merge names the one the others do.
    generation = next((c.machine["cpu_generation"] for c in calibrations if c.machine.get("cpu_generation")), "")
    machine = {**first.machine, "date": dates[-1], "merged_dates": dates,
               **({"cpu_generation": generation} if generation else {})}
    return dataclasses.replace(
        first, machine=machine,
        peak_flops=_geometric_mean([c.peak_flops for c in calibrations]),
        memory_bandwidth=_geometric_mean([c.memory_bandwidth for c in calibrations]),
        kernel_samples=_pooled([c.kernel_samples for c in calibrations]),
        cold_start_samples=_pooled([c.cold_start_samples for c in calibrations]),
        kernel_rates=_best_rates([c.kernel_rates for c in calibrations]),
        allreduce_samples=[s for c in calibrations for s in _once_a_size(c.allreduce_samples)],
        allreduce_cpu_samples=[s for c in calibrations for s in _once_a_size(c.allreduce_cpu_samples)],
        sync_samples=[s for c in calibrations for s in c.sync_samples],
        overhead_samples=_overhead_samples(calibrations),
        data_load_samples=_pooled([c.data_load_samples for c in calibrations]),
        read_ahead_samples=[s for c in calibrations for s in c.read_ahead_samples],
        machine_state=_mean_state([c.machine_state for c in calibrations]),
        network=next((c.network for c in calibrations if c.network is not None), None),
        cache_residency=next((c.cache_residency for c in calibrations if c.cache_residency is not None), None),
        bucket_progress=next((c.bucket_progress for c in calibrations if c.bucket_progress is not None), None),
        kernel_probes=[run for c in calibrations for run in c.kernel_probes],
        thread_scaling=_mean_scaling([c.thread_scaling for c in calibrations]),
        kernel_revisions={kernel: revision for kernel, revision in revisions.items() if revision > 1})


def _newest_revisions(calibrations: Sequence[Calibration]) -> dict[str, int]:
    """Each kernel that some file timed past its first revision, with the newest any file timed."""
    kernels = {kernel for calibration in calibrations for kernel in calibration.kernel_revisions}
    return {kernel: max(calibration.revision(kernel) for calibration in calibrations) for kernel in sorted(kernels)}


def _without_kernels(calibration: Calibration, kernels: set[str]) -> Calibration:
    """``calibration`` less what it timed of ``kernels``: samples, best rates, the probe's calls."""
    if not kernels:
        return calibration

    def kept(by_kernel: dict) -> dict:
        return {kernel: value for kernel, value in by_kernel.items() if kernel not in kernels}
    return dataclasses.replace(
        calibration, kernel_samples=kept(calibration.kernel_samples),
        cold_start_samples=kept(calibration.cold_start_samples), kernel_rates=kept(calibration.kernel_rates),
        kernel_probes=[dataclasses.replace(run, calls=kept(dict(run.calls))) for run in calibration.kernel_probes])


def _once_a_size(samples: Sequence[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """A file's (ranks, bytes, seconds) Allreduce samples as the median of each (ranks,
    bytes), so that each file counts once where the prediction takes the median of a size's
    samples, as each counts once in the merged machine state. A file that is itself a merge
    holds many samples a size and would outvote the others: on 2026-12-02 a file of
    2026-11-27 with 14 samples a size, merged with two of the morning with one each, gave a
    4 MiB Allreduce on 2 ranks 1.32 ms where the morning's files had 0.61 and 0.78 ms, and
    the zoo's COMM on 2 ranks was predicted 15 to 266 % off (median 87 %) where with each
    file once it is 13 to 126 % off (median 40 %)."""
    by_size: dict[tuple[int, float], list[float]] = {}
    for ranks, nbytes, seconds in samples:
        by_size.setdefault((ranks, nbytes), []).append(seconds)
    return [(ranks, nbytes, statistics.median(times)) for (ranks, nbytes), times in by_size.items()]


def _geometric_mean(values: Sequence[float]) -> float:
    if len(values) == 1 or min(values) <= 0:
        return values[0]
    return math.exp(statistics.fmean(math.log(value) for value in values))


def _mean_scaling(scalings: Sequence[ThreadScaling | None]) -> ThreadScaling | None:
    """The files' thread scalings as their geometric mean; those of the files that have one."""
    known = [scaling for scaling in scalings if scaling is not None]
    if not known:
        return None
    handoffs = [s.handoff for s in known if s.handoff is not None]
    shapes: dict[tuple[int, ...], list[float]] = {}
    for scaling in known:
        for dims, ratio in scaling.gemm_shapes.items():
            shapes.setdefault(dims, []).append(ratio)
    return ThreadScaling(known[0].threads, _geometric_mean([s.gemm for s in known]),
                         _geometric_mean([s.memory for s in known]), _geometric_mean(handoffs) if handoffs else None,
                         {dims: _geometric_mean(ratios) for dims, ratios in shapes.items()})


def _pooled(dicts: Sequence[dict]) -> dict:
    """Each key's lists, concatenated in the files' order."""
    out: dict = {}
    for samples in dicts:
        for key, values in samples.items():
            out.setdefault(key, []).extend(values)
    return out


def _best_rates(dicts: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each kernel's best rate of each kind over the files."""
    out: dict[str, dict[str, float]] = {}
    for rates in dicts:
        for kernel, kinds in rates.items():
            best = out.setdefault(kernel, {})
            for kind, rate in kinds.items():
                best[kind] = max(best.get(kind, 0.0), rate)
    return out


def _overhead_samples(calibrations: Sequence[Calibration]) -> list[tuple[float, float]]:
    """The grid probes' (calls, seconds outside the kernels) of every file, then each job's
    sampled whole as the mean over the files: a calibration keeps its jobs' samples last, in
    the order of its ``jobs`` setting (:meth:`Calibration.overhead_seconds`)."""
    jobs = len(calibrations[0].settings.get("jobs", []))
    grid = [s for c in calibrations for s in c.overhead_samples[:len(c.overhead_samples) - jobs]]
    whole = [c.overhead_samples[len(c.overhead_samples) - jobs:] for c in calibrations]
    return grid + [(samples[0][0], statistics.fmean(seconds for _, seconds in samples))
                   for samples in zip(*whole, strict=True)]


def _mean_state(states: Sequence[MachineState | None]) -> MachineState | None:
    """The probes' geometric mean, each figure's spread the standard error of that centre
    (at least the files' own); None where a file has no probe."""
    if any(state is None for state in states):
        return None
    known = [state for state in states if state is not None]

    def centre(values: Sequence[float], spreads: Sequence[float]) -> tuple[float, float]:
        logs = [math.log(value) for value in values]
        between = statistics.stdev(logs) / math.sqrt(len(logs))
        return math.exp(statistics.fmean(logs)), max(between, math.sqrt(statistics.fmean(s * s for s in spreads)))

    gemm, gemm_spread = centre([s.gemm_flops for s in known], [s.gemm_spread for s in known])
    copy, copy_spread = centre([s.copy_bytes_per_second for s in known], [s.copy_spread for s in known])
    first = known[0]
    allreduce, allreduce_spread = first.allreduce_seconds, first.allreduce_spread
    alike = all(s.allreduce_seconds and (s.allreduce_ranks, s.allreduce_bytes) == (first.allreduce_ranks,
                                                                                   first.allreduce_bytes)
                for s in known)
    if alike:  # the same reduction timed by every file: its mean too; otherwise the first file's
        allreduce, allreduce_spread = centre([s.allreduce_seconds or 0.0 for s in known],
                                             [s.allreduce_spread for s in known])
    return dataclasses.replace(first, gemm_flops=gemm, copy_bytes_per_second=copy, gemm_spread=gemm_spread,
                               copy_spread=copy_spread, allreduce_seconds=allreduce,
                               allreduce_spread=allreduce_spread, probes=sum(s.probes for s in known),
                               imbalance=statistics.fmean(s.imbalance for s in known))
