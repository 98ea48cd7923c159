"""The machine a prediction assumes: a preset cluster, figures given on the command line, or a calibration."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pydtnn_lite.costs import ALLREDUCE, COMPUTE_STAGES, DATA_LOAD, GEMM, PREDICTED_FROM, KernelCost, Stage
from pydtnn_lite.errors import UserError
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer
from pydtnn_lite.perfmodel.modelling.allreduce import (
    AllreduceModel,
    AllreduceTime,
    InterpolatedAllreduce,
    Link,
    fit_allreduce,
)
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.channel import NO_TRANSFER_COST, TransferCost
from pydtnn_lite.perfmodel.modelling.clusters import PRESETS, Cluster
from pydtnn_lite.perfmodel.modelling.drift import (
    COMPUTE_BOUND,
    STREAMING,
    Drift,
    MachineState,
    Pieces,
    ProbedWork,
    drift_between,
    kernel_ratios,
    like_for_like,
    probe_moves,
    work_ratio,
)
from pydtnn_lite.perfmodel.modelling.network import TwoLevelAllreduce
from pydtnn_lite.perfmodel.modelling.placement import Placement, kernel_handoff, kernel_scale, thread_scaling_gap
from pydtnn_lite.perfmodel.modelling.prediction import Machine, RooflineMachine, predict_step
from pydtnn_lite.perfmodel.modelling.processors import Processor
from pydtnn_lite.perfmodel.modelling.regression import KernelSample
from pydtnn_lite.perfmodel.modelling.roofline import Roofline


@dataclass(frozen=True)
class CalibratedMachine:
    """Kernels from a calibration's per-kernel models, Allreduce from its timings (:func:`calibrated_machine`).

    Calibrations are taken with MPI on the host, which moves data only inside MPI calls on
    the cores that also run backward: overlap hides no communication (docs/performance.md),
    except on several nodes (``calibration.network``), whose links move the data.
    The ranks wait for the slowest as much as the calibration's ranks did.
    ``allreduce_cpu`` models the CPU time per rank of the reductions at the process counts
    that time-share the cores (None where the calibration holds no such samples).
    ``inter_node`` models the Allreduce among one rank per node where the calibration's
    nodes held several ranks each (None elsewhere): what a job-wide reduction of the
    calibration's ranks moves over the links between the nodes.
    ``two_level``: the reductions are the hierarchical strategy's (:meth:`hierarchical`).
    """

    calibration: Calibration
    allreduce: AllreduceTime | None
    overlaps_communication: bool = False
    allreduce_cpu: AllreduceTime | None = None
    starts_inside_calls: bool = True  # MPICH moves a reduction's data only inside MPI calls
    inter_node: AllreduceTime | None = None
    two_level: bool = False

    def hierarchical(self, pipelined: bool) -> CalibratedMachine:
        """This machine reducing as the hierarchical strategy does on the calibration's nodes:
        its two levels' timings, the buckets crossing the links during backward where
        ``pipelined`` and after it otherwise (itself where the calibration has no nodes)."""
        network = self.calibration.network
        if network is None:
            return self
        return replace(self, allreduce=TwoLevelAllreduce.from_timings(network), overlaps_communication=pipelined,
                       two_level=True)

    @property
    def pipelines_in_tests(self) -> bool:
        """The hierarchical strategy during backward: its tests start each bucket's collectives in turn."""
        return self.two_level and self.overlaps_communication

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float:
        return self.calibration.kernel_seconds(kernel, cost)

    def kernel_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        return self.calibration.kernel_seconds_of(kernel, costs)

    def sync_wait_seconds(self, segment: float, procs: int) -> float:
        return self.calibration.sync_wait.seconds(segment, procs)

    def allreduce_seconds(self, nbytes: float, procs: int) -> float:
        if procs <= 1:
            return 0.0
        if self.allreduce is None:
            raise UserError("the calibration holds no Allreduce timings: calibrate under mpiexec -n 2 or more "
                            "to predict several ranks")
        return self.allreduce.seconds(nbytes, procs)

    def link_seconds(self, nbytes: float, procs: int) -> float:
        """On the calibration's nodes of several ranks each, a job-wide reduction of its ranks
        exchanges between the nodes what an Allreduce among one rank per node does (MPICH's
        halving and doubling cross the links in half their steps, the other half stays inside
        the nodes); elsewhere the links carry the whole reduction."""
        whole = self.allreduce_seconds(nbytes, procs)
        network = self.calibration.network
        if self.inter_node is None or network is None or procs != network.ranks:
            return whole
        return min(whole, self.inter_node.seconds(nbytes, network.nodes))

    def allreduce_during_compute_seconds(self, nbytes: float, procs: int) -> float:
        return self.allreduce_seconds(nbytes, procs)  # the calibration's ranks each have a core

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        return self.calibration.overhead_seconds(calls, network, batch, dataset)

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        return self.calibration.data_load_seconds(dataset, samples)

    def background_seconds(self, seconds: float) -> float:
        return self.calibration.read_ahead_seconds(seconds, self.calibration.placement)

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float:
        return _cache_factor(self.calibration, self.calibration.placement, kernel, nbytes, moved, since_use)

    def bucket_share_left(self, nbytes: float, procs: int) -> float:
        progress = self.calibration.bucket_progress
        return 1.0 if progress is None or procs <= 1 else progress.share_left(nbytes)

    @property
    def transfer_cost(self) -> TransferCost:
        network = self.calibration.network
        if network is None:
            return NO_TRANSFER_COST
        if self.two_level and network.two_level_transfer is not None:
            return network.two_level_transfer
        return network.transfer


