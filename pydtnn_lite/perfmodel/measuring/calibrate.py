"""Calibration: measure this machine's kernels and Allreduce and fit the kernel models.

:func:`calibrate` runs the probe grid (``probes.py``) under the tracer on every rank at
once, each rank with its share of the cores, as the ranks of a data-parallel training
step run; the per-call medians of all ranks are combined (median over ranks), and the
kernel models are fitted, the kernels shared out over the ranks. It also measures the
GEMM peak and the memory bandwidth on every rank at once, and times Allreduce over the
ranks, here and (in child jobs) at every process count up to four per core. It fits the
time a step spends outside its kernels, and takes the machine-state probe a later run
compares itself with. The result is a
:class:`~pydtnn_lite.perfmodel.modelling.calibration.Calibration`.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pydtnn_lite.backend import Backend, make_backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.nodes import node_name
from pydtnn_lite.costs import GEMM, KERNEL_REVISIONS
from pydtnn_lite.perfmodel.measuring.allreduce_timing import FULL_SIZES, allreduce_samples
from pydtnn_lite.perfmodel.measuring.bucket_progress import measure_bucket_progress
from pydtnn_lite.perfmodel.measuring.cache_residency import SIZES as RESIDENCY_SIZES
from pydtnn_lite.perfmodel.measuring.cache_residency import measure_cache_residency
from pydtnn_lite.perfmodel.measuring.data_loading import (
    READ_AHEAD_DATASET,
    READ_AHEAD_ROUNDS,
    READ_AHEAD_SAMPLES,
    READ_AHEAD_STEPS,
    read_ahead_share,
    time_data_loading,
    time_read_ahead,
)
from pydtnn_lite.perfmodel.measuring.gradient_passes import LENGTHS as GRADIENT_LENGTHS
from pydtnn_lite.perfmodel.measuring.gradient_passes import gradient_pass_samples
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor, describe_machine, gemm_peak, memory_bandwidth
from pydtnn_lite.perfmodel.measuring.kernel_probe import probe_kernels
from pydtnn_lite.perfmodel.measuring.machine_state import (
    WATCH_REPEATS,
    allreduce_probe,
    probe_cores,
)
from pydtnn_lite.perfmodel.measuring.network_timing import network_timings
from pydtnn_lite.perfmodel.measuring.probes import FULL, GridSize, Probe, calibration_grid, job_probes
from pydtnn_lite.perfmodel.measuring.process_counts import samples_beyond
from pydtnn_lite.perfmodel.measuring.sampling import (
    RANKS_MEET,
    SETTLE_SECONDS,
    measure_probe,
    median_over_ranks,
    rounded,
)
from pydtnn_lite.perfmodel.measuring.thread_scaling import measure_gemm_shapes, measure_thread_scaling
from pydtnn_lite.perfmodel.modelling.bucket_progress import BucketProgress
from pydtnn_lite.perfmodel.modelling.cache_residency import CacheResidency
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.drift import MachineState, mean_allreduce
from pydtnn_lite.perfmodel.modelling.network import NetworkTimings
from pydtnn_lite.perfmodel.modelling.outside_kernels import fit_affine
from pydtnn_lite.perfmodel.modelling.regression import (
    KernelModel,
    KernelSample,
    MLPEnsemble,
    fit_kernel_models,
    model_from_dict,
)
from pydtnn_lite.perfmodel.modelling.synchronization import fit_sync_wait
from pydtnn_lite.runtime import usable_cores

STATE_EVERY = 8  # probe networks between two probes of the cores: one every two seconds or so


def mpi_of(comm: Communicator) -> MPICommunicator:
    """``comm`` as the MPI communicator of an mpiexec job, which timing Allreduce needs."""
    if not isinstance(comm, MPICommunicator):
        raise TypeError(f"timing Allreduce needs an MPI communicator, got {type(comm).__name__}")
    return comm


def best_rates(samples: list[KernelSample]) -> dict[str, float]:
    """The highest FLOP/s and bytes/s of a kernel's samples (0 where it counts none)."""
    flops = max((s.flops / s.seconds for s in samples if s.seconds > 0), default=0.0)
    nbytes = max((s.bytes / s.seconds for s in samples if s.seconds > 0), default=0.0)
    return {"flops_per_second": flops, "bytes_per_second": nbytes}


