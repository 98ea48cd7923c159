"""How far the machine moved between a calibration and a run, and the correction it asks for.

Both measure the same machine-state probe (``measuring/machine_state.py``): every core
of the machine runs a one-thread GEMM and then a copy at the same time, as a job's
ranks load every core, and an Allreduce is timed over the job's ranks. A kernel's
predicted time is scaled by the ratio of the rate that bounds it, then to now:

- GEMM, as the run's kernel probe's products moved as a whole: on the calibration's
  processor they follow a job's products, at the peak and off it, where the every-core
  probe's GEMM read the development machine up to a quarter faster than they ran
  (2026-12-06). On another processor, where peaks differ most, the part of a product's
  calibrated time that ran at the calibration probe's GEMM rate moves with the GEMM
  rates and the rest as the kernel probe's products (a product that stayed below the
  peak on the calibration's machine moves less than the peak does); without a kernel
  probe, the rest moves with the copy rates;
- every other compute kernel by its own ratio where the run's kernel probe
  (``measuring/kernel_probe.py``) timed it: against the calibration's own runs of the
  probe, as the probe's work as a whole moved and by its share of that work where the
  share moved beyond its spread (:func:`probe_moves`), or, against a calibration without
  them, its calls' times now over what the calibration's model predicts for them
  (:func:`kernel_ratios`); the updates of a probe whose ranks met as a job's, against
  the models whatever the calibration's probes (``machines._updates_against_the_models``); a fused
  kernel that it did not time, by the mean of the ratios of the kernels it replaces;
  otherwise, and the time between kernels, by the copy rates (memory-bound, or the
  interpreter's pace, which moves with the memory system and the clock alike);
- communication, by the probe's Allreduce time now against the calibration's probe,
  carried over to the run's rank count by the calibration's Allreduce model; not the
  links' rate between nodes, which the machine's moves leave as it was
  (``AdjustedMachine.link_seconds``).

A shared machine's cores change speed on their own, by a third for seconds at a time: a
probe of one instant says little of a run of a minute. A run probes every core between
its traced steps about once a second (:class:`CoreRates`, one instant each); the rate of
an instant is the one a synchronous step runs at, the slowest core's (every rank waits
for the slowest), or where ranks outnumber the cores and time-share them, the cores'
harmonic mean. A run's state is the mean over its instants, in time, as its measured
step is the mean of its steps; a calibration's is the median over the instants it took
between its probe networks, as its kernel samples are medians over repeated steps.

A probe is itself a measurement on a machine that moves: each records how far its own
figures spread. A ratio is corrected only by the part of its move that lies beyond the
two probes' combined spread (a soft threshold on its logarithm), so noise within a probe's
repeatability leaves a prediction as it is, and a machine that really moved, to another
day's clock or another processor, is still corrected for most of the move. The kernel
probe runs as a traced run starts and again as it ends (a probe of a second caught
a slow spell that the steps did not have: LeNet's correction then overshot by a
third, 2026-11-26), and the run's figure is their mean.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from pydtnn_lite.costs import FUSED_KERNELS, GEMM
from pydtnn_lite.perfmodel.modelling.regression import KernelSample, sample_columns, samples_from_columns

DRIFT_WARNING = 0.10  # a probe rate that moved more than this makes validate warn

COMPUTE_BOUND = frozenset({GEMM})
# A model's updates stream its parameters and optimizer state, megabytes the step has pushed
# out of the caches, as the copy probe does; against the models, a probe network's few layers
# time them worse (2026-11-24: VGG11's updates moved x0.55, the copy x0.55, the kernel
# probe's x0.84), so there they keep the copy ratio (like for like they count). So do the
# other passes over the whole gradient, which the kernel probe never runs: moved as its small
# adds, VGG11's and ResNet18's came out up to 24 % long (2026-12-06 23:26; up to 13 % so).
STREAMING = frozenset({"sgd_update", "adam_update", "start_gradient_sum", "accumulate_gradients", "gradient_norm",
                       "scale_gradient"})
Pieces = Sequence[tuple[Hashable, float]]  # pieces of work, each (what it was, e.g. a call's sizes; seconds)


@dataclass(frozen=True)
class CoreRates:
    """One instant of the every-core probe: each core's one-thread float32 GEMM FLOP/s and
    copy bytes/s (read and written), all cores busy at once, with their relative spreads
    over the probe's repeats; ``shared`` when the job's ranks outnumber the cores."""

    gemm_flops: tuple[float, ...]
    copy_bytes_per_second: tuple[float, ...]
    gemm_spread: float = 0.0
    copy_spread: float = 0.0
    shared: bool = False

    def pace(self) -> tuple[float, float]:
        """(GEMM FLOP/s, copy bytes/s) a synchronous step runs at: the slowest core's, or
        where ranks time-share the cores (and the OS moves them between cores) their
        harmonic mean."""
        if self.shared:
            return (statistics.harmonic_mean(self.gemm_flops),
                    statistics.harmonic_mean(self.copy_bytes_per_second))
        return min(self.gemm_flops), min(self.copy_bytes_per_second)

    def imbalance(self) -> float:
        """How much longer the slowest core takes over a GEMM than the cores' mean (0.05:
        5 %), what a rank on an average core waits at a synchronisation per second of work;
        0 where ranks time-share the cores (the OS moves each over all of them)."""
        if self.shared:
            return 0.0
        return _slowest_over_mean([1.0 / flops for flops in self.gemm_flops])


@dataclass(frozen=True)
class MachineState:
    """What the probes measured: the FLOP/s of a one-thread float32 GEMM and the bytes/s
    of a one-thread copy at the pace of a synchronous step (:meth:`CoreRates.pace`) over
    ``probes`` instants on ``cores`` cores, and the seconds of an Allreduce of
    ``allreduce_bytes`` over ``allreduce_ranks`` ranks (None with one rank).

    The ``*_spread`` fields are each figure's relative uncertainty (0.05: +-5 %): over
    several instants, the standard error of their centre; of one instant, the spread of
    its repeats."""

    gemm_flops: float
    copy_bytes_per_second: float
    allreduce_ranks: int = 1
    allreduce_bytes: int = 0
    allreduce_seconds: float | None = None
    gemm_spread: float = 0.0
    copy_spread: float = 0.0
    allreduce_spread: float = 0.0
    cores: int = 1
    probes: int = 1
    imbalance: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> MachineState:
        known = {field.name for field in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in known})

    @classmethod
    def over(cls, instants: Sequence[CoreRates], allreduce: Sequence[tuple[int, int, float, float]] = (),
             typical: bool = False) -> MachineState:
        """The state over ``instants`` of the every-core probe: the mean in time of their
        paces and of each core's time (a run's), or with ``typical`` their medians (a
        calibration's), the imbalance the :func:`lasting_imbalance` of those; and the mean
        of the ``allreduce`` probes (ranks, bytes, seconds, spread), which must have
        timed the same ranks and bytes."""
        paces = [instant.pace() for instant in instants]
        gemm, gemm_spread = _centre([1 / pace[0] for pace in paces], [i.gemm_spread for i in instants], typical)
        copy, copy_spread = _centre([1 / pace[1] for pace in paces], [i.copy_spread for i in instants], typical)
        ranks, nbytes, seconds, allreduce_spread = mean_allreduce(allreduce)
        return cls(1 / gemm, 1 / copy, ranks, nbytes, seconds, gemm_spread, copy_spread, allreduce_spread,
                   cores=max(len(i.gemm_flops) for i in instants), probes=len(instants),
                   imbalance=lasting_imbalance(instants, typical))


def lasting_imbalance(instants: Sequence[CoreRates], median: bool = False) -> float:
    """How much longer the slowest core takes over a GEMM than the cores' mean, each core's
    time the mean (or median) over ``instants``: the part of each instant's
    :meth:`CoreRates.imbalance` that stays with one core. A core slow at one instant and
    fast at the next is the ranks' wandering, which the fitted wait already holds; counted
    per instant it was charged twice (a run whose slower rank changed from step to step
    read 11.5 % instant by instant, 4.3 % core by core). 0 where ranks time-share the cores or the
    instants probed different cores."""
    if any(instant.shared for instant in instants) or len({len(i.gemm_flops) for i in instants}) != 1:
        return 0.0
    per_core = zip(*([1.0 / flops for flops in instant.gemm_flops] for instant in instants), strict=True)
    return _slowest_over_mean([_middle(times, median) for times in per_core])


def _slowest_over_mean(core_times: Sequence[float]) -> float:
    """How much longer the slowest of ``core_times`` is than their mean (0 for one core)."""
    if len(core_times) < 2:
        return 0.0
    return max(core_times) / statistics.fmean(core_times) - 1.0


def mean_allreduce(allreduce: Sequence[tuple[int, int, float, float]]) -> tuple[int, int, float | None, float]:
    """(ranks, bytes, seconds, spread) of Allreduce probes that timed the same ranks and bytes:
    their mean seconds, and the larger of their mean spread and half their range relative
    to it; (1, 0, None, 0) without any."""
    if not allreduce:
        return 1, 0, None, 0.0
    ranks, nbytes = allreduce[0][:2]
    if any(probe[:2] != (ranks, nbytes) for probe in allreduce):
        raise ValueError("Allreduce probes of different ranks or sizes cannot be averaged")
    seconds = statistics.fmean(probe[2] for probe in allreduce)
    differ = (max(p[2] for p in allreduce) - min(p[2] for p in allreduce)) / (2 * seconds)
    return ranks, nbytes, seconds, max(statistics.fmean(p[3] for p in allreduce), differ)


def _middle(values: Sequence[float], median: bool) -> float:
    return statistics.median(values) if median else statistics.fmean(values)


def _centre(seconds_per_unit: Sequence[float], spreads: Sequence[float], median: bool) -> tuple[float, float]:
    """The mean (or median) of ``seconds_per_unit`` and its relative standard error (a
    median's is about 1.25 times a mean's); of one value, its own ``spreads``."""
    if len(seconds_per_unit) == 1:
        return seconds_per_unit[0], spreads[0]
    centre = _middle(seconds_per_unit, median)
    error = statistics.stdev(seconds_per_unit) / math.sqrt(len(seconds_per_unit)) * (1.25 if median else 1.0)
    return centre, error / centre


def beyond_noise(ratio: float, *spreads: float) -> float:
    """``ratio`` with the part of its move that the probes' ``spreads`` (relative, combined
    in quadrature) can explain taken off: 1.0 within the noise, and beyond it the move on
    the logarithm shrunk by the factor 1 - (noise / move)^2, so a ratio and its inverse
    shrink alike. A move well beyond the noise keeps nearly all of itself: taking the
    noise off every move (a soft threshold, before 2026-11-29) left the predictions of a
    machine 1.2-2.5x slower than its calibration short by that noise, 5.7 % on average
    over 52 traces (2.6 % with this shrinkage)."""
    noise = math.log1p(math.hypot(*spreads)) if spreads else 0.0
    move = math.log(ratio)
    if move == 0.0:
        return 1.0
    return math.exp(move * max(0.0, 1.0 - (noise / move) ** 2))


@dataclass(frozen=True)
class Drift:
    """Time ratios, now over then, by the kind of work: >1 when the machine runs slower now;
    the moves beyond the probes' noise, with ``noise`` the largest combined spread of the
    probes (relative) and ``measured`` the largest move before the noise was taken off;
    ``peak_flops``, the calibration probe's one-core GEMM FLOP/s (0: unknown); ``kernels``,
    the ratios of the kernels the run's kernel probe timed (:func:`kernel_ratios`);
    ``probed_gemm``, how its products moved; ``other_processor``, whether the run's
    processor is not the calibration's; ``probes_apart``, whether the calibration's kernel
    probes ran their ranks apart where the run's met (:attr:`ProbedWork.meeting_ranks`)."""

    compute: float = 1.0
    memory: float = 1.0
    communication: float = 1.0
    noise: float = 0.0
    measured: float = 0.0
    peak_flops: float = 0.0
    kernels: Mapping[str, float] = field(default_factory=dict)
    imbalance: float | None = None  # the run's probe's (:meth:`CoreRates.imbalance`); None: not probed
    probed_gemm: float | None = None  # as the kernel probe's products moved; None: not timed
    other_processor: bool = False
    probes_apart: bool = False  # the run's kernel probe met as a job's ranks do, the calibration's ran apart

    def scale(self, kernel: str, communication: bool = False, flops: float = 0.0, seconds: float = 0.0) -> float:
        """The factor for a kernel's predicted time (``communication``: a collective). A
        compute-bound kernel moves as the kernel probe's products did (``probed_gemm``). On
        another processor, or without them, one of ``flops`` that took ``seconds`` at the
        calibration moves with the GEMM rates for the share of its time that ran at the
        calibration probe's rate (``peak_flops``; the whole of it where either is unknown),
        the rest as the kernel probe's products, else with memory."""
        if communication:
            return self.communication
        if kernel in FUSED_KERNELS and kernel not in self.kernels:
            # The kernel probe runs no fused kernel, and a calibration older than one predicts
            # it from its parts: it moves as they do. The other passes a calibration may
            # predict from the add stream the gradient and move with memory (STREAMING).
            parts = FUSED_KERNELS[kernel]
            return sum(self.kernels.get(part, self.memory) for part in parts) / len(parts)
        if kernel not in COMPUTE_BOUND:
            return self.kernels.get(kernel, self.memory)
        if self.probed_gemm is not None and not self.other_processor:
            return self.probed_gemm
        at_peak = peak_share(flops, seconds, self.peak_flops)
        rest = self.memory if self.probed_gemm is None else self.probed_gemm
        return at_peak * self.compute + (1.0 - at_peak) * rest

    @property
    def moved(self) -> bool:
        """Whether the probes measured a move of more than :data:`DRIFT_WARNING`, noise or not."""
        return self.measured > DRIFT_WARNING

    def describe(self) -> str:
        """The ratios in one line, as ``validate`` and ``predict --probe`` print them."""
        own = (f"; {len(self.kernels)} kinds of work by the kernel probe's (x{min(self.kernels.values()):.2f} "
               f"to x{max(self.kernels.values()):.2f})") if self.kernels else ""
        noise = (f"; the probes measured moves up to {100 * self.measured:.0f} % and repeat within "
                 f"+-{100 * self.noise:.0f} %, a part of each move that is not corrected") if self.noise else ""
        if self.probed_gemm:
            part = " off their peak" if self.other_processor else ""
            own = f"; the model's GEMMs{part} x{self.probed_gemm:.3f}, as the kernel probe's products moved" + own
        slowest = (f"; the slowest core {100 * self.imbalance:.1f} % slower than the cores' mean"
                   if self.imbalance else "")
        # The every-core probe's GEMM, named as such: the model's GEMMs follow it only on another
        # processor or without a kernel probe.
        return (f"every-core GEMM x{self.compute:.3f}, memory x{self.memory:.3f}, "
                f"communication x{self.communication:.3f}"
                f"{own} (time now over time at calibration{noise}){slowest}")