@dataclass(frozen=True)
class AdjustedMachine:
    """A calibrated machine as a job sees it: its ranks placed as ``placement`` (the
    calibration's kernels scaled by :func:`~pydtnn_lite.perfmodel.modelling.placement.kernel_scale`),
    on a machine that moved by ``drift`` since the calibration."""

    base: CalibratedMachine
    placement: Placement
    drift: Drift = Drift()

    @property
    def overlaps_communication(self) -> bool:
        return self.base.overlaps_communication

    @property
    def starts_inside_calls(self) -> bool:
        return self.base.starts_inside_calls

    @property
    def pipelines_in_tests(self) -> bool:
        return self.base.pipelines_in_tests

    def _scale(self, kernel: str, flops: float = 0.0, seconds: float = 0.0, dims: tuple = ()) -> float:
        calibration = self.base.calibration
        return (kernel_scale(kernel, self.placement, calibration.placement, calibration.thread_scaling, dims)
                * self.drift.scale(kernel, flops=flops, seconds=seconds))

    def warnings(self, kernels: Iterable[str], dtype: str = "float32") -> list[str]:
        """What the calibration lacks to predict a step of ``kernels`` (their names) in
        ``dtype`` on this placement, one line each (none usually)."""
        calibration = self.base.calibration
        names = set(kernels)  # read twice below: a generator would be spent by the first
        gap = thread_scaling_gap(self.placement, calibration.placement, calibration.thread_scaling)
        lines = [gap] if gap else []
        timed = calibration.machine.get("dtype", "float32")
        if dtype != timed:
            lines.append(f"the calibration timed {timed} kernels, the step's are {dtype}: they are predicted at "
                         f"{timed}'s speed; calibrate with --dtype {dtype}")
        unmodelled = calibration.unmodelled(names)
        if unmodelled:
            lines.append(f"the calibration holds no samples of {', '.join(unmodelled)} (a file older than these "
                         "kernels): they are predicted at the roofline; calibrate again with this version")
        outdated = calibration.outdated(names)
        if outdated:
            lines.append(f"the calibration timed older code of {', '.join(outdated)} (changed since): they are "
                         "predicted at the old code's times; calibrate again with this version")
        counts = calibration.allreduce_rank_counts
        if counts and calibration.cache_residency is None and calibration.machine.get("device", "cpu") == "cpu":
            lines.append("the calibration holds no cache residency (a file older than it): buckets and updates "
                         "that a step leaves in the cache are predicted evicted; calibrate again, or add it with "
                         "calibrate --allreduce-only FILE")
        residency = calibration.cache_residency
        updates_timed_cold = (set(residency.resident) - {ALLREDUCE}
                              if residency is not None and not residency.warm_evicted_updates else set())
        if names & updates_timed_cold:
            lines.append("the calibration's cache residency timed each evicted update as the first call after an "
                         "eviction (a file older than 2026-12-07): updates that a step leaves in the cache come "
                         "out short, the small ones by up to half; calibrate again, or time it again with "
                         "calibrate --allreduce-only FILE")
        if self.drift.kernels and self.drift.probes_apart:
            lines.append("the calibration's kernel probes ran their ranks apart (a file older than 2026-12-07, "
                         "evening), the run's together as a job's: where the memory slows for ranks that stream "
                         "at once, the updates and other memory-bound kernels move less than the job's; "
                         "calibrate again")
        if (ALLREDUCE in names and calibration.bucket_progress is None and calibration.network is None
                and not self.placement.oversubscribed and calibration.machine.get("device", "cpu") == "cpu"):
            lines.append("the calibration holds no bucket progress (a file older than it): the buckets' reductions "
                         "are predicted whole in COMM, where the batch norms' reductions do most of them; "
                         "calibrate again, or add it with calibrate --allreduce-only FILE")
        if self.placement.oversubscribed and counts and self.placement.ranks not in counts:
            lines.append(f"the calibration timed Allreduce on {', '.join(map(str, sorted(counts)))} ranks, not on "
                         f"{self.placement.ranks} sharing the cores: their reductions come from a fit that does "
                         "not know the sharing; calibrate without --no-oversubscribed")
        return lines

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float:
        return self.kernel_seconds_of(kernel, [cost])[0]

    def kernel_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        calibration = self.base.calibration
        out = []
        for cost, seconds in zip(costs, self.base.kernel_seconds_of(kernel, costs), strict=True):
            dims = tuple(cost.dims)
            handoff = kernel_handoff(kernel, self.placement, calibration.placement, calibration.thread_scaling, dims)
            out.append(seconds * self._scale(kernel, cost.flops, seconds, dims) + handoff)
        return out

    def allreduce_seconds(self, nbytes: float, procs: int) -> float:
        return self.base.allreduce_seconds(nbytes, procs) * self.drift.communication

    def link_seconds(self, nbytes: float, procs: int) -> float:
        """On one node a reduction's hold on its "link" is the cores' own copying and summing,
        which moves as the run's communication probe did. Between nodes (a calibration that
        timed a network) it is the links' rate, which the machine's moves leave as it was
        (their CPU work is the network's transfer cost): scaled by that probe, whose Allreduce
        over an emulated 1 Gbit/s link read 1.2-1.6x in runs whose reductions took no longer,
        VGG11's COMM came out 45-270 % long, within 28 % unscaled (docs/model-accuracy-log.md,
        2026-11-29)."""
        seconds = self.base.link_seconds(nbytes, procs)
        return seconds if self.base.calibration.network is not None else seconds * self.drift.communication

    def allreduce_during_compute_seconds(self, nbytes: float, procs: int) -> float:
        """Where the node's ranks time-share its cores, a reduction that runs while other ranks
        compute costs the step its CPU time on the rank's share of the cores: the cores stay
        busy with the other ranks' work while it waits for them. Otherwise (or without CPU
        samples in the calibration) it costs its duration."""
        cpu = self.base.allreduce_cpu
        if cpu is None or procs <= 1 or not self.placement.oversubscribed:
            return self.allreduce_seconds(nbytes, procs)
        ranks_per_core = max(1.0, self.placement.ranks_per_node / self.placement.cores_per_node)
        return cpu.seconds(nbytes, procs) * ranks_per_core * self.drift.communication

    def sync_wait_seconds(self, segment: float, procs: int) -> float:
        """Where the job's ranks time-share the cores, the wait its network's calibration
        measured with the ranks sharing them (``NetworkTimings.straggler_waits``), where it
        has one. Otherwise the ranks' independent wandering, as the calibration fitted it
        less what its cores' imbalance explained, plus what a rank on a core of the mean
        speed waits for the slowest over ``segment`` where the cores stay apart in speed: by
        the run's probe, or without one by the calibration's, none where the ranks
        time-share the cores (the OS moves each over all of them)."""
        if procs <= 1:
            return 0.0
        network = self.base.calibration.network
        shared = network.straggler_wait if network is not None and self.placement.oversubscribed else None
        if shared is not None:
            return shared.seconds(segment, procs)
        state = self.base.calibration.machine_state
        then = state.imbalance if state is not None else 0.0
        now = self.drift.imbalance
        if now is None:
            now = 0.0 if self.placement.oversubscribed else then
        return self.base.calibration.sync_wait.seconds(segment, procs, then) + now * segment

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        return self.base.overhead_seconds(calls, network, batch, dataset) * self._scale(OUTSIDE_KERNELS)

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        return self.base.data_load_seconds(dataset, samples) * self._scale(DATA_LOAD)

    def background_seconds(self, seconds: float) -> float:
        return self.base.calibration.read_ahead_seconds(seconds, self.placement)

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float:
        return _cache_factor(self.base.calibration, self.placement, kernel, nbytes, moved, since_use)

    def bucket_share_left(self, nbytes: float, procs: int) -> float:
        """The calibration's, timed with a rank per core: where ranks time-share the cores a
        rank waiting in a blocking call gives its core to one that computes, and none of it is
        known (all of a bucket is left to its own calls)."""
        return 1.0 if self.placement.oversubscribed else self.base.bucket_share_left(nbytes, procs)

    @property
    def transfer_cost(self) -> TransferCost:
        """The network's transfer cost, its CPU time placed as the job's ranks are. It was
        measured under the network's own calibration run, not at the calibration's machine
        state (no drift since that state). The CPU per byte was measured over stretches of
        milliseconds that the ranks then sharing a core shared (unlike a kernel probe's
        short calls): it is scaled from that sharing to the job's. A 2 x 2 emulated cluster
        on 2 cores measured 2.5 ms of CPU per MiB, sharing included; scaled again as if
        unshared, VGG11's backward came out 38 % long (2026-11-26). A post is a call of a
        millisecond, timed as the median of rounds: as a kernel probe's calls, it holds no
        sharing, which the job's adds (there, one post in four or five lost the core
        mid-call for 4-8 ms: 1.4-1.6 ms on average for a median of 0.7); so does the test
        right after it. The pipeline's later
        starts are scaled as the CPU per byte, from the sharing they were measured in: on
        2 x 2 at 1 Gbit/s on 2 cores the calibration measured 2.3 ms of them a bucket, and
        hierarchical ResNet18's training spent 2.8 ms a bucket in its tests of over 0.3 ms
        (the test right after each post among them); charged as shared as a post, its COMM
        came out 35-52 % long (2026-11-29)."""
        cost = self.base.transfer_cost
        network = self.base.calibration.network
        calibrated = self.base.calibration.placement
        measured = network.time_sharing(calibrated.cores_per_node) if network is not None else 1.0
        share = kernel_scale(OUTSIDE_KERNELS, self.placement, calibrated)
        return replace(cost, cpu_per_byte=cost.cpu_per_byte * share / measured, post_seconds=cost.post_seconds * share,
                       post_test_seconds=cost.post_test_seconds * share,
                       start_seconds=cost.start_seconds * share / measured)