def fit_models(samples: dict[str, list[KernelSample]], comm: Communicator, seed: int = 0,
               workers: int = 1) -> dict[str, KernelModel]:
    """Fit every kernel's model, the kernels shared out over the ranks, each rank's MLPs
    trained by ``workers`` processes (its share of the cores); every rank gets all models.
    Collective."""
    names = sorted(samples)
    mine_fitted = fit_kernel_models({name: samples[name] for name in names[comm.rank::comm.size]}, seed, workers)
    mine = {name: model.to_dict() for name, model in mine_fitted.items()}
    fitted = {name: model for part in comm.allgather_object(mine) for name, model in part.items()}
    return {name: model_from_dict(fitted[name]) for name in names}


def _mean_waits(per_rank: list[list[list[list[tuple[float, float]]]]]) -> list[tuple[float, float]]:
    """One (work, wait) sample per meeting of the ranks in a probe's step (each batch-norm
    reduction, then the end of the step), the mean over its steps and the ranks, the wait
    beyond the last rank's own: that rank waited for no one, its time at the barrier is the
    meeting's latency, which a job's reductions pay in their own time (every rank traced the
    same steps of the same probes)."""
    samples = []
    for probe in zip(*per_rank, strict=True):  # one probe: each rank's steps
        if not all(probe):
            continue
        # by_step[s][m]: each rank's (work, wait) at the m-th meeting of step s
        by_step = [list(zip(*step, strict=True)) for step in zip(*probe, strict=True)]
        for meeting in zip(*by_step, strict=True):  # the m-th meeting of every step
            works = [work for ranks in meeting for work, _ in ranks]
            waits = [wait - min(w for _, w in ranks) for ranks in meeting for _, wait in ranks]
            samples.append((rounded(float(np.mean(works))), rounded(float(np.mean(waits)))))
    return samples


@dataclass(frozen=True)
class CalibrationSettings:
    """What :func:`calibrate` measures: the grid, the steps per probe, the Allreduce sizes."""

    batch_sizes: tuple = (8, 16, 32, 64)
    repeats: int = 3  # traced steps per probe at least
    min_seconds: float = 0.1  # ... and at least this long (small probes: more steps)
    grid: GridSize = FULL
    allreduce_sizes: tuple = FULL_SIZES
    residency_sizes: tuple = RESIDENCY_SIZES  # gradient sizes of the Allreduce and updates timed in and out of cache
    roof_repeats: int = 3
    seed: int = 0
    beyond_job: bool = False  # also time Allreduce at the process counts above the job's, in child jobs
    jobs: tuple = ()  # (zoo model, batch per rank, generated data set): networks sampled whole, besides the grid
    read_ahead_rounds: int = READ_AHEAD_ROUNDS  # rounds of training the probe model reading in the step and ahead
    read_ahead_steps: int = READ_AHEAD_STEPS  # ... of this many steps each way
    kernel_probes: int = 4  # runs of the kernel probe along the kernel phase, the first as it starts, the last after
    job_rounds: int = 3  # rounds of the ``jobs``' networks, spread along the kernel phase (see :func:`in_rounds`)
    fit: bool = True  # fit the kernel models here; else write the samples for ``calibrate --refit`` elsewhere
    gradient_lengths: tuple = GRADIENT_LENGTHS  # elements of the gradients the passes over a whole one are timed on


