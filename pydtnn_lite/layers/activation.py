"""Rectified linear unit."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.layers.base import Layer, StepContext


class ReLU(Layer):
    """``max(x, 0)``; backward masks the gradient with the sign of the output."""

    kind = "relu"

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.out = kernels.relu(x)
        return self.out

    def backward(self, grad_out: Any) -> Any:
        grad_in = kernels.relu_grad(grad_out, self.out)
        self.out = None
        return grad_in

    def costs(self, batch: int) -> list[KernelCost]:
        return relu_costs(self.elements(batch), self.itemsize)


def relu_costs(n: int, itemsize: int) -> list[KernelCost]:
    """The forward and backward calls of a ReLU over ``n`` elements of ``itemsize`` bytes."""
    return [KernelCost(Stage.FP, "relu", n, 2 * n * itemsize, (n,)),
            KernelCost(Stage.BP, "relu_grad", n, 3 * n * itemsize, (n,))]