def _cache_factor(calibration: Calibration, placement: Placement, kernel: str, nbytes: float, moved: float,
                  since_use: float) -> float:
    """The calibration's cache-residency factor of a call whose data each of the node's ranks
    (as ``placement`` has them) moved ``moved`` bytes past, against the processor's
    last-level cache, ``since_use`` seconds before; 1 where the calibration timed no
    residency or names no cache."""
    residency, cache = calibration.cache_residency, Processor.of(calibration.machine).cache_bytes
    if residency is None or not cache:
        return 1.0
    return residency.factor(kernel, nbytes, moved * placement.ranks_per_node, cache, since_use)


OUTSIDE_KERNELS = "outside_kernels"  # the interpreter's time between kernels: scaled as a memory-bound kernel


def faster_strategy(machine: CalibratedMachine, network: Network, optimizer: Optimizer, batch: int,
                    placement: Placement, nodes: Sequence[int], bucket_mb: float = 4.0) -> str | None:
    """'hierarchical' where the model predicts a CPU job's step shorter with its buckets
    reduced in two levels (pipelined, beside backward) than flat, else 'mpi': ``batch``
    samples a rank, the ranks placed as ``placement`` and on ``nodes`` (each rank's node
    index). None where the calibration timed no network or timed other nodes than the
    job's: the two-level timings hold for the placement they were measured on."""
    timings = machine.calibration.network
    per_node = Counter(nodes)
    if (timings is None or machine.allreduce is None or len(per_node) != timings.nodes
            or set(per_node.values()) != {timings.ranks_per_node}):
        return None
    steps = {name: predict_step(network, optimizer, batch, len(nodes), adjusted_machine(reducing, placement),
                                bucket_mb).step_with_overlap
             for name, reducing in (("mpi", machine), ("hierarchical", machine.hierarchical(pipelined=True)))}
    return min(steps, key=steps.__getitem__)


