"""Predict a training step, kernel by kernel, from a model's layer shapes and a machine model.

The step is what the trainer runs (``step_costs``): every layer's FP kernels,
the loss, every layer's BP kernels with the gradient buckets reduced as backward
completes them, the loss reduction, and the WU kernels; batch-norm layers list the
reductions of their statistics among their costs. Without overlap the bucket reductions follow backward;
with overlap each starts when its last layer's backward is done, beside the computation.
A bucket's reduction and an update whose data the step leaves in the last-level cache
take the calibration's resident time (``cache_residency.py``).

A step that accumulates gradients (``--accumulate``) runs FP and BP once per micro-batch,
each followed by the sum of its gradients, and reduces the buckets after the last one.

Every blocking reduction also makes the ranks wait for the slowest of them
(``synchronization.py``): a batch-norm reduction after the work since the previous one,
and the end of the step after the work since the last batch-norm reduction of backward
(the whole step without batch norm). A batch-norm reduction's prediction includes its
wait, as its measured time does; the wait at the end of the step is a COMM entry of its
own, ``sync_wait``.

Where the reductions overlap backward, they share one channel, simulated beside backward
(``channel.py``): each bucket's reduction in phases; over MPI on TCP a phase starts only
inside an MPI call (the test the trainer makes after each kernel and layer of backward
while buckets are outstanding, or a blocking call), the link moves no more than the
sockets hold between two calls, and what the tests' phases move while the rank computes
costs it CPU time, per layer a ``transfer_cpu`` entry in COMM for the part inside the tests
(the trace counts the tests there, as communication that the step pays between the kernels
of backward) and one in BP for the kernels that the network stack's interrupts slow. A
batch-norm reduction that backward makes while buckets are outstanding goes out behind
them and waits for them: over a network of 1 Gbit/s, ResNet18's backward spends most of
its gradient's transfer in these waits.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from pydtnn_lite.comm.gradients import MIB, Bucket, plan_buckets
from pydtnn_lite.costs import (
    ALLREDUCE,
    ALLREDUCE_PROGRESS,
    ALLREDUCE_START,
    COMPUTE_STAGES,
    DATA_LOAD,
    H2D_COPY,
    NO_LAYER,
    SYNC_WAIT,
    TRANSFER_CPU,
    CallCounter,
    CallKey,
    KernelCost,
    Stage,
)
from pydtnn_lite.data.sampler import partition
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer
from pydtnn_lite.perfmodel.modelling.allreduce import AllreduceModel
from pydtnn_lite.perfmodel.modelling.channel import NO_TRANSFER_COST, Channel, TransferCost
from pydtnn_lite.perfmodel.modelling.roofline import Roofline
from pydtnn_lite.step_costs import ACCUMULATE_GRADIENTS, h2d_copy_cost, micro_batch_entries

LOSS_VALUES_BYTES = 16  # the step's loss and correct count, two float64
STAGES = (Stage.DATA, *COMPUTE_STAGES, Stage.COMM)  # what a prediction sums (DATA: only when the data set is known)


class Machine(Protocol):
    """What a prediction needs to know of a machine.

    ``overlaps_communication`` says whether an Allreduce advances while the rank computes
    (NCCL, RDMA networks) or only inside MPI calls on the computing cores (MPI on the
    host, as MPICH on this machine), where overlap hides nothing. Where it overlaps,
    ``starts_inside_calls`` says whether a bucket's reduction begins to move only inside an
    MPI call (MPICH over TCP: the synchronizer's tests after kernels and layers, and
    blocking calls) rather than as soon as the bucket before it is done (NCCL), and
    ``pipelines_in_tests`` whether a reduction is a pipeline of collectives that only the
    tests start one after the other (the hierarchical strategy over MPI). ``sync_wait_seconds``
    is the mean wait for the slowest of ``procs`` ranks after ``segment`` seconds of work.
    ``link_seconds`` is the part of a reduction's seconds that the links between nodes
    carry, where its ranks span nodes (its exchanges inside a node run beside the other
    buckets' on the links); the whole of it elsewhere.
    ``allreduce_during_compute_seconds`` is what a reduction that runs while other ranks
    still compute adds to a step that overlap cannot hide it in (its duration, or its CPU
    time where ranks time-share the cores).
    ``overhead_seconds`` is a step's time outside its ``calls`` compute kernel calls (of
    ``network`` with ``batch`` samples per rank of ``dataset``, where the machine knows it),
    ``data_load_seconds`` the time to load ``samples`` of data set ``dataset``, and
    ``background_seconds`` how much of ``seconds`` of work on a rank's background thread
    (batches read ahead) lengthens its step. ``transfer_cost`` is what moving overlapped
    buckets over MPI on a network costs beside the computation (``channel.py``).
    ``cache_factor`` is what a call of ``kernel`` (a bucket's Allreduce, an update) on a
    gradient of ``nbytes`` takes against its calibrated time, which is an evicted call's,
    where each rank of the node moved ``moved`` bytes since the call's data was last used,
    ``since_use`` seconds before (``cache_residency.py``). ``bucket_share_left`` is the
    share of a bucket's reduction of ``nbytes`` that its own calls do where it moves only
    inside MPI calls and blocking reductions follow its post (``bucket_progress.py``): 1
    where nothing else advances it.
    """

    @property
    def overlaps_communication(self) -> bool: ...

    @property
    def starts_inside_calls(self) -> bool: ...

    @property
    def pipelines_in_tests(self) -> bool: ...

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float: ...

    def kernel_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        """:meth:`kernel_seconds` of each of ``costs``, calls of ``kernel``, at once."""
        ...

    def allreduce_seconds(self, nbytes: float, procs: int) -> float: ...

    def link_seconds(self, nbytes: float, procs: int) -> float: ...

    def allreduce_during_compute_seconds(self, nbytes: float, procs: int) -> float: ...

    def sync_wait_seconds(self, segment: float, procs: int) -> float: ...

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        ...

    def data_load_seconds(self, dataset: str, samples: int) -> float: ...

    def background_seconds(self, seconds: float) -> float: ...

    @property
    def transfer_cost(self) -> TransferCost: ...

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float: ...

    def bucket_share_left(self, nbytes: float, procs: int) -> float: ...


@dataclass(frozen=True)
class RooflineMachine:
    """Kernels on a roofline, Allreduce from an alpha-beta-gamma model; ranks that run in
    lockstep (a described machine has no measured jitter)."""

    roofline: Roofline
    allreduce: AllreduceModel
    overlaps_communication: bool = True
    starts_inside_calls: bool = False  # the presets' networks (NCCL, RDMA) move data on their own
    pipelines_in_tests: bool = False

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float:
        return self.roofline.seconds(cost.flops, cost.bytes)

    def kernel_seconds_of(self, kernel: str, costs: Sequence[KernelCost]) -> list[float]:
        return [self.kernel_seconds(kernel, cost) for cost in costs]

    def allreduce_seconds(self, nbytes: float, procs: int) -> float:
        return self.allreduce.seconds(nbytes, procs)

    def link_seconds(self, nbytes: float, procs: int) -> float:
        return self.allreduce_seconds(nbytes, procs)  # a described network is one link: it carries the whole

    def allreduce_during_compute_seconds(self, nbytes: float, procs: int) -> float:
        return self.allreduce.seconds(nbytes, procs)

    def sync_wait_seconds(self, segment: float, procs: int) -> float:
        return 0.0

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        return 0.0  # a described machine runs its kernels back to back

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        return 0.0

    def background_seconds(self, seconds: float) -> float:
        return 0.0  # a described node has a core to spare for reading ahead

    @property
    def transfer_cost(self) -> TransferCost:
        return NO_TRANSFER_COST  # NCCL and RDMA move the data without the host's cores

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float:
        return 1.0  # a roofline has no cache

    def bucket_share_left(self, nbytes: float, procs: int) -> float:
        return 1.0  # its reductions run on their own (NCCL, RDMA)


@dataclass(frozen=True)
class PredictedKernel:
    """One kernel call of the step: where it runs, its counts and its predicted time."""

    layer: int
    layer_name: str
    stage: str
    kernel: str
    occurrence: int  # among calls of the same (layer, stage, kernel)
    seconds: float
    flops: float
    bytes: float
    micro_batch: int = 0  # which of a step's micro-batches it runs for (``--accumulate``); 0 for the update

    @property
    def key(self) -> CallKey:
        """The key of the traced call this predicts."""
        return CallKey(self.layer, self.stage, self.kernel, self.occurrence)


@dataclass
class StepPrediction:
    """A predicted step: its kernels, bucket reductions, waits for the slowest rank, and
    totals with and without overlap."""

    kernels: list[PredictedKernel]
    bucket_bytes: list[float]
    bucket_seconds: list[float]
    procs: int
    batch: int  # a rank's samples of each micro-batch (of the step, without --accumulate)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    step_without_overlap: float = 0.0
    step_with_overlap: float = 0.0
    wait_seconds: float = 0.0  # waits for the slowest rank, at every synchronisation together
    synchronisations: int = 0
    overhead_seconds: float = 0.0  # outside the kernels (the interpreter between calls), in both step totals
    # What loading the batch adds to the step, with and without overlap: all of the DATA stage,
    # or with batches read ahead, what the reading takes from the step's cores and any wait for it.
    data_in_step_with_overlap: float = 0.0
    data_in_step_without_overlap: float = 0.0
    accumulate: int = 1  # micro-batches a step

    def step_seconds(self, overlap: bool) -> float:
        return self.step_with_overlap if overlap else self.step_without_overlap

    def data_in_step(self, overlap: bool) -> float:
        return self.data_in_step_with_overlap if overlap else self.data_in_step_without_overlap

    def layer_table(self) -> dict[tuple[int, str], dict[str, float]]:
        """Seconds per (layer, name) and stage."""
        table: dict[tuple[int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for kernel in self.kernels:
            table[(kernel.layer, kernel.layer_name)][kernel.stage] += kernel.seconds
        return table


def predict_step(network: Network, optimizer: Optimizer, batch: int, procs: int, machine: Machine,
                 bucket_mb: float = 4.0, first_bucket_mb: float | None = None,
                 dataset: str | None = None, prefetch: bool = False, accumulate: int = 1,
                 clip: bool = False, overlap: bool = True) -> StepPrediction:
    """Predict one training step of a rank that holds ``batch`` samples, with ``procs`` ranks
    and the gradient buckets a GradientSynchronizer of ``bucket_mb`` and ``first_bucket_mb`` plans.
    With ``dataset`` the step starts with loading the batch from it and copying it to the device;
    with ``prefetch`` the batch was read on a background thread while the previous step ran,
    and the step waits only for what that thread takes from its cores and, when reading is
    the slower, for the rest of the reading. With ``accumulate`` the step runs forward and
    backward on that many micro-batches of ``batch`` samples, sums their gradients, and
    reduces the sum after the last backward, as the trainer does (nothing to overlap). With
    ``clip`` the update starts by clipping the reduced gradient by its norm. Without
    ``overlap`` (the trainer's ``--no-overlap``) backward starts no bucket either: every
    bucket is reduced after it, and the step with overlap is the step without.

    With ``overlap`` the kernels are those of the overlapped step, and the step without
    overlap a sum of theirs that leaves the overlap's entries out: where the batch norms'
    reductions advance the buckets, predict without ``overlap`` for the kernels and the
    step of a run without it."""
    itemsize = np.dtype(network.backend.dtype).itemsize
    # One rank has nothing to reduce: no batch-norm reduction is predicted (a 1-rank trace's calls stay unmatched).
    entries = [entry for entry in micro_batch_entries(network, optimizer, batch, accumulate, clip)
               if procs > 1 or entry[2].kernel != ALLREDUCE]
    costs = [(layer, cost) for _, layer, cost in entries]
    calls = sum(cost.kernel != ALLREDUCE for _, cost in costs)
    samples = batch * accumulate
    data_kernels = []
    if dataset is not None:
        copy = h2d_copy_cost(samples, network.input_shape)
        data_kernels = [PredictedKernel(NO_LAYER, "", Stage.DATA, DATA_LOAD, 0,
                                        machine.data_load_seconds(dataset, samples), 0.0, copy.bytes / 2),
                        PredictedKernel(NO_LAYER, "", Stage.DATA, H2D_COPY, 0, machine.kernel_seconds(H2D_COPY, copy),
                                        copy.flops, copy.bytes)]
    gradient_bytes = float(network.param_count * itemsize) if procs > 1 else 0.0
    step_bytes = sum(cost.bytes for _, cost in costs if cost.kernel != ALLREDUCE) + gradient_bytes
    call_seconds = _call_seconds(machine, [cost for _, cost in costs], procs)
    # The time outside the kernels is the interpreter's between calls: a micro-batch's step's, once each.
    overhead = accumulate * machine.overhead_seconds(calls // accumulate, network.name, batch, dataset)
    step_seconds = sum(seconds for (_, cost), seconds in zip(costs, call_seconds, strict=True)
                       if cost.kernel != ALLREDUCE) + overhead
    counter = CallCounter()
    kernels = []
    for (micro_batch, layer, cost), seconds in zip(entries, call_seconds, strict=True):
        key = counter.key(layer, cost.stage, cost.kernel)
        name = (network.layers[layer].name if 0 <= layer < len(network.layers)
                else "loss" if layer == network.loss_index else "")
        kernels.append(PredictedKernel(layer, name, cost.stage, cost.kernel, key.occurrence, seconds, cost.flops,
                                       cost.bytes, micro_batch))
    kernels = _updates_in_cache(kernels, machine, optimizer, (step_bytes, step_seconds), gradient_bytes,
                                overhead / calls if calls else 0.0)
    read_ahead = sum(k.seconds for k in data_kernels if k.kernel == DATA_LOAD) if prefetch else 0.0
    if read_ahead:
        kernels = _beside_the_reader(kernels, machine.background_seconds(read_ahead))
    kernels, waits, end_wait, slowest = _with_sync_waits(kernels, machine, procs)
    first_bucket_bytes = None if first_bucket_mb is None else first_bucket_mb * MIB
    buckets = plan_buckets(network, bucket_mb * MIB, first_bucket_bytes) if procs > 1 else []
    bucket_bytes = [float(b.size * itemsize) for b in buckets]
    reuse = (_bucket_reuse(network, costs, call_seconds, buckets, itemsize) if accumulate == 1
             else _reuse_after_accumulation(costs, call_seconds, bucket_bytes))
    in_cache = [machine.cache_factor(ALLREDUCE, n, moved, since_use)
                for n, (moved, since_use) in zip(bucket_bytes, reuse, strict=True)]
    bucket_seconds = [machine.allreduce_seconds(n, procs) * factor for n, factor in zip(bucket_bytes, in_cache,
                                                                                        strict=True)]
    in_own_calls = bucket_seconds
    if accumulate > 1 or not overlap:  # every bucket is reduced after the last backward, in its own calls
        exposed = sum(bucket_seconds)
    elif machine.overlaps_communication:
        kernels, exposed = _backward_channel(network, kernels, bucket_bytes, buckets, bucket_seconds, machine, procs,
                                             slowest, overhead / calls if calls else 0.0)
    else:
        handed = [seconds * (1.0 - machine.bucket_share_left(n, procs))
                  for n, seconds in zip(bucket_bytes, bucket_seconds, strict=True)]
        kernels, handed = _finished_in_blocking_reductions(network, kernels, buckets, handed, waits)
        in_own_calls = [seconds - part for seconds, part in zip(bucket_seconds, handed, strict=True)]
        # The batch norms' reductions do that part of the buckets: taken from their cost to the
        # step (what of it runs inside a wait for the slowest rank costs the step nothing).
        exposed = _unhidden_bucket_seconds(machine, bucket_bytes, in_cache, procs) - sum(handed)
    kernels = data_kernels + kernels
    loss_seconds = machine.allreduce_seconds(LOSS_VALUES_BYTES, procs)
    if procs > 1:
        reductions = zip(bucket_bytes + [LOSS_VALUES_BYTES], in_own_calls + [loss_seconds], strict=True)
        kernels += [PredictedKernel(NO_LAYER, "", Stage.COMM, ALLREDUCE, i, s, 0.0, n)
                    for i, (n, s) in enumerate(reductions)]
        kernels.append(PredictedKernel(NO_LAYER, "", Stage.COMM, SYNC_WAIT, 0, end_wait, 0.0, 0.0))
    prediction = StepPrediction(kernels, bucket_bytes, bucket_seconds, procs, batch, accumulate=accumulate,
                                wait_seconds=sum(waits.values()) + end_wait,
                                synchronisations=len(waits) + (procs > 1), overhead_seconds=overhead)
    stage: defaultdict[str, float] = defaultdict(float)
    for kernel in kernels:
        stage[kernel.stage] += kernel.seconds
    prediction.stage_seconds = {name: stage[name] for name in STAGES}
    data = stage[Stage.DATA] - read_ahead  # what the reading takes from the cores is in the kernels beside it
    compute = sum(stage[name] for name in COMPUTE_STAGES) + prediction.overhead_seconds
    overlap_only = sum(k.seconds for k in kernels if k.kernel in (ALLREDUCE_START, ALLREDUCE_PROGRESS, TRANSFER_CPU))
    without_data = {False: compute + stage[Stage.COMM] - overlap_only,
                    True: compute + exposed + loss_seconds + end_wait}
    # Reading slower than the step's own work: the step waits for the rest of it.
    in_step = {overlap: max(data, read_ahead - rest) for overlap, rest in without_data.items()}
    prediction.data_in_step_without_overlap, prediction.data_in_step_with_overlap = in_step[False], in_step[True]
    prediction.step_without_overlap = without_data[False] + in_step[False]
    prediction.step_with_overlap = without_data[True] + in_step[True]
    return prediction


def _call_seconds(machine: Machine, costs: Sequence[KernelCost], procs: int) -> list[float]:
    """Each call's predicted seconds among ``procs`` ranks, the compute calls asked of the
    machine a kernel at a time: a calibration's models predict many calls in one pass (a
    DenseNet121 step makes about 2700 calls that its MLPs predict)."""
    by_kernel: defaultdict[str, list[int]] = defaultdict(list)
    seconds = [0.0] * len(costs)
    for position, cost in enumerate(costs):
        if cost.kernel == ALLREDUCE:
            seconds[position] = machine.allreduce_seconds(cost.bytes, procs)
        else:
            by_kernel[cost.kernel].append(position)
    for kernel, positions in by_kernel.items():
        for position, value in zip(positions, machine.kernel_seconds_of(kernel, [costs[i] for i in positions]),
                                   strict=True):
            seconds[position] = value
    return seconds


def _run_order(kernels: list[PredictedKernel], stages: Sequence[str]) -> list[PredictedKernel]:
    """The compute kernels of ``stages`` in that order (reductions left out), each stage's in
    the order a rank runs them: FP layer by layer, BP from the loss back to the first layer
    (then the sum of the micro-batches' gradients, which is no layer's); with micro-batches,
    FP and BP of each in turn, and the update before them all where ``stages`` lists it
    first (the previous step's), after them otherwise."""
    position = {stage: i for i, stage in enumerate(stages)}
    update_first = bool(stages) and stages[0] == Stage.WU

    def order(k: PredictedKernel) -> tuple[float, int, int]:
        micro_batch = k.micro_batch if k.stage != Stage.WU else -math.inf if update_first else math.inf
        return micro_batch, position[k.stage], -k.layer if k.stage == Stage.BP else k.layer
    return sorted((k for k in kernels if k.stage in position and k.kernel != ALLREDUCE), key=order)


def _beside_the_reader(kernels: list[PredictedKernel], seconds: float) -> list[PredictedKernel]:
    """``kernels`` with the ``seconds`` that reading the next batch ahead takes from the
    cores charged to the kernels it runs beside: the reading starts as the step takes its
    batch, so the step's first kernels pay for it, each at most its own time (a kernel whose
    core the reader shares runs at no less than half its speed). Traced on one process of
    two threads, the MLP's first product took 7.5-8.0 ms reading ahead and 4.7 ms without."""
    extra: dict[CallKey, float] = {}
    for kernel in _run_order(kernels, (Stage.FP, Stage.BP, Stage.WU)):
        if seconds <= 0.0:
            break
        extra[kernel.key] = min(seconds, kernel.seconds)
        seconds -= extra[kernel.key]
    return [replace(k, seconds=k.seconds + extra[k.key]) if k.key in extra else k for k in kernels]


@dataclass(frozen=True)
class SlowestRank:
    """The backward of the rank the others wait for at the end of the step, against a
    rank's predicted one: it starts ``delay`` seconds later, and each BP kernel in
    ``seconds`` (by key) takes that long instead, so that it ends as much later as the
    others wait for it. Ranks leave a blocking reduction together, so only the work since
    the last one (all of the step without batch norm) runs slower."""

    delay: float = 0.0
    seconds: dict[CallKey, float] = field(default_factory=dict)


def _with_sync_waits(kernels: list[PredictedKernel], machine: Machine, procs: int
                     ) -> tuple[list[PredictedKernel], dict[tuple[int, int, str], float], float, SlowestRank]:
    """``kernels`` with each batch-norm reduction's wait for the slowest rank added to its
    time, those waits by the reduction's :func:`_reduction_key`, the wait at the end of the step
    (none on one rank), and the slowest rank's backward that this last wait implies.

    The work between two synchronisations is walked in the order a rank runs it: the
    update of the previous step, FP layer by layer, then BP from the loss back to the
    first layer. A layer's reduction follows its first kernel of the stage (a batch-norm
    layer sums its statistics, reduces them, then normalises).
    """
    if procs <= 1:
        return kernels, {}, 0.0, SlowestRank()
    reductions = {_reduction_key(k): k for k in kernels if k.kernel == ALLREDUCE}
    order = _run_order(kernels, (Stage.WU, Stage.FP, Stage.BP))
    waits: dict[tuple[int, int, str], float] = {}
    in_cache: dict[tuple[int, int, str], float] = {}
    segment: list[PredictedKernel] = []
    for kernel in order:
        segment.append(kernel)
        key = _reduction_key(kernel)
        if key in reductions and key not in waits:
            seconds = sum(k.seconds for k in segment)
            waits[key] = machine.sync_wait_seconds(seconds, procs)
            # MPICH's buffers were last used by the previous reduction, a segment before.
            nbytes = reductions[key].bytes
            in_cache[key] = machine.cache_factor(ALLREDUCE, nbytes, sum(k.bytes for k in segment) + nbytes, seconds)
            segment = []
    waited = [replace(k, seconds=k.seconds * in_cache[_reduction_key(k)] + waits[_reduction_key(k)])
              if k.kernel == ALLREDUCE else k for k in kernels]
    work = sum(k.seconds for k in segment)
    end_wait = machine.sync_wait_seconds(work, procs)
    slower = end_wait / work if work > 0 else 0.0
    slowest = SlowestRank(slower * sum(k.seconds for k in segment if k.stage != Stage.BP),
                          {k.key: k.seconds * (1.0 + slower) for k in segment if k.stage == Stage.BP})
    return waited, waits, end_wait, slowest


def _reduction_key(kernel: PredictedKernel) -> tuple[int, int, str]:
    """Which blocking reduction ``kernel`` is, or shares a synchronisation with: its
    micro-batch's, its layer's, in its stage (a batch-norm layer reduces once in each)."""
    return kernel.micro_batch, kernel.layer, kernel.stage


def _backward_order(network: Network, kernels: list[PredictedKernel]) -> list[PredictedKernel]:
    """The BP kernels in the order a rank runs them: the loss's, then the layers' from the last
    to the first, each layer's in the order it lists them."""
    backward = [k for k in kernels if k.stage == Stage.BP]
    return sorted(backward, key=lambda k: (k.layer != network.loss_index, -k.layer))


def _finished_in_blocking_reductions(network: Network, kernels: list[PredictedKernel], buckets: Sequence[Bucket],
                                     handed: list[float], waits: dict[tuple[int, int, str], float]
                                     ) -> tuple[list[PredictedKernel], list[float]]:
    """On one node, where a bucket's reduction moves only inside MPI calls: ``kernels``
    with each blocking reduction of backward (a batch-norm layer's statistics) doing
    ``handed[i]`` of every bucket ``i`` posted since the reduction before it, and the
    seconds each bucket handed over: its ``handed`` share where such a reduction follows
    its post, none for the buckets posted after backward's last one. MPICH's progress
    engine advances every outstanding collective inside a blocking call, and the call's
    own sums wait behind the bucket's phases (``bucket_progress.py``). The work runs
    while the rank waits there for the slowest (``waits``, by the reduction's layer and
    stage): only what outlasts that wait lengthens the reduction. Against two-rank
    traces of ResNet18, ResNet50 and DenseNet121 the buckets' work added whole to the
    waits put their batch norms' reductions and COMM 12-36 ms over the traced ones in
    ResNet50's steps (docs/model-accuracy-log.md, 2026-12-02 evening)."""
    extra: dict[CallKey, float] = {}
    taken = [0.0] * len(buckets)
    handed_over = 0  # the buckets before this index went to an earlier reduction
    for kernel, posted in _with_posts(network, kernels, buckets):
        if kernel.kernel == ALLREDUCE and posted > handed_over:
            taken[handed_over:posted] = handed[handed_over:posted]
            work = sum(handed[handed_over:posted])
            extra[kernel.key] = max(0.0, work - waits.get(_reduction_key(kernel), 0.0))
            handed_over = posted
    return [replace(k, seconds=k.seconds + extra[k.key]) if k.key in extra else k for k in kernels], taken


def _with_posts(network: Network, kernels: list[PredictedKernel],
                buckets: Sequence[Bucket]) -> Iterator[tuple[PredictedKernel, int]]:
    """The BP kernels in the order a rank runs them (:func:`_backward_order`), each with how
    many of ``buckets`` are posted before it: a bucket is ready, and the trainer posts it,
    once backward is done with its first layer."""
    ready = 0
    for kernel in _backward_order(network, kernels):
        while ready < len(buckets) and buckets[ready].first_layer > kernel.layer:
            ready += 1
        yield kernel, ready


def _backward_channel(network: Network, kernels: list[PredictedKernel], bucket_bytes: list[float], buckets: list,
                      bucket_seconds: list[float], machine: Machine, procs: int, slowest: SlowestRank,
                      between_calls: float) -> tuple[list[PredictedKernel], float]:
    """The slowest rank's backward walked in order beside the channel its bucket reductions
    share (``channel.py``): ``kernels`` with each batch-norm reduction of backward waiting for the buckets ahead of
    it on the channel and, where phases start inside calls, the CPU time of the data the
    link moved during each layer's backward (TRANSFER_CPU entries per layer: in COMM inside
    the tests, in BP in the kernels slowed) and the posts of the buckets (an ALLREDUCE_START
    entry in COMM each, as the trace has them, and an ALLREDUCE_PROGRESS entry each for
    the test right after its post and, where the pipeline starts a bucket's later
    collectives in tests, those starts); and what communication adds to backward: the
    posts, their tests and the starts, the tests' CPU time, and how long the buckets
    outlast it. A bucket is ready when backward is done with its first layer, and posted
    then, which takes the rank ``transfer_cost.post_seconds`` where phases start inside
    calls, ``transfer_cost.post_test_seconds`` for the test right after, and
    ``transfer_cost.start_seconds`` more for its later starts (counted there: the rank
    pays them in the tests of the same backward); an MPI call comes
    after every kernel, and ``between_calls`` seconds of the interpreter's work before the
    next (the step's time outside its kernels, shared over its calls), during which the
    link moves on too.

    The slowest rank's, because a bucket's reduction ends only once every rank has posted
    it: the buckets outlast that rank's backward, and the others wait for it besides (the
    step's last ``sync_wait``). Where the link is the bottleneck the buckets end when it
    has moved them all, and the wait for the slowest rank hides inside that; timed from
    the mean rank instead, the two were added (VGG11 over an emulated 1 Gbit/s link:
    predicted 140 ms of communication where 77 were measured)."""
    if not buckets:
        return kernels, 0.0
    cost = machine.transfer_cost  # derived from the calibration on every read: read once
    channel = Channel(bucket_bytes, bucket_seconds, procs, machine.starts_inside_calls, cost,
                      [machine.link_seconds(n, procs) for n in bucket_bytes], pipelined=machine.pipelines_in_tests)
    queued: dict[CallKey, float] = {}
    transfer_cpu: defaultdict[int, float] = defaultdict(float)
    clock, ready, previous_layer = slowest.delay, 0, network.loss_index
    post, tests = ((cost.post_seconds, cost.post_test_seconds + cost.start_seconds) if machine.starts_inside_calls
                   else (0.0, 0.0))
    posting = post + tests  # what a bucket's reduction takes the rank in the calls that start its collectives

    def charge_moved() -> None:
        """The previous kernel ran the longer for what the tests' phases moved meanwhile."""
        nonlocal clock
        cpu = channel.advance(clock)
        transfer_cpu[previous_layer] += cpu
        clock += cpu

    for kernel, posted in _with_posts(network, kernels, buckets):
        clock += posting * (posted - ready)  # the layers after this kernel's are done: the trainer posts their buckets
        ready = posted
        charge_moved()
        if kernel.kernel == ALLREDUCE:  # a blocking reduction goes out behind the ready buckets (Channel.block)
            done = channel.block(clock, ready)
            if done > clock:
                queued[kernel.key] = done - clock
                clock = done
        else:
            channel.call(ready)  # the test after the previous kernel
            clock += between_calls
        clock += slowest.seconds.get(kernel.key, kernel.seconds)
        previous_layer = kernel.layer
    charge_moved()
    clock += posting * (len(buckets) - ready)  # the buckets of the first layers, posted as backward ends
    done = channel.finish(clock, len(buckets))  # the wait for every bucket at the end of backward
    waited = [replace(k, seconds=k.seconds + queued[k.key]) if k.key in queued else k for k in kernels]
    names = {k.layer: k.layer_name for k in kernels}
    for stage, share in ((Stage.COMM, cost.in_tests), (Stage.BP, 1.0 - cost.in_tests)):
        waited += [PredictedKernel(layer, names.get(layer, ""), stage, TRANSFER_CPU, 0, seconds * share, 0.0, 0.0)
                   for layer, seconds in transfer_cpu.items() if seconds * share > 0]
    if post > 0:
        waited += [PredictedKernel(NO_LAYER, "", Stage.COMM, ALLREDUCE_START, i, post, 0.0, n)
                   for i, n in enumerate(bucket_bytes)]
    if tests > 0:
        waited += [PredictedKernel(NO_LAYER, "", Stage.COMM, ALLREDUCE_PROGRESS, i, tests, 0.0, 0.0)
                   for i in range(len(bucket_bytes))]
    return waited, max(0.0, done - clock) + posting * len(buckets) + cost.in_tests * sum(transfer_cpu.values())


def _updates_in_cache(kernels: list[PredictedKernel], machine: Machine, optimizer: Optimizer,
                      since_step: tuple[float, float], gradient_bytes: float,
                      outside_per_call: float) -> list[PredictedKernel]:
    """``kernels`` with each update's evicted time scaled by its cache-residency factor, its
    bytes in two ages. The optimizer's state was last used by the previous step's update
    (``since_step``: the step's bytes and seconds); the parameter and the gradient by the
    layer's last forward or backward kernel, and the gradient by its reduction too (each
    rank moves ``gradient_bytes`` for those): for the first layers, whose backward comes
    last, right before their updates (the ages count ``outside_per_call`` after each call).
    Each part takes the ratio of its age, weighted by its share of the update's bytes
    (``Optimizer.state_byte_share``)."""
    state_share = optimizer.state_byte_share
    moved = seconds = 0.0  # by the step's calls so far
    at_last_use: dict[int, tuple[float, float]] = {}
    factors: dict[CallKey, float] = {}
    for kernel in _run_order(kernels, (Stage.FP, Stage.BP, Stage.WU)):
        if kernel.kernel == optimizer.kernel:
            nbytes = kernel.bytes / optimizer.arrays_touched  # the gradient's
            stale = machine.cache_factor(kernel.kernel, nbytes, *since_step)
            fresh = stale
            if kernel.layer in at_last_use:
                moved_then, seconds_then = at_last_use[kernel.layer]
                fresh = machine.cache_factor(kernel.kernel, nbytes, moved - moved_then + kernel.bytes + gradient_bytes,
                                             seconds - seconds_then)
            factors[kernel.key] = state_share * stale + (1.0 - state_share) * fresh
        moved += kernel.bytes
        seconds += kernel.seconds + outside_per_call
        if kernel.stage != Stage.WU:
            at_last_use[kernel.layer] = (moved, seconds)
    return [replace(k, seconds=k.seconds * factors[k.key]) if k.key in factors else k for k in kernels]


def _bucket_reuse(network: Network, costs: Sequence[tuple[int, KernelCost]], call_seconds: Sequence[float],
                  buckets: Sequence[Bucket], itemsize: int) -> list[tuple[float, float]]:
    """For each bucket, the bytes a rank moves and the seconds it takes from the start of the
    backward of the bucket's last layer, as backward begins to write its gradient, to its
    reduction right after its first layer's (the trainer tests after every kernel): those
    layers' BP kernels, and the bucket's own bytes."""
    moved: defaultdict[int, float] = defaultdict(float)
    seconds: defaultdict[int, float] = defaultdict(float)
    for (layer, cost), call in zip(costs, call_seconds, strict=True):
        if cost.stage == Stage.BP and cost.kernel != ALLREDUCE:
            moved[layer] += cost.bytes
            seconds[layer] += call
    reuse = []
    for bucket in buckets:
        last = max(s.layer for s in network.segments if s.start < bucket.stop and s.stop > bucket.start)
        layers = range(bucket.first_layer, last + 1)
        reuse.append((sum(moved[layer] for layer in layers) + bucket.size * itemsize,
                      sum(seconds[layer] for layer in layers)))
    return reuse


def _reuse_after_accumulation(costs: Sequence[tuple[int, KernelCost]], call_seconds: Sequence[float],
                              bucket_bytes: Sequence[float]) -> list[tuple[float, float]]:
    """:func:`_bucket_reuse` where the micro-batches' gradients were summed: the last sum
    wrote every bucket right before the reductions, which then run one after the other, so
    each bucket's data has seen that sum's bytes and the buckets reduced before it."""
    last = max(position for position, (_, cost) in enumerate(costs) if cost.kernel == ACCUMULATE_GRADIENTS)
    summed, seconds = costs[last][1].bytes, call_seconds[last]
    return [(summed + sum(bucket_bytes[:i + 1]), seconds) for i in range(len(bucket_bytes))]


def _unhidden_bucket_seconds(machine: Machine, bucket_bytes: list[float], in_cache: list[float], procs: int) -> float:
    """What the bucket reductions add to the step where they move data only on the computing
    cores: each bucket but the last runs while backward goes on (on this or other ranks) and
    costs what it takes from the cores; the last starts after the last backward and costs
    its duration; each scaled by ``in_cache``, its factor for its data's residency."""
    if not bucket_bytes:
        return 0.0
    return (sum(machine.allreduce_during_compute_seconds(n, procs) * factor
                for n, factor in zip(bucket_bytes[:-1], in_cache[:-1], strict=True))
            + machine.allreduce_seconds(bucket_bytes[-1], procs) * in_cache[-1])


def balanced_shares(network: Network, optimizer: Optimizer, global_batch: int, machines: Sequence[Machine],
                    bucket_mb: float = 4.0) -> tuple[list[int], list[StepPrediction]]:
    """Shares of ``global_batch`` for ranks on ``machines`` (one per rank, e.g. a CPU and a GPU
    calibration) that finish their computation together, and each rank's predicted step.

    A rank's speed is taken from its predicted compute time at an equal share; shares follow
    the speeds (largest-remainder rounding), as the trainer's balancer does with measured ones.
    """
    procs = len(machines)
    equal = max(1, global_batch // procs)
    speeds = []
    for machine in machines:
        compute = predict_step(network, optimizer, equal, 1, machine).step_without_overlap
        speeds.append(equal / compute if compute > 0 else 1.0)
    shares = partition(global_batch, speeds)
    return shares, [predict_step(network, optimizer, max(share, 1), procs, machine, bucket_mb)
                    for share, machine in zip(shares, machines, strict=True)]