def calibrate(backend: Backend, comm: Communicator, settings: CalibrationSettings, blas_threads: int,
              log: Callable[[str], None] = lambda line: None) -> Calibration | None:
    """Measure and fit on every rank of ``comm`` (collective; an MPICommunicator when there
    are several ranks); rank 0 gets the Calibration, the other ranks None. ``log`` is
    called with a line after each phase."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    timings: dict[str, float] = {}

    def phase_done(name: str, detail: str) -> None:
        timings[name] = max(0.0, round(time.perf_counter() - started - sum(timings.values()), 2))
        log(f"{name}: {detail} ({timings[name]:.1f} s)")

    comm.barrier()
    # The machine's typical state over the calibration: its cores change speed for seconds at a
    # time, so they are probed all along the kernel phase, whose samples are medians as the state is.
    instants = [probe_cores(comm), probe_cores(comm)]
    peak = float(np.median(comm.allgather_object(gemm_peak(backend, repeats=settings.roof_repeats))))
    bandwidth = float(np.median(comm.allgather_object(memory_bandwidth(backend, repeats=settings.roof_repeats))))
    phase_done("roofs", f"GEMM peak {peak / 1e9:.1f} GFLOP/s, memory bandwidth {bandwidth / 1e9:.1f} GB/s per rank")
    scaling = measure_thread_scaling(comm, blas_threads) if backend.device == "cpu" else None
    phase_done("threads", f"one rank on {scaling.threads} threads: GEMM x{scaling.gemm:.2f}, memory-bound loops "
                          f"x{scaling.memory:.2f} the time of one-thread ranks, a parallel loop's hand-off "
                          f"{1e3 * (scaling.handoff or 0.0):.3f} ms" if scaling else
               "skipped: the ranks do not run one per core on one thread each")

    jobs = job_probes(settings.jobs)
    grid = in_rounds(calibration_grid(settings.batch_sizes, settings.grid, settings.seed), jobs, settings.job_rounds)
    evict = CacheEvictor(backend)
    mine: dict[str, list[KernelSample]] = {}
    my_cold_starts: dict[str, list[KernelSample]] = {}
    my_waits: list[list[list[tuple[float, float]]]] = []
    my_overheads: list[tuple[float, float]] = []
    my_job_seconds: dict[Probe, list[float]] = {job: [] for job in jobs}  # each round's kernel time a step
    # A run's kernel probe is set against the calibration's own runs of it, spread over the
    # phase as the machine-state instants are.
    probe_at = {index * len(grid) // (settings.kernel_probes - 1) for index in range(settings.kernel_probes - 1)}
    on_host = backend.device == "cpu"
    kernel_probes = []
    for index, probe in enumerate(grid):
        if index % STATE_EVERY == STATE_EVERY - 1:
            instants.append(probe_cores(comm, WATCH_REPEATS))
        if index in probe_at:
            kernel_probes.append(probe_kernels(comm, on_host=on_host))
        comm.barrier()  # the ranks run each probe together, as they run a training step
        measured = measure_probe(probe, backend, comm, settings.repeats, evict, settings.min_seconds, settings.seed,
                                 eviction_seconds=evict.seconds)
        for name, probe_samples in measured.samples.items():
            mine.setdefault(name, []).extend(probe_samples)
        for name, probe_samples in measured.cold_starts.items():
            my_cold_starts.setdefault(name, []).extend(probe_samples)
        my_waits.append(measured.waits)
        my_overheads.append(measured.overhead)
        if probe in my_job_seconds:
            my_job_seconds[probe].append(sum(measured.kernel_seconds().values()))
    if settings.kernel_probes > 0:
        kernel_probes.append(probe_kernels(comm, on_host=on_host))
    instants.append(probe_cores(comm))
    samples = median_over_ranks(comm.allgather_object(mine))
    cold_starts = median_over_ranks(comm.allgather_object(my_cold_starts))
    sync_samples = _mean_waits(comm.allgather_object(my_waits))
    sync_wait = fit_sync_wait(sync_samples, comm.size)
    overheads = [(calls[0][0], rounded(float(np.median([seconds for _, seconds in calls]))))
                 for calls in zip(*comm.allgather_object(my_overheads), strict=True)]
    overhead_samples = _jobs_last(grid, jobs, overheads)
    phase_done("kernels", f"{len(grid)} probe networks, {sum(map(len, samples.values()))} samples of "
                          f"{len(samples)} kernels")
    if settings.job_rounds > 1 and jobs:
        log(_rounds_apart(jobs, comm.allgather_object(my_job_seconds), settings.job_rounds))
    passes = gradient_pass_samples(comm, backend, evict, settings.gradient_lengths)
    samples.update(passes)
    phase_done("gradient passes", f"{', '.join(passes)} on {len(settings.gradient_lengths)} gradient lengths")
    if scaling is not None:
        shapes = measure_gemm_shapes(comm, [s.dims for s in samples.get(GEMM, [])], scaling.threads, blas_threads)
        scaling = dataclasses.replace(scaling, gemm_shapes=shapes)
        phase_done("GEMM shapes", f"{len(shapes)} shapes on {scaling.threads} threads: x{min(shapes.values()):.2f} "
                                  f"to x{max(shapes.values()):.2f} the time of one-thread ranks" if shapes else "none")
    data_load_samples = time_data_loading(comm)
    read_ahead_samples = time_read_ahead(comm, fit_affine(data_load_samples[READ_AHEAD_DATASET]).seconds(
        READ_AHEAD_SAMPLES), settings.read_ahead_steps, settings.read_ahead_rounds)
    read_ahead = read_ahead_share(read_ahead_samples)
    phase_done("data", f"loading {', '.join(data_load_samples)}; a step reading ahead pays {100 * read_ahead:.0f} % "
                       "of the reading")

    # Before the Allreduce samples: the child jobs that time the counts beyond the job's leave
    # the machine busy for seconds after they end.
    residency = (measure_cache_residency(mpi_of(comm), evict, settings.residency_sizes)
                 if comm.size > 1 and on_host else None)
    phase_done("cache", _residency(residency))
    progress = one_node_bucket_progress(mpi_of(comm), evict) if comm.size > 1 and on_host else None
    phase_done("bucket progress", _progress(progress))
    reductions, allreduce = bracketed_allreduce_samples(comm, settings.allreduce_sizes)
    state = MachineState.over(instants, allreduce, typical=True)
    reduction_cpu: list[tuple[int, int, float]] = []
    if settings.beyond_job:
        beyond, reduction_cpu = samples_beyond(comm, usable_cores())
        reductions += beyond
    network = (network_timings(mpi_of(comm), node_name(), settings.allreduce_sizes, reductions)
               if comm.size > 1 else None)
    counts = sorted({ranks for ranks, _, _ in reductions})
    phase_done("allreduce", f"{len(reductions)} samples on {', '.join(map(str, counts))} ranks{_levels(network)}"
               if reductions else "skipped: one rank (run under mpiexec, or without --no-oversubscribed)")

    models = fit_models(samples, comm, settings.seed, blas_threads) if settings.fit else {}
    ensembles = sum(isinstance(m, MLPEnsemble) for m in models.values())
    phase_done("fit", f"{ensembles} MLP ensembles, {len(models) - ensembles} closed-form models" if settings.fit else
               "left for calibrate --refit")
    if comm.rank != 0:
        return None
    grid_settings = {"points": dict(settings.grid.points), "max_step_flops": settings.grid.max_step_flops,
                     "max_activations": settings.grid.max_activations,
                     "long_products": settings.grid.long_products, "probes": len(grid)}
    recorded = {"batch_sizes": list(settings.batch_sizes), "repeats": settings.repeats,
                "min_seconds": settings.min_seconds, "grid": grid_settings,
                "allreduce_sizes": list(settings.allreduce_sizes), "gradient_lengths": list(settings.gradient_lengths),
                "seed": settings.seed,
                "jobs": [f"{model}:{batch}:{dataset}" for model, batch, dataset in settings.jobs],
                "job_rounds": settings.job_rounds, "ranks_meet": RANKS_MEET, "sampled_after_seconds": SETTLE_SECONDS,
                "seconds": dict(timings, total=round(time.perf_counter() - started, 2)),
                # Other jobs slow the kernels down: the 1-minute load average, this job's ranks included.
                "load_average": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}}
    machine = dict(describe_machine(backend, blas_threads, comm.size), ranks_per_node=comm.local_size)
    return Calibration(machine, peak, bandwidth, models, reductions,
                       allreduce_cpu_samples=[(p, float(n), t) for p, n, t in reduction_cpu],
                       allreduce_ranks=comm.size, kernel_samples=samples,
                       kernel_rates={name: best_rates(s) for name, s in sorted(samples.items())},
                       settings=recorded, sync_samples=sync_samples, sync_wait=sync_wait,
                       overhead_samples=overhead_samples, overhead=fit_affine(overhead_samples),
                       data_load_samples=data_load_samples,
                       data_load={name: fit_affine(rows) for name, rows in data_load_samples.items()},
                       read_ahead_samples=read_ahead_samples, read_ahead_share=read_ahead,
                       machine_state=state, network=network, cold_start_samples=cold_starts,
                       kernel_probes=[work for work in kernel_probes if work.calls], thread_scaling=scaling,
                       kernel_revisions=dict(KERNEL_REVISIONS), cache_residency=residency,
                       bucket_progress=progress)


def in_rounds(grid: Sequence[Probe], jobs: Sequence[Probe], rounds: int) -> list[Probe]:
    """``grid`` with ``rounds`` runs of every job in it, one after each of ``rounds`` equal
    parts of the grid (the last at its end). A job's calls are predicted from the median
    of their samples, and one round of a job is a draw of one minute from a machine that
    moves: VGG11 b32's kernels took 195-330 ms a step from one round of 10 s to the next
    on the 2-core Xeon of 2026-11-28 (``benchmarks/probe_tracking.py``)."""
    out: list[Probe] = []
    for part in range(rounds):
        out += grid[part * len(grid) // rounds:(part + 1) * len(grid) // rounds]
        out += jobs
    return out


def _jobs_last(probes: Sequence[Probe], jobs: Sequence[Probe],
               overheads: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (calls, seconds outside the kernels) of each of ``probes``, the grid's in order
    and then one for each of ``jobs``, the median of its rounds: a calibration file keeps
    its jobs' last, in the order of its ``jobs`` setting (``Calibration.overhead_seconds``)."""
    grid = [overhead for probe, overhead in zip(probes, overheads, strict=True) if probe.family != "model"]
    rounds = [[overhead for probe, overhead in zip(probes, overheads, strict=True) if probe == job] for job in jobs]
    return grid + [(runs[0][0], float(np.median([seconds for _, seconds in runs]))) for runs in rounds]


