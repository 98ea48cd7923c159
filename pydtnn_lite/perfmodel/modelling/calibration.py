"""The calibration record: what the performance model knows about one machine, and its file.

:class:`Calibration` holds the kernel models, the roofs, the raw Allreduce samples and
the wait model that ``python -m pydtnn_lite.calibrate`` measured, and reads and writes
the calibration file (JSON, described in docs/performance-model.md). Reading a file
checks its format and version.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pydtnn_lite.costs import ALLREDUCE, KERNEL_REVISIONS, PREDICTED_FROM, TRANSFER_CPU, KernelCost, Stage
from pydtnn_lite.perfmodel.modelling.bucket_progress import BucketProgress
from pydtnn_lite.perfmodel.modelling.cache_residency import CacheResidency
from pydtnn_lite.perfmodel.modelling.drift import COMPUTE_BOUND, STREAMING, MachineState, ProbedWork
from pydtnn_lite.perfmodel.modelling.network import NetworkTimings
from pydtnn_lite.perfmodel.modelling.outside_kernels import NO_COST, AffineCost
from pydtnn_lite.perfmodel.modelling.placement import Placement, ThreadScaling
from pydtnn_lite.perfmodel.modelling.regression import (
    KernelModel,
    KernelSample,
    features,
    model_from_dict,
    sample_columns,
    samples_from_columns,
)
from pydtnn_lite.perfmodel.modelling.roofline import Roofline
from pydtnn_lite.perfmodel.modelling.synchronization import NO_WAIT, SyncWaitModel, fit_sync_wait
from pydtnn_lite.perfmodel.modelling.workload import DATASET_SHAPES

FORMAT, VERSION = "pydtnn_lite calibration", 4

# An update's count sampled this often (several calibrations pooled by ``--merge``) is
# predicted as its samples' median rather than by the fit over the grid: pooled over hours
# they stand for the machine, not for one minute of it. In the merge of eight calibrations
# shipped on 2026-11-27 VGG's 2.36 M-element updates had 184 samples, median 1.63 ms, where
# the fit gave 1.47 ms and the 2-rank runs of 09:07 measured 1.78-2.12 ms.
MIN_UPDATE_SAMPLES = 60


def _call_sizes(dims: tuple, nbytes: float) -> tuple:
    """What tells one call's sizes from another's: its dims and its bytes (the dtype)."""
    return tuple(float(dim) for dim in dims), float(nbytes)


@dataclass
class Calibration:
    """What the performance model knows about one machine (per rank of a job like the calibration's).

    ``kernel_models`` predict each kernel's seconds from its cost; ``peak_flops`` (a
    2048-cubed GEMM) and ``memory_bandwidth`` (a large copy, bytes read plus written)
    are the roofs, ``kernel_rates`` the best FLOP/s and bytes/s each kernel reached.
    ``allreduce_samples`` are (ranks, bytes, seconds) of in-place Allreduce;
    ``allreduce_cpu_samples`` are (ranks, bytes, CPU seconds per rank) of the same calls at
    the counts that time-share the cores (none in files written before they were timed);
    ``allreduce_ranks`` the ranks the calibration ran on. ``sync_wait`` predicts how long
    a rank waits for the slowest at a synchronisation, fitted on ``sync_samples`` (seconds
    of work since the last synchronisation, mean seconds waited; one per probe).
    ``kernel_samples`` are the measurements the models were fitted on, so that fits can
    be redone. ``overhead`` predicts a step's time outside its kernels, fitted on
    ``overhead_samples`` (compute kernel calls of a probe's step, seconds outside them);
    ``data_load`` the seconds of loading a batch of each embedded data set, fitted on
    ``data_load_samples`` (samples, seconds). ``read_ahead_share`` is the share of a batch's
    reading on the loader thread that a step paid in the calibration's placement, measured
    on ``read_ahead_samples`` (step seconds reading in the step, reading ahead, and the
    batch's reading seconds); files without it read as 1, all of it.
    ``machine_state`` is the machine-state probe taken with the calibration, against
    which a later run's probe measures how far the machine moved. ``network`` holds the
    Allreduce between and inside the nodes of a calibration run on several (emulated) nodes,
    None on one node; files without it read as None. ``kernel_probes`` are the kernel
    probe (``measuring/kernel_probe.py``) as the calibration ran it, a few times along its
    kernel phase, against which a run's probe is set like for like (none in older files).
    ``cold_start_samples`` are the calls that followed other work (``KernelCost.cold_start``),
    by kernel, kept out of ``kernel_samples`` and the models (none in older files, whose
    samples hold them). ``thread_scaling`` is how far one rank's threads fell short of
    the cores they add (``placement.ThreadScaling``; None where the calibration's ranks
    did not run one per core on one thread, and in older files: threads scale linearly).
    ``kernel_revisions`` are the revisions of the kernels it timed past their first
    (``costs.KERNEL_REVISIONS`` of the code that measured it; none in older files).
    ``cache_residency`` times the Allreduce and the updates with their data in the cache
    against after an eviction (``cache_residency.py``; None in older files and on one
    rank: every call is predicted evicted). ``bucket_progress`` times a bucket's own calls
    where blocking reductions follow its post on one node, against its blocking Allreduce
    (``bucket_progress.py``; None in older files, on one rank and on several nodes: a
    bucket's whole reduction is predicted in its own calls).
    """

    machine: dict
    peak_flops: float
    memory_bandwidth: float
    kernel_models: dict[str, KernelModel]
    allreduce_samples: list[tuple[int, float, float]]
    allreduce_cpu_samples: list[tuple[int, float, float]] = field(default_factory=list)
    allreduce_ranks: int = 1
    kernel_samples: dict[str, list[KernelSample]] = field(default_factory=dict)
    kernel_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    sync_samples: list[tuple[float, float]] = field(default_factory=list)
    sync_wait: SyncWaitModel = NO_WAIT
    overhead_samples: list[tuple[float, float]] = field(default_factory=list)
    overhead: AffineCost = NO_COST
    data_load_samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    data_load: dict[str, AffineCost] = field(default_factory=dict)
    read_ahead_samples: list[tuple[float, float, float]] = field(default_factory=list)
    read_ahead_share: float = 1.0
    machine_state: MachineState | None = None
    network: NetworkTimings | None = None
    kernel_probes: list[ProbedWork] = field(default_factory=list)
    cold_start_samples: dict[str, list[KernelSample]] = field(default_factory=dict)
    thread_scaling: ThreadScaling | None = None
    kernel_revisions: dict[str, int] = field(default_factory=dict)
    cache_residency: CacheResidency | None = None
    bucket_progress: BucketProgress | None = None
    _cold_start: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _widest: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _sampled: dict[str, dict[tuple, tuple[float, int]]] = field(  # by sizes: (median, count)
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def placement(self) -> Placement:
        """How the calibration's ranks sat: its ranks on one node of its usable cores, each
        with its BLAS threads."""
        ranks = int(self.machine.get("ranks", 1))
        return Placement(ranks, int(self.machine.get("ranks_per_node", ranks)),
                         int(self.machine.get("usable_cores") or self.machine.get("cores") or 1),
                         int(self.machine.get("blas_threads", 1)))

    def unmodelled(self, kernels: Iterable[str]) -> list[str]:
        """Those of ``kernels`` the calibration holds no model of (a file older than them),
        sorted: they are predicted at the roofline. A fused kernel without a model of its own
        counts as the unfused kernels it replaces, from whose models it is predicted (and so
        does any kernel of :data:`~pydtnn_lite.costs.PREDICTED_FROM`); the
        reductions and the network's CPU time come from the Allreduce and network timings."""
        missing: set[str] = set()
        for kernel in kernels:
            if kernel not in self.kernel_models and kernel not in (ALLREDUCE, TRANSFER_CPU):
                missing.update(part for part in PREDICTED_FROM.get(kernel, (kernel,)) if part not in self.kernel_models)
        return sorted(missing)

    def revision(self, kernel: str) -> int:
        """The revision of ``kernel`` (``costs.KERNEL_REVISIONS``) that the calibration timed."""
        return self.kernel_revisions.get(kernel, 1)

    def outdated(self, kernels: Iterable[str]) -> list[str]:
        """Those of ``kernels`` the calibration modelled from an older revision of their code
        than this version's, sorted: their predictions follow the old code's times."""
        return sorted({kernel for kernel in kernels
                       if kernel in self.kernel_models and self.revision(kernel) < KERNEL_REVISIONS.get(kernel, 1)})

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        """Seconds of loading ``samples`` of ``dataset``: its fitted cost, or 0 for a data set the
        calibration did not time (file-based sets: their cost is the file system's)."""
        model = self.data_load.get(dataset)
        return model.seconds(samples) if model is not None and samples > 0 else 0.0

    def read_ahead_seconds(self, seconds: float, placement: Placement) -> float:
        """What ``seconds`` of reading ahead on a rank's loader thread cost a step of a job placed
        as ``placement``: the share of its readers that find no idle core (the placement's
        arithmetic), times the share of their work that the calibration's steps paid where
        no core was idle."""
        busy = self.placement.background_share
        paid = min(1.0, self.read_ahead_share / busy) if busy > 0 else 1.0
        return seconds * placement.background_share * paid

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        """A step's time outside its ``calls`` compute kernel calls. For a ``network`` that
        ``calibrate --models`` sampled whole on images of ``dataset``'s shape (CIFAR-10 and
        the synthetic set alike), its own time outside the kernels at ``batch`` samples per
        rank (interpolated between the batches sampled, held beyond them): the affine fit over
        every probe, whose grid networks have a layer or two, gave the zoo's networks from a
        quarter to 1.3 times what they took (on 2026-11-26 AlexNet 3.1 ms a step against
        10.6-11.7, ResNet18 9.2 against 21, LeNet 1.8 against 1.3-1.7). Otherwise that fit."""
        sampled = self._outside_of_jobs().get((network, DATASET_SHAPES.get(dataset or "")))
        if not sampled:
            return self.overhead.seconds(calls)
        batches, seconds = zip(*sorted(sampled), strict=True)
        return float(np.interp(batch, batches, seconds))

    def _outside_of_jobs(self) -> dict[tuple[str, object], list[tuple[int, float]]]:
        """(batch per rank, seconds outside the kernels) by (network, data set's shapes) of the
        networks sampled whole: ``calibrate`` keeps theirs last in ``overhead_samples``, one
        each (the median of its rounds), in the order of ``settings["jobs"]``."""
        jobs = self.settings.get("jobs", [])
        if not jobs or len(self.overhead_samples) < len(jobs):
            return {}
        out: dict[tuple[str, object], list[tuple[int, float]]] = defaultdict(list)
        for job, (_, seconds) in zip(jobs, self.overhead_samples[-len(jobs):], strict=True):
            model, batch, dataset = job.split(":")
            out[(model, DATASET_SHAPES.get(dataset))].append((int(batch), seconds))
        return out

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float:
        """Predicted seconds of one call of ``kernel`` with ``cost``: as :meth:`warm_seconds`
        predicts it, and for a call that follows other work, the time such calls took beyond
        that (:meth:`cold_start_seconds`)."""
        return self.kernel_seconds_of(kernel, [cost])[0]

    def kernel_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        """:meth:`kernel_seconds` of each of ``costs``, calls of ``kernel`` (:meth:`warm_seconds_of`)."""
        return [seconds + self.cold_start_seconds(kernel) if cost.cold_start else seconds
                for cost, seconds in zip(costs, self.warm_seconds_of(kernel, costs), strict=True)]

    def cold_start_seconds(self, kernel: str) -> float:
        """The median time beyond its warm prediction of a call of ``kernel`` that followed
        other work, over the calibration's samples of such calls (0 without any). On
        2026-11-26 a step's first update took 55-80 us more than the same call among
        the others: after a few milliseconds of other code, even a tiny NumPy call costs
        tens of microseconds on this machine, and LeNet's first update was over a quarter of its WU."""
        if kernel not in self._cold_start:
            samples = self.cold_start_samples.get(kernel, [])
            warm = self.warm_seconds_of(kernel, [KernelCost(Stage.WU, kernel, sample.flops, sample.bytes, sample.dims)
                                                 for sample in samples])
            beyond = [sample.seconds - seconds for sample, seconds in zip(samples, warm, strict=True)]
            self._cold_start[kernel] = max(0.0, statistics.median(beyond)) if beyond else 0.0
        return self._cold_start[kernel]

    def warm_seconds(self, kernel: str, cost: KernelCost) -> float:
        """Predicted seconds of one call of ``kernel`` with ``cost`` among calls of its kind; a
        kernel without a model, or whose model overflows, gets the roofline time
        max(flops / peak_flops, bytes / memory_bandwidth).

        A call the calibration sampled at exactly these sizes (a job's own network sampled
        whole, ``calibrate --models``) gets the median of its samples: a measurement of the
        call itself is closer than any fit over the grid (the GEMM model holds out 6-7 %).
        Not so the updates and the other passes over the whole gradient (:data:`STREAMING`)
        with fewer than :data:`MIN_UPDATE_SAMPLES` samples of their count: their time follows
        the element count alone, which the grid samples from 6 to 4 M all along the kernel
        phase, where a job's few samples of one count come from one minute of a memory
        system that wanders (on 2026-11-26 VGG's 2.36 M-element updates: 2.39-4.09 ms in the
        jobs of the 08:23 calibration, 2.46 ms from its fit, 2.50-2.67 ms in a run at 08:43).
        A call beyond the largest batch sampled (the leading dim of every kernel but GEMM
        grows with the batch) is predicted as that many calls at the largest one: its work
        grows in proportion, where a fitted model's curve past its samples may not."""
        return self.warm_seconds_of(kernel, [cost])[0]

    def warm_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        """:meth:`warm_seconds` of each of ``costs``, calls of ``kernel``, with its model
        evaluated once over all those it predicts: an MLP ensemble's forward pass costs the
        same for one row as for hundreds."""
        least = MIN_UPDATE_SAMPLES if kernel in STREAMING else 1
        model = self.kernel_models.get(kernel)
        widest = self._widest_sampled(kernel)
        seconds: list[float] = []
        modelled: list[tuple[int, float, np.ndarray]] = []  # (position, calls at the widest, features)
        for position, cost in enumerate(costs):
            sampled = self._sampled_seconds(kernel, cost, least)
            if sampled is not None:
                seconds.append(sampled)
            elif model is None:
                seconds.append(self._unfused_seconds(cost) if cost.replaces else self._roofline_seconds(cost))
            else:
                seconds.append(math.nan)
                if kernel in COMPUTE_BOUND or not cost.dims or not widest or cost.dims[0] <= widest:
                    modelled.append((position, 1.0, features(cost.dims, cost.flops, cost.bytes)))
                else:
                    calls = cost.dims[0] / widest
                    modelled.append((position, calls, features((widest, *cost.dims[1:]), cost.flops / calls,
                                                               cost.bytes / calls)))
        if modelled and model is not None:
            with np.errstate(over="ignore"):
                predicted = model.predict_features(np.stack([row for _, _, row in modelled]))
            for (position, calls, _), one_call in zip(modelled, predicted, strict=True):
                total = calls * float(one_call)
                # A power law fitted on a few samples can overflow far beyond them (a quick calibration's
                # fused batch-norm gradient on DenseNet's maps, 2026-11-27): the roofline stands in.
                seconds[position] = total if math.isfinite(total) else self._roofline_seconds(costs[position])
        return seconds

    def _roofline_seconds(self, cost: KernelCost) -> float:
        return Roofline(self.peak_flops, self.memory_bandwidth).seconds(cost.flops, cost.bytes)

    def _unfused_seconds(self, cost: KernelCost) -> float:
        """A fused call that the calibration never sampled (one older than the fused kernel),
        or another kernel it predicts from others (:data:`~pydtnn_lite.costs.PREDICTED_FROM`):
        the predicted seconds of the unfused calls it replaces, each by its own model (or
        roofline), scaled by the fused call's bytes over theirs. These kernels are
        memory-bound, and what fusing saves is the passes over memory."""
        parts = cost.replaces
        seconds = sum(self.kernel_seconds(part.kernel, part) for part in parts)
        return seconds * cost.bytes / sum(part.bytes for part in parts)

    def _sampled_seconds(self, kernel: str, cost: KernelCost, least: int = 1) -> float | None:
        """The median seconds of ``kernel``'s samples of exactly ``cost``'s dims and bytes, or
        None where there are fewer than ``least``."""
        if kernel not in self._sampled:
            calls: dict[tuple, list[float]] = defaultdict(list)
            for sample in self.kernel_samples.get(kernel, []):
                calls[_call_sizes(sample.dims, sample.bytes)].append(sample.seconds)
            self._sampled[kernel] = {sizes: (statistics.median(seconds), len(seconds))
                                     for sizes, seconds in calls.items()}
        median, count = self._sampled[kernel].get(_call_sizes(cost.dims, cost.bytes), (None, 0))
        return median if count >= least else None

    @property
    def allreduce_rank_counts(self) -> set[int]:
        """The rank counts (above 1) the calibration timed Allreduce on."""
        return {procs for procs, _, _ in self.allreduce_samples if procs > 1}

    def _widest_sampled(self, kernel: str) -> int:
        """The largest leading dim among ``kernel``'s samples (0 without samples)."""
        if kernel not in self._widest:
            self._widest[kernel] = max((sample.dims[0] for sample in self.kernel_samples.get(kernel, [])
                                        if sample.dims), default=0)
        return self._widest[kernel]

    # ------------------------------------------------------------------ file
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "machine": self.machine, "settings": self.settings,
                "roofline": {"peak_flops": self.peak_flops, "memory_bandwidth": self.memory_bandwidth,
                             "kernels": self.kernel_rates},
                "kernel_models": {name: model.to_dict() for name, model in sorted(self.kernel_models.items())},
                "kernel_samples": {name: sample_columns(samples)
                                   for name, samples in sorted(self.kernel_samples.items())},
                "allreduce_ranks": self.allreduce_ranks,
                "allreduce_samples": [list(sample) for sample in self.allreduce_samples],
                "allreduce_cpu_samples": [list(sample) for sample in self.allreduce_cpu_samples],
                "synchronization": {"model": self.sync_wait.to_dict(),
                                    "samples": [list(sample) for sample in self.sync_samples]},
                "overhead": {"model": self.overhead.to_dict(),
                             "samples": [list(sample) for sample in self.overhead_samples]},
                "data_load": {name: {"model": model.to_dict(),
                                     "samples": [list(sample) for sample in self.data_load_samples.get(name, [])]}
                              for name, model in sorted(self.data_load.items())},
                "read_ahead": {"share": self.read_ahead_share,
                               "samples": [list(sample) for sample in self.read_ahead_samples]},
                "machine_state": self.machine_state.to_dict() if self.machine_state else None,
                "network": self.network.to_dict() if self.network else None,
                "kernel_probes": [probe.to_dict() for probe in self.kernel_probes],
                "cold_start_samples": {name: sample_columns(samples)
                                       for name, samples in sorted(self.cold_start_samples.items())},
                "thread_scaling": self.thread_scaling.to_dict() if self.thread_scaling else None,
                "kernel_revisions": dict(sorted(self.kernel_revisions.items())),
                "cache_residency": self.cache_residency.to_dict() if self.cache_residency else None,
                "bucket_progress": self.bucket_progress.to_dict() if self.bucket_progress else None}

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        roofline = data["roofline"]
        synchronization = data["synchronization"]
        sync_samples = [(float(work), float(wait)) for work, wait in synchronization["samples"]]
        # Fitted again from its samples, so that a file written under an older rule follows today's.
        sync_wait = (fit_sync_wait(sync_samples, int(synchronization["model"]["ranks"])) if sync_samples
                     else SyncWaitModel.from_dict(synchronization["model"]))
        return cls(machine=dict(data["machine"]), peak_flops=float(roofline["peak_flops"]),
                   memory_bandwidth=float(roofline["memory_bandwidth"]),
                   kernel_models={name: model_from_dict(model) for name, model in data["kernel_models"].items()},
                   allreduce_samples=[(int(p), float(n), float(s)) for p, n, s in data["allreduce_samples"]],
                   allreduce_cpu_samples=[(int(p), float(n), float(s))
                                          for p, n, s in data.get("allreduce_cpu_samples", [])],
                   allreduce_ranks=int(data["allreduce_ranks"]),
                   kernel_samples={name: samples_from_columns(columns)
                                   for name, columns in data["kernel_samples"].items()},
                   kernel_rates={name: dict(rates) for name, rates in roofline["kernels"].items()},
                   settings=dict(data["settings"]),
                   sync_samples=sync_samples,
                   sync_wait=sync_wait,
                   overhead_samples=[(float(calls), float(seconds)) for calls, seconds in data["overhead"]["samples"]],
                   overhead=AffineCost.from_dict(data["overhead"]["model"]),
                   data_load_samples={name: [(float(n), float(t)) for n, t in entry["samples"]]
                                      for name, entry in data["data_load"].items()},
                   data_load={name: AffineCost.from_dict(entry["model"]) for name, entry in data["data_load"].items()},
                   read_ahead_samples=[(float(a), float(b), float(c))
                                       for a, b, c in data.get("read_ahead", {}).get("samples", [])],
                   read_ahead_share=float(data.get("read_ahead", {}).get("share", 1.0)),
                   machine_state=MachineState.from_dict(data["machine_state"]) if data["machine_state"] else None,
                   network=NetworkTimings.from_dict(data["network"]) if data.get("network") else None,
                   kernel_probes=[ProbedWork.from_dict(probe) for probe in data.get("kernel_probes", [])],
                   cold_start_samples={name: samples_from_columns(columns)
                                       for name, columns in data.get("cold_start_samples", {}).items()},
                   thread_scaling=(ThreadScaling.from_dict(data["thread_scaling"])
                                   if data.get("thread_scaling") else None),
                   kernel_revisions={name: int(revision)
                                     for name, revision in data.get("kernel_revisions", {}).items()},
                   cache_residency=(CacheResidency.from_dict(data["cache_residency"])
                                    if data.get("cache_residency") else None),
                   bucket_progress=(BucketProgress.from_dict(data["bucket_progress"])
                                    if data.get("bucket_progress") else None))

    def save(self, path: str) -> None:
        """Write the calibration file at ``path`` (its folder is created; the file is replaced
        whole, never left half written)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, separators=(",", ":"))
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str) -> Calibration:
        """Read a file written by :meth:`save`. Raises OSError if it cannot be read and
        ValueError if it is not a calibration file or is damaged."""
        data = read_calibration_data(path)
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path} is a damaged calibration file ({type(error).__name__}: {error}): "
                             "calibrate again") from error


def read_calibration_data(path: str) -> dict:
    """The JSON object of the calibration file at ``path``, its format and version checked.
    Raises OSError if it cannot be read and ValueError if it is not a calibration file of
    this version."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise OSError(error.errno, f"cannot read calibration file {path}: {error.strerror}") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a calibration file (not JSON: {error}): write one with "
                         "python -m pydtnn_lite.calibrate --out FILE") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a calibration file (no \"format\": \"{FORMAT}\"): write one with "
                         "python -m pydtnn_lite.calibrate --out FILE")
    if data.get("version") != VERSION:
        raise ValueError(f"{path} is a calibration file of version {data.get('version')}, this program reads "
                         f"version {VERSION}: calibrate again")
    return data

