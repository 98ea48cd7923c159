"""The analytic kernel list of one training step: every layer, the loss and the update."""
from __future__ import annotations

import numpy as np

from pydtnn_lite.costs import KernelCost
from pydtnn_lite.layers import SoftmaxCrossEntropy
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer


def step_costs(network: Network, optimizer: Optimizer, batch: int) -> list[tuple[int, KernelCost]]:
    """(layer index, cost) of every kernel a rank runs in a training step on ``batch`` samples.

    The loss is layer ``network.loss_index``; the optimizer's WU kernels come last.
    """
    itemsize = np.dtype(network.backend.dtype).itemsize
    loss = [(network.loss_index, cost)
            for cost in SoftmaxCrossEntropy.costs(batch, network.num_classes, itemsize)]
    return network.costs(batch) + loss + optimizer.costs()