def adjusted_machine(machine: CalibratedMachine, placement: Placement | None = None,
                     now: MachineState | None = None, probed: ProbedWork | None = None,
                     processor: Processor | None = None) -> AdjustedMachine:
    """``machine`` with its ranks placed as ``placement`` (default: as in the calibration) and
    corrected for the drift from the calibration's machine-state probe to ``now`` (none
    when either probe is missing), the work that ``probed`` (a run's kernel probe) timed
    by its own ratios where the calibration ran one single-thread rank per core, as the
    kernel probe does; ``processor`` is the run's (None: the calibration's), whose GEMMs move
    otherwise where it is another (:meth:`~pydtnn_lite.perfmodel.modelling.drift.Drift.scale`)."""
    calibration = machine.calibration
    drift = Drift()
    if now is not None and calibration.machine_state is not None:
        # Only measured times carry the probe's Allreduce across rank counts: a fit from
        # fewer ranks than cores knows nothing of ranks that share them (a calibration of 2
        # ranks read an 8-rank probe on 2 cores as communication 12x slower).
        timed = now.allreduce_ranks in calibration.allreduce_rank_counts
        model = machine.allreduce_seconds if machine.allreduce is not None and timed else None
        drift = drift_between(calibration.machine_state, now, model)
        other = processor is not None and processor.differs_from(Processor.of(calibration.machine))
        apart = (probed is not None and probed.meeting_ranks > 0 and bool(calibration.kernel_probes)
                 and not any(reference.meeting_ranks for reference in calibration.kernel_probes))
        drift = replace(drift, kernels=probed_ratios(calibration, probed),
                        probed_gemm=probed_gemm_ratio(calibration, probed), other_processor=other,
                        probes_apart=apart)
    return AdjustedMachine(machine, placement or calibration.placement, drift)


