"""What every layer is: parameters, gradients, forward, backward and kernel costs."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost, Stage

Shape = tuple  # per-sample shape, NHWC without N: (H, W, C) or (features,)


def _identity(array: Any) -> Any:
    return array


@dataclass
class StepContext:
    """What a layer may need to know about the step it runs in.

    ``seed`` is the run's seed; ``global_batch`` and ``sample_offset`` place this rank's rows inside the global batch
    (dropout draws its mask for the global batch and keeps its own rows, so P ranks draw
    what one rank would); ``sum_across_ranks`` adds an array over all ranks (batch-norm
    statistics) and is the identity in a single process.
    """

    training: bool
    global_batch: int
    sample_offset: int = 0
    step: int = 0
    seed: int = 0
    sum_across_ranks: Callable[[Any], Any] = field(default=_identity)


def bias_costs(rows: int, channels: int, itemsize: int) -> tuple[KernelCost, KernelCost]:
    """The forward ``bias_add`` and backward ``bias_grad`` of a per-channel bias over ``rows``."""
    elements = rows * channels
    return (KernelCost(Stage.FP, "bias_add", elements, 2 * elements * itemsize, (rows, channels)),
            KernelCost(Stage.BP, "bias_grad", elements, (elements + channels) * itemsize, (rows, channels)))


def gradient_sum_cost(n: int, itemsize: int) -> KernelCost:
    """The backward ``add`` of two gradients of ``n`` elements, where a layer's output feeds two layers."""
    return KernelCost(Stage.BP, "add", n, 3 * n * itemsize, (n,))


def gemm_layer_costs(m: int, n: int, k: int, itemsize: int, use_bias: bool,
                     needs_input_grad: bool) -> tuple[list[KernelCost], list[KernelCost]]:
    """(FP, BP) costs of a layer computed as ``(m x k) @ (k x n)`` plus a bias: the forward
    GEMM and bias, the weight-gradient GEMM and bias gradient, and the input-gradient GEMM.

    A GEMM's dims are (rows, columns, inner size, A transposed, B transposed): BLAS runs
    a product of the same sizes at different speeds depending on which operand it reads
    transposed, and the weight gradient (x^T dy) and input gradient (dy W^T) read one each.
    """
    gemm_bytes = (m * k + k * n + m * n) * itemsize
    forward = [KernelCost(Stage.FP, "gemm", 2.0 * m * n * k, gemm_bytes, (m, n, k, 0, 0))]
    backward = [KernelCost(Stage.BP, "gemm", 2.0 * m * n * k, gemm_bytes, (k, n, m, 1, 0))]
    if use_bias:
        bias_add, bias_grad = bias_costs(m, n, itemsize)
        forward.append(bias_add)
        backward.append(bias_grad)
    if needs_input_grad:
        backward.append(KernelCost(Stage.BP, "gemm", 2.0 * m * n * k, gemm_bytes, (m, k, n, 0, 1)))
    return forward, backward


class Layer:
    """Base class. Subclasses set ``kind`` and implement build, forward, backward, costs.

    Parameters and their gradients live in ``params`` and ``grads`` (same names, same
    shapes). Backward writes gradients *into* ``grads`` arrays, never rebinding them: the
    network may make them views of one flat buffer that the Allreduce sends as is.
    """

    kind = "layer"
    # Whether the layer has :meth:`backward_summing`: where its input feeds several layers,
    # the sum of their gradients in the pass that writes its own, instead of a separate add.
    sums_input_grads = False
    # Whether the layer has :meth:`backward_of_sum`: where its output feeds several layers, the
    # sum of their gradients in the pass of its own backward, instead of a separate add.
    sums_output_grads = False

    def __init__(self) -> None:
        self.name = self.kind  # made unique ("conv3") by the network
        self.index = 0  # position in the network, set by the network
        self.params: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        self.buffers: dict[str, Any] = {}  # state that is saved but not trained (BN running stats)
        self.input_shapes: list[Shape] = []
        self.output_shape: Shape = ()
        self.needs_input_grad = True
        # Set by the network where ``sums_input_grads`` and the input has a gradient from a later
        # consumer when this layer's backward runs: the network calls backward_summing then.
        self.adds_input_grad = False
        # Set by the network where ``sums_output_grads``: how many gradients of its output
        # backward_of_sum receives (one per consumer that has one).
        self.output_grad_terms = 1
        self.itemsize = 4

    def build(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        """Create parameters for ``input_shapes`` and return the per-sample output shape."""
        self.input_shapes = list(input_shapes)
        self.itemsize = np.dtype(backend.dtype).itemsize
        self.output_shape = self.init(input_shapes, backend, rng)
        for name, value in self.params.items():
            self.grads[name] = backend.xp.zeros_like(value)
        return self.output_shape

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        """Subclass hook: make parameters, return the output shape (default: shape unchanged)."""
        return tuple(input_shapes[0])

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Return the output of one input array per source, the step's :class:`StepContext`
        passed as keyword ``ctx``. Subclasses name their inputs (``forward(self, x, ctx)``):
        the ``*inputs, **kwargs`` signature lets each take the number it has."""
        raise NotImplementedError

    def backward(self, grad_out: Any) -> Any:
        """Return the gradient for the input (a list for multi-input layers); None if not needed."""
        raise NotImplementedError

    def backward_summing(self, grad_out: Any, addend: Any) -> Any:
        """:meth:`backward`, with ``addend`` (the gradient the input has from its later
        consumers) added to the input gradient as it is written; where ``sums_input_grads``."""
        raise NotImplementedError

    def backward_of_sum(self, grad_outs: list) -> Any:
        """:meth:`backward` of the sum of ``grad_outs``, the gradients of the layer's output
        from its several consumers, summed as the input gradient is written; where
        ``sums_output_grads``."""
        raise NotImplementedError

    def costs(self, batch: int) -> list[KernelCost]:
        """FLOPs and bytes of the FP and BP kernels for a batch of ``batch`` samples."""
        return []

    def direct_flops(self, batch: int, stage: Stage) -> float:
        """The FLOPs of ``stage`` for ``batch`` samples as the textbook computation counts
        them: the convention of published model sizes. A layer whose kernels do less work
        for the same result (a Winograd convolution) counts the textbook's; :meth:`costs`
        holds what its kernels do."""
        return sum(cost.flops for cost in self.costs(batch) if cost.stage == stage)

    @property
    def param_count(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.params.values())

    def describe(self) -> str:
        """Short hyper-parameter string for summaries."""
        return ""

    def elements(self, batch: int, shape: Shape | None = None) -> int:
        """Number of elements of a batch of tensors of ``shape`` (default: the output)."""
        return batch * int(np.prod(shape if shape is not None else self.output_shape))
