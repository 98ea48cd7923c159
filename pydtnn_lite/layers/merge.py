"""Layers that join branches: residual Add and channel Concat."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost, Stage, fused_cost
from pydtnn_lite.errors import UserError
from pydtnn_lite.layers.activation import ACTIVATIONS, relu_backward_cost, relu_costs
from pydtnn_lite.layers.base import Layer, Shape, StepContext


class Add(Layer):
    """Element-wise sum of two or more same-shaped inputs (ResNet's shortcut).

    ``activation="relu"`` applies a ReLU to the sum in the same pass (a residual block's
    output): the forward writes the activated sum, and where the output feeds several
    layers the backward masks the sum of their gradients as it adds them up, as
    :class:`~pydtnn_lite.layers.activation.ReLU` does.
    """

    kind = "add"

    def __init__(self, activation: str | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"Add activation {activation!r} is none of {ACTIVATIONS}")
        self.activation = activation
        self.sums_output_grads = activation == "relu"

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        if len(set(map(tuple, input_shapes))) != 1:
            raise ValueError(f"{self.name}: inputs must have one shape, got {list(input_shapes)}")
        return tuple(input_shapes[0])

    def forward(self, *inputs: Any, ctx: StepContext) -> Any:
        if not self.activation:
            return kernels.add(inputs)
        self.out = kernels.add_relu(inputs)
        return self.out

    def backward(self, grad_out: Any) -> list:
        if self.activation:
            grad_out = kernels.relu_grad(grad_out, self.out)
            self.out = None
        return [grad_out] * len(self.input_shapes)

    def backward_of_sum(self, grad_outs: list) -> list:
        grad_in = kernels.relu_grad_sum(grad_outs, self.out)
        self.out = None
        return [grad_in] * len(self.input_shapes)

    def describe(self) -> str:
        return f"+{self.activation}" if self.activation else ""

    def costs(self, batch: int) -> list[KernelCost]:
        n, inputs, s = self.elements(batch), len(self.input_shapes), self.itemsize
        add = KernelCost(Stage.FP, "add", (inputs - 1) * n, (inputs + 1) * n * s, (n,))
        if not self.activation:
            return [add]
        relu = relu_costs(n, s)[0]
        return [fused_cost("add_relu", add.flops + relu.flops, (inputs + 1) * n * s, (n,), [add, relu]),
                relu_backward_cost(n, s, self.output_grad_terms)]


class Concat(Layer):
    """Join inputs along the channel axis (DenseNet's dense connectivity)."""

    kind = "concat"

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        if len({tuple(s[:-1]) for s in input_shapes}) != 1:
            raise ValueError(f"{self.name}: inputs must share H and W, got {list(input_shapes)}")
        self.channels = [s[-1] for s in input_shapes]
        return tuple(input_shapes[0][:-1]) + (sum(self.channels),)

    def forward(self, *inputs: Any, ctx: StepContext) -> Any:
        return kernels.concat(inputs)

    def backward(self, grad_out: Any) -> list:
        return kernels.split(grad_out, self.channels)

    def costs(self, batch: int) -> list[KernelCost]:
        n = self.elements(batch)
        return [KernelCost(Stage.FP, "concat", 0, 2 * n * self.itemsize, (n,)),
                KernelCost(Stage.BP, "split", 0, 0, (n,))]  # views, no copy