class KernelCall(Protocol):
    """A call of a step, predicted or measured: its kernel and its stage."""

    @property
    def kernel(self) -> str: ...

    @property
    def stage(self) -> str: ...


def calibration_warnings(machine: Machine, calls: Iterable[KernelCall], dtype: str = "float32") -> list[str]:
    """:meth:`AdjustedMachine.warnings` for the compute kernels of ``calls`` (a prediction's
    or a validation's) in ``dtype``; none for a machine that is not a placed calibration."""
    if not isinstance(machine, AdjustedMachine):
        return []
    return machine.warnings((call.kernel for call in calls if call.stage in COMPUTE_STAGES), dtype)


def _probe_comparable(calibration: Calibration, probed: ProbedWork) -> bool:
    """Whether a kernel probe's calls can be set against ``calibration``'s models: it has
    calls, and the calibration's kernels ran as the probe runs (one single-thread rank per
    core, on the host)."""
    placed = calibration.placement
    return (bool(probed.calls) and calibration.machine.get("device", "cpu") == "cpu"
            and placed.threads_per_rank == 1 and placed.ranks_per_node == placed.cores_per_node)


def _calibrated_seconds(calibration: Calibration, kernel: str, calls: Sequence[KernelSample]) -> list[float]:
    """What the calibration predicts for each of ``calls``, measured calls of ``kernel``."""
    return calibration.kernel_seconds_of(kernel, [KernelCost(Stage.FP, kernel, call.flops, call.bytes, call.dims)
                                                  for call in calls])