def _rounds_apart(jobs: Sequence[Probe], per_rank: list[dict[Probe, list[float]]], rounds: int) -> str:
    """A line on how far each job's rounds fell apart: its slowest round's kernel time a
    step (the ranks' mean) over its fastest."""
    apart = []
    for job in jobs:
        seconds = np.mean([rank[job] for rank in per_rank], axis=0)
        model, dataset = job.shape
        apart.append(f"{model}:{job.batch}" + ("" if dataset == "synthetic" else f":{dataset}") +
                     f" x{seconds.max() / seconds.min():.2f}")
    return (f"networks sampled whole, in {rounds} rounds along the kernel phase (their slowest round's kernels "
            f"over the fastest's; each call takes the median of its rounds): {', '.join(apart)}")


def _residency(residency: CacheResidency | None) -> str:
    if residency is None:
        return "skipped: one rank, or not on the host"
    longest = residency.idle_seconds[-1] if residency.idle_seconds else None

    def span(kernel: str, since_use: float) -> str:
        ratios = [residency.ratio(kernel, n, since_use) for n in residency.sizes]
        return f"x{min(ratios):.2f} to x{max(ratios):.2f}"

    def described(kernel: str) -> str:
        resident = f"{kernel} {span(kernel, 0.0)}"
        return resident if longest is None else f"{resident} ({span(kernel, longest)})"

    waited = "" if longest is None else f"; in brackets, {1e3 * longest:g} ms after the data's last use"
    return (f"resident over evicted at {residency.sizes[0] / 2 ** 20:g} to {residency.sizes[-1] / 2 ** 20:g} MiB: "
            + ", ".join(described(kernel) for kernel in residency.resident) + waited)


