"""What a kernel call costs, and the key that pairs a call with its cost.

The stages of a training step and the names of the work that is not a function of
:mod:`pydtnn_lite.kernels` are written here once; traces on disk hold their string values.
Layers and the optimizer list a step's calls as :class:`KernelCost` entries, in the order
they make them, and the tracer records the calls it times in the same order. So the
i-th call of a kernel by a layer in a stage, traced, sampled or predicted, is the i-th
cost listed for that (layer, stage, kernel): :class:`CallKey` is that key and
:class:`CallCounter` numbers the calls of a step by it. The fused kernels are named here
too, with the unfused kernels they replace (:data:`FUSED_KERNELS`), and the kernels whose
code changed their time since their first version (:data:`KERNEL_REVISIONS`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


class Stage(str, Enum):
    """Where in a training step work runs. A ``str``: a stage equals, and is written as, its value."""

    FP = "FP"  # forward
    BP = "BP"  # backward
    WU = "WU"  # weight update
    COMM = "COMM"  # gradient and loss reductions, outside any layer
    DATA = "DATA"  # loading a batch and copying it to the device

    def __str__(self) -> str:
        return self.value


COMPUTE_STAGES = (Stage.FP, Stage.BP, Stage.WU)

GEMM = "gemm"  # a matrix product: convolutions' and dense layers' compute-bound kernel
ALLREDUCE = "allreduce"  # a blocking sum over the ranks (batch-norm statistics, gradient buckets, the loss)
SYNC_WAIT = "sync_wait"  # the wait for the slowest rank at the end of a step (predicted, never traced)
# The computing rank's CPU time for moving overlapped buckets over a network (predicted, never
# traced): in COMM for the part inside its tests, which the trace holds, in BP for the kernels it slows.
TRANSFER_CPU = "transfer_cpu"
ALLREDUCE_START = "allreduce_start"  # posting an overlapped bucket's reduction
ALLREDUCE_PROGRESS = "allreduce_progress"  # testing the outstanding buckets, after a kernel or a layer of backward
ALLREDUCE_WAIT = "allreduce_wait"  # waiting for the outstanding buckets as backward ends
# The overlapped buckets' calls count in COMM wherever they run, as the model predicts them:
# they are what communication adds to the step, even made between two kernels of backward.
BUCKET_CALLS = frozenset({ALLREDUCE_START, ALLREDUCE_PROGRESS, ALLREDUCE_WAIT})
H2D_COPY = "h2d_copy"  # the copy of a batch to the device
DATA_LOAD = "data_load"  # reading a batch from the data set
NO_LAYER = -1  # the layer of work done for no layer: gradient buckets, the loss reduction, data loading


@dataclass(frozen=True)
class KernelCost:
    """Analytic cost of one kernel call: the stage it runs in, its FLOPs and bytes moved.

    ``kernel`` is the name of the function in :mod:`pydtnn_lite.kernels` that the call
    runs (or :data:`ALLREDUCE` for a reduction over the ranks), and a layer lists its
    costs in the order it makes its calls, so a traced call and its cost share a
    :class:`CallKey`.

    ``dims`` are the operand sizes a performance model keys on, e.g. (m, n, k) for a GEMM.
    ``cold_start`` marks the first of a run of calls of one kernel that follows other work
    (the optimizer's first update after the gradient wait): it pays the processor's return
    to that code, tens of microseconds here, which the later calls of the run do not.
    """

    stage: Stage
    kernel: str
    flops: float
    bytes: float
    dims: tuple = ()
    replaces: tuple[KernelCost, ...] = ()  # a fused kernel's unfused calls (see FUSED_KERNELS)
    cold_start: bool = False


# The fused kernels, each with the unfused kernels whose calls it replaces, in their order.
# A calibration without samples of a fused kernel predicts it from these (see
# Calibration.kernel_seconds); the ReLU gradient is folded into both backward kernels but
# its call is counted once, in the sums.
FUSED_KERNELS: dict[str, tuple[str, ...]] = {
    "batchnorm_relu_normalize": ("batchnorm_normalize", "relu"),
    "batchnorm_relu_grad_sums": ("relu_grad", "batchnorm_grad_sums"),
    "batchnorm_relu_grad_input": ("batchnorm_grad_input",),
    # The sums of an output's gradients from its consumers (one add fewer than terms) and
    # the ReLU gradient of the total.
    "relu_grad_sum": ("add", "relu_grad"),
    "add_relu": ("add", "relu"),  # a residual block's sum and the ReLU after it
}

# The kernels a calibration without samples of their own predicts from the models of others
# (``KernelCost.replaces``, see Calibration.kernel_seconds): the fused kernels from the
# unfused ones, and the passes over the whole gradient (calibrations from 2026-12-07 time
# them) from the add of two gradients as long, scaled by their bytes: the sum of a step's
# micro-batch gradients (``--accumulate``: a copy to start it, then adds) and the clipping's
# norm and scaling (``--clip-grad-norm``).
PREDICTED_FROM: dict[str, tuple[str, ...]] = {
    **FUSED_KERNELS, "start_gradient_sum": ("add",), "accumulate_gradients": ("add",), "gradient_norm": ("add",),
    "scale_gradient": ("add",)}


# Kernels that run on the rank's threads only from this many elements (their ``dims[0]``):
# below, they copy on one thread, as the pool's hand-off costs more than a second thread
# saves on data that fits in the cache. The host's kernels and the performance model read it.
THREADED_FROM_ELEMENTS: dict[str, int] = {"concat": 1 << 21}

# A kernel's revision, raised when a change to its code moves its time; kernels not named
# here are at revision 1. A calibration records the revisions it timed: merging keeps each
# kernel's samples from the files that timed its newest revision, and a prediction warns
# where its calibration timed an older one.
KERNEL_REVISIONS: dict[str, int] = {
    # 2: copied by every thread, not by NumPy on one; 3: each output row written once; 4: a
    # dense block's joins write their new channels alone into the block's shared buffer.
    "concat": 4,
    "batchnorm_sums": 2,  # one read of memory, deviations from each block's first row summed in float32 runs
    # The batch-norm loops read their inputs flat by row strides (2-D indexing left channel
    # slices unvectorised); the input gradient may add the input's other gradients in.
    "batchnorm_normalize": 2,
    "batchnorm_relu_normalize": 2,
    # The gradient's sums, 3 (with the ReLU 4): runs of rows summed in the input's precision,
    # the runs' sums in float64 (the ReLU's 2: its mask computed from the input, not read).
    "batchnorm_grad_sums": 3,
    "batchnorm_grad_input": 2,
    "batchnorm_relu_grad_sums": 4,
    "batchnorm_relu_grad_input": 3,
    "gemm": 2,  # Winograd's 36 products on contiguous, point-major matrices
    "winograd_input": 2,  # point-major tiles, written a point at a time
    "winograd_output": 2,
    "winograd_output_grad": 2,
    "winograd_input_grad": 2,  # and each row of the gradient written once, not zeroed and added to
    "maxpool_grad": 2,  # windows that tile a map of 8 or more channels: a gather, each input element written once
}


def fused_cost(kernel: str, flops: float, nbytes: float, dims: tuple, replaces: list[KernelCost],
               stage: Stage | None = None) -> KernelCost:
    """The cost of a call of ``kernel`` (a key of :data:`PREDICTED_FROM`: a fused kernel, say)
    in ``stage``, by default that of the calls it ``replaces``, which must be calls of the
    kernels its entry names, in that order (a kernel's calls together, as many as the call
    replaces)."""
    assert tuple(dict.fromkeys(part.kernel for part in replaces)) == PREDICTED_FROM[kernel], (kernel, replaces)
    return KernelCost(stage or replaces[0].stage, kernel, flops, nbytes, dims, tuple(replaces))


class CallKey(NamedTuple):
    """One call of a step: the ``occurrence``-th call (from 0, in the order of the step) of
    ``kernel`` by layer ``layer`` in ``stage``."""

    layer: int
    stage: str
    kernel: str
    occurrence: int


class CallCounter:
    """Numbers the calls of one step: :meth:`key` gives each call its :class:`CallKey`, in
    the order the calls come. Use one counter per step (and per rank)."""

    def __init__(self) -> None:
        self._calls: Counter = Counter()

    def key(self, layer: int, stage: str, kernel: str) -> CallKey:
        """The key of the next call of ``kernel`` by ``layer`` in ``stage``."""
        occurrence = self._calls[(layer, stage, kernel)]
        self._calls[(layer, stage, kernel)] += 1
        return CallKey(layer, stage, kernel, occurrence)


def keyed_costs(costs: Iterable[tuple[int, KernelCost]]) -> dict[CallKey, KernelCost]:
    """The (layer, cost) entries of a step, listed in the order the step makes the calls,
    by the key of the call each describes."""
    counter = CallCounter()
    return {counter.key(layer, cost.stage, cost.kernel): cost for layer, cost in costs}