def _model_noise(calibration: Calibration, kernel: str, calls: int) -> float:
    """The noise of a ratio of ``calls`` calls' total time to the predictions of the
    calibration's model of ``kernel``: its held-out time error over the square root of the
    calls (0 without a model)."""
    model = calibration.kernel_models.get(kernel)
    error = model.held_out_time_error if model is not None else math.nan
    return error / math.sqrt(calls) if math.isfinite(error) else 0.0


def _updates_against_the_models(calibration: Calibration, probed: ProbedWork) -> dict[str, float]:
    """The updates and the other passes over the whole gradient (:data:`STREAMING`) that a
    probe whose ranks met timed, each against the calibration's model of it, beyond the
    model's held-out error over the square root of the calls. Those ranks update together
    after an eviction, as a job's ranks and the calibration's samples of the updates do,
    where the calibration's own probes may straddle two states of a memory system whose
    samples sit in one: the Zen 4 EPYC's four probes of 2026-12-07 timed their 2M-weight
    update at 0.84-1.40 ms, its samples of 2.0-2.4M weights 0.82-1.09 ms, and set against
    the probes the runs' updates of that evening, 1.6x the samples', moved 1.0-1.3x (the
    WU stage's WRE a median 27.9 %; 13.6 % against the models)."""
    calls = {kernel: samples for kernel, samples in probed.calls.items()
             if kernel in STREAMING and kernel in calibration.kernel_models}
    return _ratios_against_the_models(calibration, calls, left_out=COMPUTE_BOUND)


def _ratios_against_the_models(calibration: Calibration, calls: Mapping[str, Sequence[KernelSample]],
                               left_out: frozenset[str] = COMPUTE_BOUND | STREAMING) -> dict[str, float]:
    """:func:`~pydtnn_lite.perfmodel.modelling.drift.kernel_ratios` of ``calls`` against what
    the calibration's models predict for them, each kernel's noise its model's held-out
    error over the square root of the calls."""
    before = {kernel: _calibrated_seconds(calibration, kernel, samples) for kernel, samples in calls.items()}
    noise = {kernel: _model_noise(calibration, kernel, len(samples)) for kernel, samples in calls.items()}
    return kernel_ratios(calls, before, noise, left_out)


def _modelled_ratios(calibration: Calibration, probed: ProbedWork) -> dict[str, float]:
    """The kernel probe's kernels and time outside them against what the calibration's models
    predict for the same work (:func:`~pydtnn_lite.perfmodel.modelling.drift.kernel_ratios`),
    each kernel's noise its model's held-out error over the square root of the calls. A
    fused kernel the calibration never sampled is predicted from the unfused calls it
    replaces, which a probed call's cost does not name, and is left out."""
    calls = {kernel: samples for kernel, samples in probed.calls.items()
             if kernel not in PREDICTED_FROM or kernel in calibration.kernel_models}
    ratios = _ratios_against_the_models(calibration, calls)
    outside = work_ratio([(seconds, calibration.overhead.seconds(count)) for count, seconds in probed.outside])
    return ratios if outside is None else {**ratios, OUTSIDE_KERNELS: outside}


def probes_run_alike(calibration: Calibration, probed: ProbedWork) -> list[ProbedWork]:
    """The calibration's own runs of the kernel probe whose ranks ran as ``probed``'s did,
    meeting as a job's ranks meet or apart (:attr:`ProbedWork.meeting_ranks`); all of
    them where none did. Ranks that meet run a memory-bound kernel together, and when
    the machine's memory slows for two ranks at once they take its time, where ranks
    apart may each have it alone."""
    alike = [reference for reference in calibration.kernel_probes
             if bool(reference.meeting_ranks) == bool(probed.meeting_ranks)]
    return alike or list(calibration.kernel_probes)


def _kinds_of_work(probed: ProbedWork) -> dict[str, Pieces]:
    """A probe's work to set like for like, by kind, each piece named by what it was: each
    kernel's calls but GEMM's (left to :func:`probed_gemm_ratio`), and
    the steps' time outside the kernels, named by their calls. The updates count: like for
    like, the probe's 2M-parameter updates stream from memory as a model's do (against the
    models they do not, :func:`kernel_ratios`); with them, the WU stage's WRE of six runs
    on 2026-11-26 fell from 8.7-37.3 % to 3.5-25.7 %, LeNet's and MLP's the most."""
    work: dict[str, Pieces] = {kernel: _pieces(calls) for kernel, calls in probed.calls.items()
                               if kernel not in COMPUTE_BOUND}
    work[OUTSIDE_KERNELS] = list(probed.outside)
    return work


