"""The analytic kernel list of one training step: every layer, the loss and the update, and the batch's copy.

It depends only on the model's shapes, so the tracer, the calibration's sampling and
the performance model's prediction all read the same list, and none of them needs the
trainer to build it. A step that accumulates gradients (``--accumulate K``) runs forward
and backward K times, on micro-batches, and keeps their gradients' running sum.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pydtnn_lite.costs import H2D_COPY, NO_LAYER, KernelCost, Stage, fused_cost
from pydtnn_lite.layers import SoftmaxCrossEntropy
from pydtnn_lite.layers.base import gradient_sum_cost
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer

HOST_ITEMSIZE = 4  # data sets load float32 images, whatever the device's dtype
# The kernels that sum a step's micro-batch gradients: a copy of the first's, then adds.
START_GRADIENT_SUM, ACCUMULATE_GRADIENTS = "start_gradient_sum", "accumulate_gradients"
GRADIENT_NORM, SCALE_GRADIENT = "gradient_norm", "scale_gradient"  # the kernels that clip the gradient


def step_costs(network: Network, optimizer: Optimizer, batch: int, accumulate: int = 1,
               clip: bool = False) -> list[tuple[int, KernelCost]]:
    """(layer index, cost) of every kernel a rank runs in a training step on ``batch`` samples,
    or on ``accumulate`` micro-batches of ``batch`` samples each, in the order the step runs
    them within each (layer, stage); with ``clip``, the step clips the gradient by its norm
    (``--clip-grad-norm``).

    The loss is layer ``network.loss_index``; the WU kernels come last: the clipping's, then
    the optimizer's.
    """
    return [(layer, cost) for _, layer, cost in micro_batch_entries(network, optimizer, batch, accumulate, clip)]


def micro_batch_entries(network: Network, optimizer: Optimizer, batch: int, accumulate: int = 1,
                        clip: bool = False) -> list[tuple[int, int, KernelCost]]:
    """:func:`step_costs` with the micro-batch each call runs for: (micro-batch, layer index,
    cost); the update's are micro-batch 0's."""
    itemsize = np.dtype(network.backend.dtype).itemsize
    clipping = clipping_costs(network.param_count, itemsize) if clip else []
    update = [(NO_LAYER, cost) for cost in clipping] + optimizer.costs()
    return ([(index, layer, cost) for index in range(accumulate)
             for layer, cost in micro_batch_costs(network, batch, accumulate, index)]
            + [(0, layer, cost) for layer, cost in update])


def clipping_costs(elements: int, itemsize: int) -> list[KernelCost]:
    """The costs of clipping a reduced gradient of ``elements`` by its norm (in WU): one read
    for the norm, then a read and a write to scale it (by 1 where it is no longer than the
    limit)."""
    return [gradient_pass_cost(GRADIENT_NORM, elements, itemsize, Stage.WU, flops=2, arrays=1),
            gradient_pass_cost(SCALE_GRADIENT, elements, itemsize, Stage.WU, flops=1, arrays=2)]


def accumulation_cost(elements: int, itemsize: int, first: bool) -> KernelCost:
    """The cost of adding a micro-batch's gradient of ``elements`` to the step's running sum
    (in BP), or with ``first`` of starting the sum with a copy of it."""
    if first:
        return gradient_pass_cost(START_GRADIENT_SUM, elements, itemsize, Stage.BP, flops=0, arrays=2)
    return gradient_pass_cost(ACCUMULATE_GRADIENTS, elements, itemsize, Stage.BP, flops=1, arrays=3)


def gradient_pass_cost(kernel: str, elements: int, itemsize: int, stage: Stage, flops: int,
                       arrays: int) -> KernelCost:
    """The cost of ``kernel``, a pass over a whole gradient of ``elements`` of ``flops`` an
    element that reads or writes ``arrays`` arrays as long. Calibrations time these passes
    (:mod:`~pydtnn_lite.perfmodel.measuring.gradient_passes`); one that did not predicts them
    from its add of two such gradients (``costs.PREDICTED_FROM``)."""
    return fused_cost(kernel, float(flops * elements), arrays * elements * itemsize, (elements,),
                      [gradient_sum_cost(elements, itemsize)], stage)


def micro_batch_costs(network: Network, batch: int, accumulate: int = 1, index: int = 0
                      ) -> list[tuple[int, KernelCost]]:
    """(layer index, cost) of micro-batch ``index`` of ``accumulate`` in a step: forward
    and backward of every layer and the loss on ``batch`` samples, and where the step
    accumulates, the sum of the gradients after backward (no layer's, in BP): the first
    micro-batch's copied to start it, each later one's added."""
    itemsize = np.dtype(network.backend.dtype).itemsize
    loss = [(network.loss_index, cost)
            for cost in SoftmaxCrossEntropy.costs(batch, network.num_classes, itemsize)]
    costs = network.costs(batch) + loss
    if accumulate > 1:  # a copy to start the sum, an add after that
        costs.append((NO_LAYER, accumulation_cost(network.param_count, itemsize, first=index == 0)))
    return costs


def h2d_copy_cost(batch: int, input_shape: Sequence[int]) -> KernelCost:
    """Cost of copying a batch of float32 images to the device: dims (batch, elements per sample)."""
    per_sample = int(np.prod(input_shape))
    return KernelCost(Stage.DATA, H2D_COPY, 0, batch * per_sample * HOST_ITEMSIZE, (batch, per_sample))
