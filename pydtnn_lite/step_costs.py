"""The analytic kernel list of one training step: every layer, the loss and the update, and the batch's copy.

It depends only on the model's shapes, so the tracer, the calibration's sampling and
the performance model's prediction all read the same list, and none of them needs the
trainer to build it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pydtnn_lite.costs import H2D_COPY, KernelCost, Stage
from pydtnn_lite.layers import SoftmaxCrossEntropy
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer

HOST_ITEMSIZE = 4  # data sets load float32 images, whatever the device's dtype


def step_costs(network: Network, optimizer: Optimizer, batch: int) -> list[tuple[int, KernelCost]]:
    """(layer index, cost) of every kernel a rank runs in a training step on ``batch`` samples,
    in the order the step runs them within each (layer, stage).

    The loss is layer ``network.loss_index``; the optimizer's WU kernels come last.
    """
    itemsize = np.dtype(network.backend.dtype).itemsize
    loss = [(network.loss_index, cost)
            for cost in SoftmaxCrossEntropy.costs(batch, network.num_classes, itemsize)]
    return network.costs(batch) + loss + optimizer.costs()


def h2d_copy_cost(batch: int, input_shape: Sequence[int]) -> KernelCost:
    """Cost of copying a batch of float32 images to the device: dims (batch, elements per sample)."""
    per_sample = int(np.prod(input_shape))
    return KernelCost(Stage.DATA, H2D_COPY, 0, batch * per_sample * HOST_ITEMSIZE, (batch, per_sample))