def _pieces(calls: Sequence[KernelSample]) -> Pieces:
    """A kernel's calls as pieces of work, each named by its sizes."""
    return [(call.dims, call.seconds) for call in calls]


def probed_gemm_ratio(calibration: Calibration, probed: ProbedWork | None) -> float | None:
    """How the kernel probe's products moved against ``calibration``, the ratio for a
    GEMM's time (on another processor, for its part off the peak): their total time now over then
    (:func:`~pydtnn_lite.perfmodel.modelling.drift.work_ratio`), against the median of the
    calibration's own runs of the probe where they timed the same products
    (:func:`~pydtnn_lite.perfmodel.modelling.drift.like_for_like`), beyond that ratio's
    noise; otherwise against its GEMM model's predictions, beyond the model's held-out
    error. None where it timed no GEMM, or the two ran otherwise (:func:`probed_ratios`).

    The copy rates that stand in otherwise can stay still while skinny products move: on
    2026-11-26 this machine's copy probe ran 1.2x slower than at the calibration while the
    kernel probe's products ran 1.3x slower, and LeNet's, far off the peak, 1.4x. The
    probe's products moved alike at and off the peak (32 runs that day: the two parts'
    ratios within 3 % of each other), where the every-core probe's GEMM often moved less;
    splitting the probe's move at the peak, with the peak's part moving as the every-core
    probe's, put the gap between the two probes on the rest, which is a small share of
    the probe's time, and so multiplied their noise (LeNet's correction overshot by a
    third). On 2026-12-06 the every-core probe's GEMM read this machine 8-27 % faster than
    the kernel probe's products in every run of the day, and the products at the peak
    (VGG11's on 4 and 8 ranks) ran as the kernel probe's did: moved with them whole, the
    4- and 8-rank steps came within 10 % where they had been 9-17 % short
    (docs/model-accuracy-log.md)."""
    if probed is None or not _probe_comparable(calibration, probed) or not probed.calls.get(GEMM):
        return None
    calls = probed.calls[GEMM]
    own = like_for_like(_pieces(calls), [_pieces(reference.calls.get(GEMM, []))
                                         for reference in probes_run_alike(calibration, probed)], probed.runs)
    before, noise = own if own is not None else (_calibrated_seconds(calibration, GEMM, calls),
                                                 _model_noise(calibration, GEMM, len(calls)))
    return work_ratio([(call.seconds, then) for call, then in zip(calls, before, strict=True)], noise)


def probed_ratios(calibration: Calibration, probed: ProbedWork | None) -> dict[str, float]:
    """The kernel probe's ratios against ``calibration``, for each kernel but GEMM (and,
    against the models, the updates), the time outside the kernels (:data:`OUTSIDE_KERNELS`) and loading data
    (``DATA_LOAD``); none where the calibration's kernels ran otherwise placed than the
    probe's, or on a GPU.

    Where the calibration ran the probe itself, like for like
    (:func:`~pydtnn_lite.perfmodel.modelling.drift.probe_moves`): a probe network's
    kernels run in the context of its own few layers, at a speed the models, fitted over
    the whole grid, need not give them (on 2026-11-26 the calibration's own probes ran its
    bias additions at 1.72x the models' time, batch norm's input gradient at 1.85x, its
    ReLUs at 1.13x). Otherwise against the models' predictions (:func:`_modelled_ratios`).
    A kernel whose code changed since some of a merged calibration's files were measured
    lost its calls in those files' probes: it moves as the probes of the files that timed
    it say (the others set the kinds they all timed). Loading data is set against the
    calibration's model of it, and so are the updates where the probe's ranks met
    (:func:`_updates_against_the_models`)."""
    if probed is None or not _probe_comparable(calibration, probed):
        return {}
    now = _kinds_of_work(probed)
    references = [_kinds_of_work(reference) for reference in probes_run_alike(calibration, probed)]
    complete = [reference for reference in references if now.keys() <= reference.keys()]
    ratios = {**(probe_moves(now, complete, probed.runs) if len(complete) < len(references) else {}),
              **probe_moves(now, references, probed.runs)} or _modelled_ratios(calibration, probed)
    if probed.meeting_ranks:
        ratios.update(_updates_against_the_models(calibration, probed))
    loading = work_ratio([(seconds, calibration.data_load_seconds(name, int(samples)))
                          for name, samples_seconds in probed.data.items() for samples, seconds in samples_seconds])
    return ratios if loading is None else {**ratios, DATA_LOAD: loading}


