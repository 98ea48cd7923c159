"""Rectified linear unit."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.costs import KernelCost, Stage, fused_cost
from pydtnn_lite.layers.base import Layer, StepContext, gradient_sum_cost

ACTIVATIONS = (None, "relu")  # what BatchNorm and Add take as ``activation``


class ReLU(Layer):
    """``max(x, 0)``; backward masks the gradient with the sign of the output. Where the
    output feeds several layers (a residual block's), backward masks the sum of their
    gradients as it adds them up: one pass over memory fewer."""

    kind = "relu"
    sums_output_grads = True

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.out = kernels.relu(x)
        return self.out

    def backward(self, grad_out: Any) -> Any:
        grad_in = kernels.relu_grad(grad_out, self.out)
        self.out = None
        return grad_in

    def backward_of_sum(self, grad_outs: list) -> Any:
        grad_in = kernels.relu_grad_sum(grad_outs, self.out)
        self.out = None
        return grad_in

    def costs(self, batch: int) -> list[KernelCost]:
        n, s = self.elements(batch), self.itemsize
        return [relu_costs(n, s)[0], relu_backward_cost(n, s, self.output_grad_terms)]


def relu_costs(n: int, itemsize: int) -> list[KernelCost]:
    """The forward and backward calls of a ReLU over ``n`` elements of ``itemsize`` bytes."""
    return [KernelCost(Stage.FP, "relu", n, 2 * n * itemsize, (n,)),
            KernelCost(Stage.BP, "relu_grad", n, 3 * n * itemsize, (n,))]


def relu_backward_cost(n: int, itemsize: int, terms: int) -> KernelCost:
    """The backward call of a ReLU over ``n`` elements whose output has ``terms`` gradients
    (one per consumer): the ReLU gradient, or that of their sum as one fused call."""
    backward = relu_costs(n, itemsize)[1]
    if terms == 1:
        return backward
    sums = [gradient_sum_cost(n, itemsize)] * (terms - 1)  # the network's, unfused
    return fused_cost("relu_grad_sum", terms * n, (terms + 2) * n * itemsize, (n, terms), sums + [backward])
