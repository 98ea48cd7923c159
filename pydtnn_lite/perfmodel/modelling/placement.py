"""Where a job's ranks run: ranks per node, cores per node, BLAS threads per rank.

A calibration measures each kernel with its own placement (on this machine: 2 ranks of
one BLAS thread on 2 cores). A job placed otherwise runs the same kernels at another
speed:

- **Time-sharing.** When a node's ranks times their threads exceed its cores, the
  operating system shares the cores out, and every kernel takes longer by that ratio.
  While some ranks wait for a bucket's reduction, the others' backward and the
  reductions' copies keep the cores busy, so the ratio holds for the whole compute, and
  a reduction overlapped with backward costs the step its CPU time on the rank's share
  of the cores rather than its duration (``machines.AdjustedMachine``).
- **Threads.** GEMM (BLAS) and the host's parallel loops (im2col, col2im, the Winograd
  transforms, batch norm, ReLU, the residual add (with its ReLU or without), the sum of an
  output's gradients in its ReLU's backward, pooling, the SGD and Adam updates, and
  concatenations from ``costs.THREADED_FROM_ELEMENTS``: ``kernels/cpu.py``,
  ``kernels/winograd_cpu.py``) run on the rank's threads; the other kernels run on one
  (:func:`runs_threaded`). With more (or fewer) cores per rank than in the calibration, a
  threaded kernel scales by the ratio of the cores it gets, times what the calibration
  measured of that ratio (:class:`ThreadScaling`): one rank of two threads ran the
  memory-bound loops at about half the speed the ratio says. On several threads each
  parallel loop's call also pays the pool's hand-off (:func:`kernel_handoff`), which a
  one-thread rank, calling its loops in place, does not.

- **Background threads.** A rank that reads its batches ahead does so on a thread of its
  own. Where the node has a core to spare for it, that work is hidden from the step;
  where every core already runs a rank's thread, it takes its time from them.

Collectives are not scaled: the calibration times Allreduce at every process count it
can start on the node, oversubscribed ones included, and a prediction reads the counts
it measured.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from pydtnn_lite.costs import GEMM, THREADED_FROM_ELEMENTS

SHAPE_NEIGHBOURS = 5  # measured GEMM shapes whose median ratio a shape takes

# Kernels that run on all of the rank's threads (BLAS's, and the same number of Numba's).
THREADED_KERNELS = frozenset({GEMM, "im2col", "col2im", "batchnorm_sums", "batchnorm_normalize",
                              "batchnorm_grad_sums", "batchnorm_grad_input", "batchnorm_relu_normalize",
                              "batchnorm_relu_grad_sums", "batchnorm_relu_grad_input", "relu", "relu_grad", "add",
                              "maxpool", "maxpool_grad", "avgpool", "avgpool_grad", "sgd_update",
                              "adam_update", "winograd_filter", "winograd_filter_grad", "winograd_input",
                              "winograd_output", "winograd_output_grad", "winograd_input_grad",
                              "relu_grad_sum", "add_relu", "concat"})


def runs_threaded(kernel: str, dims: tuple = ()) -> bool:
    """Whether a call of ``kernel`` over ``dims`` runs on the rank's threads: a threaded
    kernel, at least as large as :data:`~pydtnn_lite.costs.THREADED_FROM_ELEMENTS` asks."""
    return kernel in THREADED_KERNELS and (not dims or dims[0] >= THREADED_FROM_ELEMENTS.get(kernel, 0))


@dataclass(frozen=True)
class ThreadScaling:
    """How far threads fall short of the cores they add, as a calibration measured it.

    One rank ran a node's whole work on ``threads`` threads (one per core) while the other
    ranks waited idly; before it, every rank ran its share (1 / ``threads`` of the work) on
    one thread, all at once, as the calibration's ranks run their kernels. ``gemm`` and
    ``memory`` are the first time over the second for a GEMM and for the memory-bound
    parallel loops (less their hand-offs): 1 where threads scale with the cores they get.
    ``handoff`` is the seconds a parallel loop's call costs on ``threads`` threads beyond its
    work, whatever its size: Numba's pool wakes its workers and the caller sleeps until they
    end (about 0.1 ms on the development machine, where a ReLU of 64 KB takes 6 us in place).
    None in files from before it was measured. ``gemm_shapes`` is ``gemm``'s ratio for each
    GEMM shape the calibration sampled (its ``dims``), timed the same way: small products
    gain little from a second thread (36 products of 128 x 128 x 256, a Winograd layer's,
    took 0.138 ms a call on one thread and 0.117 on two), large ones all of it. Empty in
    files from before it was measured, which use ``gemm`` for every shape."""

    threads: int
    gemm: float
    memory: float
    handoff: float | None = None
    gemm_shapes: dict[tuple[int, ...], float] = field(default_factory=dict)
    _nearest: dict[tuple, float] = field(default_factory=dict, init=False, compare=False, repr=False)  # by dims

    def factor(self, kernel: str, threads: int, dims: tuple = ()) -> float:
        """The shortfall at ``threads`` threads per rank: none at one, the measured one at
        :attr:`threads`, in proportion between (held beyond). A GEMM's is that of the
        measured shapes nearest ``dims`` (:meth:`gemm_shape_ratio`) where there are any."""
        if self.threads <= 1:
            return 1.0
        measured = (self.gemm_shape_ratio(dims) if kernel == GEMM and self.gemm_shapes and len(dims) == 5
                    else self.gemm if kernel == GEMM else self.memory)
        return 1.0 + (measured - 1.0) * min(1.0, (threads - 1) / (self.threads - 1))

    def gemm_shape_ratio(self, dims: tuple) -> float:
        """The median ratio of the :data:`SHAPE_NEIGHBOURS` measured GEMM shapes nearest
        ``dims`` (rows, columns, depth and the two transpose flags): nearest by the sizes'
        logarithms, a transpose flag that differs counting as a factor of two in one size.
        Each shape is timed for milliseconds, so a single one moves with the machine."""
        if dims not in self._nearest:
            log_sizes, flags, ratios = self._shape_table
            differences = log_sizes - np.array([math.log2(size) for size in dims[:3]])
            squares = differences * differences
            # Summed in the order of a sum over the three sizes, so that ties fall as they would.
            distances = squares[:, 0] + squares[:, 1] + squares[:, 2] + (flags != np.array(dims[3:])).sum(axis=1)
            nearest = np.argsort(distances, kind="stable")[:SHAPE_NEIGHBOURS]  # the first of equals, in order
            self._nearest[dims] = statistics.median(ratios[nearest].tolist())
        return self._nearest[dims]

    @functools.cached_property
    def _shape_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The measured GEMM shapes as arrays, in their order: log2 of the three sizes, the
        two transpose flags, and the ratios (a prediction of DenseNet121 looks up hundreds of
        shapes among thousands)."""
        shapes = list(self.gemm_shapes)
        log_sizes = np.array([[math.log2(size) for size in shape[:3]] for shape in shapes]).reshape(-1, 3)
        flags = np.array([shape[3:] for shape in shapes]).reshape(len(shapes), -1)
        return log_sizes, flags, np.array(list(self.gemm_shapes.values()))

    def handoff_seconds(self, kernel: str, threads: int, dims: tuple = ()) -> float:
        """What a call of ``kernel`` over ``dims`` costs on ``threads`` threads beyond its work:
        a parallel loop's hand-off to the pool; none on one thread (the loop runs in place) nor
        for GEMM (OpenBLAS's threads are its own, and its samples hold them)."""
        if threads <= 1 or kernel == GEMM or not runs_threaded(kernel, dims) or self.handoff is None:
            return 0.0
        return self.handoff

    def to_dict(self) -> dict:
        return {"threads": self.threads, "gemm": self.gemm, "memory": self.memory, "handoff": self.handoff,
                "gemm_shapes": [[*dims, ratio] for dims, ratio in sorted(self.gemm_shapes.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> ThreadScaling:
        handoff = data.get("handoff")
        shapes = {tuple(int(d) for d in row[:-1]): float(row[-1]) for row in data.get("gemm_shapes") or []}
        return cls(int(data["threads"]), float(data["gemm"]), float(data["memory"]),
                   None if handoff is None else float(handoff), shapes)


@dataclass(frozen=True)
class Placement:
    """``ranks`` in all, ``ranks_per_node`` on each node of ``cores_per_node`` cores, each
    rank running ``threads_per_rank`` BLAS threads."""

    ranks: int
    ranks_per_node: int
    cores_per_node: int
    threads_per_rank: int = 1

    def __post_init__(self) -> None:
        if min(self.ranks, self.ranks_per_node, self.cores_per_node, self.threads_per_rank) < 1:
            raise ValueError(f"a placement needs at least one rank, core and thread: {self}")
        if self.ranks_per_node > self.ranks:
            raise ValueError(f"{self.ranks_per_node} ranks per node but {self.ranks} in all")

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_node)

    @property
    def time_sharing(self) -> float:
        """How many of the node's threads share each core (1 when every thread has a core of its own)."""
        return max(1.0, self.ranks_per_node * self.threads_per_rank / self.cores_per_node)

    @property
    def oversubscribed(self) -> bool:
        return self.time_sharing > 1.0

    @property
    def background_share(self) -> float:
        """The share of a rank's background thread's work (reading batches ahead) that its step
        waits for: the share of the node's background threads that find no idle core (the
        work itself is time-shared as the rank's own kernels are)."""
        busy = self.ranks_per_node * self.threads_per_rank
        return min(1.0, max(0.0, (busy + self.ranks_per_node - self.cores_per_node) / self.ranks_per_node))

    @property
    def blas_cores(self) -> float:
        """The cores a rank's threaded kernels run on: its threads, each with its share of a core."""
        return self.threads_per_rank / self.time_sharing

    def describe(self) -> str:
        shared = f", {self.time_sharing:.2g} threads per core" if self.oversubscribed else ""
        return (f"{self.ranks} rank(s) on {self.nodes} node(s) of {self.cores_per_node} cores, "
                f"{self.ranks_per_node} per node, {self.threads_per_rank} BLAS thread(s) each{shared}")


def kernel_scale(kernel: str, job: Placement, calibrated: Placement,
                 scaling: ThreadScaling | None = None, dims: tuple = ()) -> float:
    """How many times longer ``kernel`` runs on a rank of ``job`` than it did in the calibration,
    threaded kernels by the calibration's ``scaling`` where it measured one (linearly without).

    A calibration's samples are medians of its probes' calls, most of them shorter than the
    scheduler's time slice: where its ranks outnumbered the cores (a calibration under an
    emulated cluster of 2 nodes x 2 ranks on 2 cores), its kernels still ran as if on cores
    of their own, and a job time-shares them by its own placement only."""
    if not runs_threaded(kernel, dims):
        return job.time_sharing
    scale = calibrated.threads_per_rank / job.blas_cores
    if scaling is not None:
        scale *= (scaling.factor(kernel, job.threads_per_rank, dims)
                  / scaling.factor(kernel, calibrated.threads_per_rank, dims))
    return scale


def kernel_handoff(kernel: str, job: Placement, calibrated: Placement, scaling: ThreadScaling | None,
                   dims: tuple = ()) -> float:
    """The seconds a call of ``kernel`` over ``dims`` on a rank of ``job`` adds to its scaled time
    (:func:`kernel_scale`): the parallel loops' hand-offs, which a calibration's one-thread
    ranks (the only ones that measure ``scaling``) never paid. Where threads share cores,
    each wake-up waits its turn as the work does."""
    if scaling is None or calibrated.threads_per_rank > 1:
        return 0.0
    return scaling.handoff_seconds(kernel, job.threads_per_rank, dims) * job.time_sharing


def thread_scaling_gap(job: Placement, calibrated: Placement, scaling: ThreadScaling | None) -> str | None:
    """One line for the user where ``job``'s ranks run more threads than the calibration's
    and the calibration lacks what predicts them (a file from an older version), else None.
    Without any measure of thread scaling, one process of two threads came out 22-44 % short
    across the zoo on the development machine; with one GEMM ratio for every shape and no
    hand-offs, about 14 % (docs/performance-model.md)."""
    if job.threads_per_rank <= calibrated.threads_per_rank:
        return None
    if scaling is None:
        return (f"the calibration holds no measure of how threads scale: ranks of {job.threads_per_rank} threads are "
                "predicted as if every thread added a whole core, which predicts them short; calibrate again "
                "with this version")
    if scaling.handoff is None or not scaling.gemm_shapes:
        return (f"the calibration predates the timing of each GEMM shape and of a parallel loop's hand-off on "
                f"several threads: ranks of {job.threads_per_rank} threads are predicted with one GEMM ratio for "
                "every shape; calibrate again with this version")
    return None