ALLREDUCE_MODELS = ("interpolate", "fit")


def allreduce_models(samples: Sequence[tuple[int, float, float]],
                     algorithm: str | None = None) -> dict[str, AllreduceTime]:
    """Each of :data:`ALLREDUCE_MODELS` for ``(procs, nbytes, seconds)`` samples: the fit
    (``algorithm``, or the best), and the samples interpolated with that fit beyond them."""
    fit = fit_allreduce(samples, algorithm)
    return {"interpolate": InterpolatedAllreduce.from_samples(samples, fit), "fit": fit}


def calibrated_machine(path: str, algorithm: str | None = None, allreduce: str = "interpolate") -> CalibratedMachine:
    """The machine of calibration file ``path``.

    Its Allreduce model is fitted to the file's samples (``algorithm``, or the best fit).
    With ``allreduce="interpolate"`` the samples themselves are interpolated and the fit
    serves only where they do not reach; with ``"fit"`` the fit serves every message.
    """
    try:
        calibration = Calibration.load(path)
    except OSError as error:
        raise UserError(f"{error.strerror or error}: give a file written by python -m pydtnn_lite.calibrate") from None
    except ValueError as error:
        raise UserError(str(error)) from None
    if calibration.kernel_samples and not calibration.kernel_models:
        raise UserError(f"{path} holds kernel samples but no fitted models (calibrate --fit-later wrote it): fit "
                        f"them with python -m pydtnn_lite.calibrate --refit {path}")
    if allreduce not in ALLREDUCE_MODELS:
        raise UserError(f"unknown Allreduce model {allreduce!r}: choose one of {', '.join(ALLREDUCE_MODELS)}")
    samples, cpu_samples = calibration.allreduce_samples, calibration.allreduce_cpu_samples
    network = calibration.network
    # Between nodes the network moves the data while backward computes: overlap hides it.
    return CalibratedMachine(calibration, allreduce_models(samples, algorithm)[allreduce] if samples else None,
                             overlaps_communication=network is not None,
                             allreduce_cpu=allreduce_models(cpu_samples, algorithm)[allreduce] if cpu_samples else None,
                             inter_node=TwoLevelAllreduce.from_timings(network).inter
                             if network is not None and network.ranks_per_node > 1 else None)


def cluster_machine(cluster: Cluster, algorithm: str = "ring", itemsize: int = 4) -> RooflineMachine:
    """Roofline kernels and an alpha-beta-gamma Allreduce for ``cluster``.

    gamma is the time to reduce one byte at the peak rate: one FLOP per ``itemsize`` bytes.
    """
    link = Link(cluster.latency, 1.0 / cluster.link_bandwidth, 1.0 / (itemsize * cluster.peak_flops))
    return RooflineMachine(Roofline(cluster.peak_flops, cluster.memory_bandwidth),
                           AllreduceModel(algorithm, (link,)))


def described_cluster(preset: str | None, peak_flops: float | None = None,
                      memory_bandwidth: float | None = None, link_bandwidth: float | None = None,
                      latency: float | None = None, nodes: int | None = None) -> Cluster:
    """A preset (default: ampere) with any of its figures replaced."""
    name = preset or "ampere"
    if name not in PRESETS:
        raise UserError(f"unknown cluster preset {name!r}: choose one of {', '.join(PRESETS)}")
    base = PRESETS[name]
    values = {"peak_flops": peak_flops, "memory_bandwidth": memory_bandwidth, "link_bandwidth": link_bandwidth,
              "latency": latency, "nodes": nodes}
    for flag, value in values.items():
        if value is not None and value <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    changed = {key: value for key, value in values.items() if value is not None}
    return Cluster(**{**base.__dict__, **changed, "name": name if not changed else f"{name} (modified)"})