def _progress(progress: BucketProgress | None) -> str:
    if progress is None:
        return "skipped: one rank, several nodes, or not on the host"
    return f"a bucket's own calls with blocking reductions after it, over its blocking Allreduce: {progress.summary()}"


def one_node_bucket_progress(comm: MPICommunicator, evict: CacheEvictor) -> BucketProgress | None:
    """:func:`measure_bucket_progress` where the job's ranks share one node, else None: on
    several nodes the links move the buckets (``Calibration.network``). Collective."""
    one_node = len(set(comm.allgather_object(node_name()))) == 1
    return measure_bucket_progress(comm, evict) if one_node else None


def _levels(network: NetworkTimings | None) -> str:
    if network is None:
        return ""
    intra = " and inside each node" if network.intra_node else ""
    return f", between {network.nodes} nodes{intra}"



def check_allreduce_ranks(ranks: int) -> None:
    """ValueError unless a job of ``ranks`` ranks may time Allreduce into a calibration: two
    or more. Its kernels keep the placement they were measured in, whatever the job's: the
    reference calibration's kernels (a rank per core) with the network of an emulated
    2 x 2 cluster of the same 2 cores predict its steps, where a calibration run whole on
    that cluster times its kernels time-shared."""
    if ranks < 2:
        raise ValueError(f"Allreduce needs two ranks or more (this job has {ranks}): run under mpiexec -n 2 or more")