@dataclass(frozen=True)
class ProbedWork:
    """What a run's kernel probe measured (``measuring/kernel_probe.py``): every kernel call
    of its networks with its median seconds (``calls``, by kernel); each network's step,
    (compute kernel calls, seconds outside them) (``outside``); and loading batches of the
    run's data set, (samples, seconds) by data set (``data``). ``meeting_ranks``: how many
    ranks probed together, meeting as a job's ranks meet; 0 where they ran apart (records
    written before 2026-12-07, evening)."""

    calls: Mapping[str, Sequence[KernelSample]] = field(default_factory=dict)
    outside: Sequence[tuple[float, float]] = ()
    data: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    runs: int = 1  # runs of the probe whose seconds these are the mean of
    meeting_ranks: int = 0

    def to_dict(self) -> dict:
        return {"calls": {name: sample_columns(list(calls)) for name, calls in sorted(self.calls.items())},
                "outside": [list(sample) for sample in self.outside],
                "data": {name: [list(sample) for sample in samples] for name, samples in self.data.items()},
                "meeting_ranks": self.meeting_ranks}

    @classmethod
    def from_dict(cls, record: dict) -> ProbedWork:
        return cls({name: samples_from_columns(columns) for name, columns in record.get("calls", {}).items()},
                   [(float(calls), float(seconds)) for calls, seconds in record.get("outside", [])],
                   {name: [(float(n), float(seconds)) for n, seconds in samples]
                    for name, samples in record.get("data", {}).items()},
                   meeting_ranks=int(record.get("meeting_ranks", 0)))

    @classmethod
    def mean(cls, runs: Sequence[ProbedWork]) -> ProbedWork:
        """The runs of the probe that timed the same work as the first (every run of one
        job does), each piece's seconds their mean; an empty probe without any."""
        if not runs:
            return cls()
        alike = [run for run in runs if _same_work(run, runs[0])]

        def mean_seconds(pieces: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
            return [(piece[0][0], statistics.fmean(seconds for _, seconds in piece))
                    for piece in zip(*pieces, strict=True)]
        calls = {kernel: [replace(samples[0], seconds=statistics.fmean(s.seconds for s in samples))
                          for samples in zip(*(run.calls[kernel] for run in alike), strict=True)]
                 for kernel in runs[0].calls}
        return cls(calls, mean_seconds([run.outside for run in alike]),
                   {name: mean_seconds([run.data[name] for run in alike]) for name in runs[0].data}, len(alike),
                   runs[0].meeting_ranks)


def _same_work(run: ProbedWork, first: ProbedWork) -> bool:
    """Whether ``run`` timed the calls, steps and batches that ``first`` did."""
    return ({kernel: [call.dims for call in calls] for kernel, calls in run.calls.items()}
            == {kernel: [call.dims for call in calls] for kernel, calls in first.calls.items()}
            and [calls for calls, _ in run.outside] == [calls for calls, _ in first.outside]
            and {name: [n for n, _ in samples] for name, samples in run.data.items()}
            == {name: [n for n, _ in samples] for name, samples in first.data.items()})


def work_ratio(seconds: Sequence[tuple[float, float]], noise: float = 0.0) -> float | None:
    """Time now over then of pieces of work timed now and known then, ``seconds`` as (now,
    then) pairs: their totals' ratio, less the part that ``noise`` (relative, of the ratio)
    explains (:func:`beyond_noise`); None without any."""
    now, before = sum(pair[0] for pair in seconds), sum(pair[1] for pair in seconds)
    if not seconds or now <= 0 or before <= 0:
        return None
    return beyond_noise(now / before, noise)


def peak_share(flops: float, seconds: float, peak_flops: float) -> float:
    """The share of a GEMM's ``seconds`` that its ``flops`` take at ``peak_flops`` (at most
    all of it; all of it where either is unknown)."""
    return min(1.0, flops / (peak_flops * seconds)) if peak_flops > 0 and seconds > 0 else 1.0


def kernel_ratios(calls: Mapping[str, Sequence[KernelSample]], before: Mapping[str, Sequence[float]],
                  noise: Mapping[str, float], left_out: frozenset[str] = COMPUTE_BOUND | STREAMING) -> dict[str, float]:
    """Each compute kernel's time now over then, from the kernel probe's ``calls`` (seconds
    measured now) and ``before``, the seconds of the same calls at the calibration (kernels
    without them are left out): their totals' ratio, which weighs each call by its time as
    a step does (a probe's smallest calls, a few microseconds of launching a loop, say
    little of a large model's), with the part of its move that the kernel's ``noise``
    (relative, of the ratio) can explain taken off (:func:`beyond_noise`). The kernels
    ``left_out`` are too: by default GEMM, left to the GEMM and copy rates, and the updates
    (:data:`STREAMING`), left to the copy rates where the probe's ranks ran apart.
    """
    ratios = {}
    for kernel, samples in calls.items():
        if kernel in left_out or kernel not in before:
            continue
        ratio = work_ratio([(call.seconds, then) for call, then in zip(samples, before[kernel], strict=True)],
                           noise.get(kernel, 0.0))
        if ratio is not None:
            ratios[kernel] = ratio
    return ratios


def log_spread(values: Sequence[float]) -> float:
    """The relative spread of positive ``values``: the standard deviation of their logarithms
    (0 for fewer than two)."""
    return statistics.stdev(math.log(value) for value in values) if len(values) > 1 else 0.0


def ratio_noise(values: Sequence[float], runs: int = 1) -> float:
    """The relative noise of a figure measured anew, the mean of ``runs`` measurements, over
    the median of positive ``values``, earlier measurements of the same: their spread
    (:func:`log_spread`), of the new figure over the square root of ``runs``, of the median
    1.2533 times it over the square root of their number, combined in quadrature. (The new
    figure's own share was left out until 2026-11-26: it is the larger.)"""
    return log_spread(values) * math.sqrt(1.0 / runs + math.pi / 2 / len(values)) if values else 0.0


def _timed_alike(work: Pieces, references: Sequence[Pieces]) -> bool:
    """Whether there are ``references`` and each timed the pieces of ``work``: the same
    names, in the same order."""
    names = [name for name, _ in work]
    return bool(references) and all([name for name, _ in reference] == names for reference in references)


def like_for_like(now: Pieces, references: Sequence[Pieces], runs: int = 1) -> tuple[list[float], float] | None:
    """The seconds of the pieces of work ``now`` (the mean of ``runs`` runs of the probe) in
    ``references``, the calibration's own runs of the probe: each piece's median over
    them, and the noise of a ratio of totals to those medians (:func:`ratio_noise` of the
    references' totals). None where a reference did other work, or there is none."""
    if not _timed_alike(now, references):
        return None
    medians = [float(np.median([seconds for _, seconds in piece])) for piece in zip(*references, strict=True)]
    return medians, ratio_noise([sum(seconds for _, seconds in reference) for reference in references], runs)


def probe_moves(now: Mapping[str, Pieces], references: Sequence[Mapping[str, Pieces]],
                runs: int = 1) -> dict[str, float]:
    """How far each kind of work moved since the calibration, from a run's probe ``now`` and
    the calibration's own runs of it, ``references``, each as pieces of work by kind (a
    kernel's calls named by their sizes, the steps' time outside the kernels named by their
    calls). Only kinds that every reference timed alike count.

    Each moves as the probe's work as a whole (its total now, the mean of ``runs`` runs of
    the probe, over the references' median total, its steadiest figure), times its share
    of that total now over its median share then: each beyond its noise, the references'
    spread of the same figure for the run's probe and for their median (:func:`ratio_noise`,
    :func:`beyond_noise`). A change of processor moves kinds apart, the machine's wander
    moves them all alike."""
    kinds = [kind for kind, pieces in now.items()
             if _timed_alike(pieces, [reference.get(kind, []) for reference in references])]

    def totals(work: Mapping[str, Pieces]) -> dict[str, float]:
        return {kind: sum(seconds for _, seconds in work[kind]) for kind in kinds}

    now_totals, reference_totals = totals(now), [totals(reference) for reference in references]
    if not kinds or min(min(t.values()) for t in [now_totals, *reference_totals]) <= 0:
        return {}
    wholes = [sum(t.values()) for t in reference_totals]
    whole = beyond_noise(sum(now_totals.values()) / statistics.median(wholes), ratio_noise(wholes, runs))
    shares = [{kind: total / sum(t.values()) for kind, total in t.items()} for t in reference_totals]
    moves = {}
    for kind in kinds:
        then = [share[kind] for share in shares]
        share_now = now_totals[kind] / sum(now_totals.values())
        moves[kind] = whole * beyond_noise(share_now / statistics.median(then), ratio_noise(then, runs))
    return moves


def drift_between(then: MachineState, now: MachineState,
                  allreduce_model: Callable[[float, int], float] | None = None) -> Drift:
    """The drift from the calibration's probe ``then`` to a run's probe ``now``.

    Communication compares the two probes' Allreduce: directly when they timed the same
    ranks and bytes, otherwise through ``allreduce_model(bytes, ranks)``, the calibration's
    model, which says how much longer the run's Allreduce takes than the calibration's
    on an unmoved machine. Without both probes' Allreduce (or the model, where it is
    needed) communication is taken as unmoved. Each ratio keeps only its move beyond the
    two probes' spreads (:func:`beyond_noise`).
    """
    communication = 1.0
    if now.allreduce_seconds and then.allreduce_seconds:
        same = (now.allreduce_ranks, now.allreduce_bytes) == (then.allreduce_ranks, then.allreduce_bytes)
        if same:
            communication = now.allreduce_seconds / then.allreduce_seconds
        elif allreduce_model is not None:
            carried = allreduce_model(now.allreduce_bytes, now.allreduce_ranks) / allreduce_model(
                then.allreduce_bytes, then.allreduce_ranks)
            communication = now.allreduce_seconds / (then.allreduce_seconds * carried)
    measured = {"compute": (then.gemm_flops / now.gemm_flops, then.gemm_spread, now.gemm_spread),
                "memory": (then.copy_bytes_per_second / now.copy_bytes_per_second, then.copy_spread, now.copy_spread),
                "communication": (communication, then.allreduce_spread, now.allreduce_spread)}
    return Drift(compute=beyond_noise(*measured["compute"]), memory=beyond_noise(*measured["memory"]),
                 communication=beyond_noise(*measured["communication"]),
                 noise=max(math.hypot(then_spread, now_spread) for _, then_spread, now_spread in measured.values()),
                 measured=max(abs(ratio - 1.0) for ratio, _, _ in measured.values()), peak_flops=then.gemm_flops,
                 imbalance=now.imbalance)