def bracketed_allreduce_samples(comm: Communicator, sizes: Sequence[int]
                                ) -> tuple[list[tuple[int, float, float]], list[tuple[int, int, float, float]]]:
    """The Allreduce samples of ``sizes`` (:func:`allreduce_samples`), and the machine-state
    probe's Allreduce just before and just after them (collective). A run's probe is set
    against these, the state in which the samples it corrects were timed: one probe at the
    calibration's start, minutes before them, was 0.74 to 1.24 times the samples' own
    figure at its size over eight calibrations here, and a run on other ranks than the
    calibration's carried that ratio into its drift correction. One rank has neither."""
    if comm.size == 1:
        return [], []
    before = allreduce_probe(comm)
    samples = allreduce_samples(mpi_of(comm), sizes)
    return samples, [before, allreduce_probe(comm)]


def remeasure_allreduce(calibration: Calibration, comm: Communicator, sizes: tuple = FULL_SIZES,
                        beyond_job: bool = True, residency_sizes: tuple = RESIDENCY_SIZES) -> Calibration:
    """Time Allreduce of ``sizes`` again into ``calibration`` (collective; the kernel models
    and samples are kept), and with ``beyond_job`` at the process counts above the job's
    too: the file's Allreduce samples are then this job's (:func:`check_allreduce_ranks`).
    The cache residency is timed again too, at ``residency_sizes``, and where the ranks
    share a node the bucket progress."""
    check_allreduce_ranks(comm.size)
    started, load_before = time.perf_counter(), os.getloadavg()
    evict = CacheEvictor(make_backend("cpu"))
    calibration.cache_residency = measure_cache_residency(mpi_of(comm), evict, residency_sizes)
    calibration.bucket_progress = one_node_bucket_progress(mpi_of(comm), evict)
    samples, probes = bracketed_allreduce_samples(comm, sizes)
    beyond, cpu_samples = samples_beyond(comm, usable_cores()) if beyond_job else ([], [])
    samples += beyond
    calibration.allreduce_samples = [(p, float(n), t) for p, n, t in samples]
    calibration.allreduce_cpu_samples = [(p, float(n), t) for p, n, t in cpu_samples]
    calibration.network = network_timings(mpi_of(comm), node_name(), sizes, samples)
    if calibration.machine_state is not None:
        # A later run's Allreduce drifts from the one timed now (over another network, perhaps),
        # its kernels from those of the probe taken with them.
        ranks, nbytes, seconds, spread = mean_allreduce(probes)
        calibration.machine_state = dataclasses.replace(
            calibration.machine_state, allreduce_ranks=ranks, allreduce_bytes=nbytes,
            allreduce_seconds=seconds, allreduce_spread=spread)
    calibration.settings["allreduce_sizes"] = list(sizes)
    calibration.settings["allreduce_remeasured"] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 2),
        "load_average": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}}
    return calibration
