"""Fully connected layer."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost
from pydtnn_lite.initializers import get_initializer
from pydtnn_lite.layers.base import Layer, Shape, StepContext, gemm_layer_costs


class Dense(Layer):
    """``y = x @ W + b`` with weight shape (in_features, out_features), bias (out_features,)."""

    kind = "dense"

    def __init__(self, units: int, use_bias: bool = True, init: str = "he") -> None:
        super().__init__()
        self.units, self.use_bias = units, use_bias
        self.initializer = get_initializer(init)

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        if len(input_shapes[0]) != 1:
            raise ValueError(f"{self.name} needs a flat input, got per-sample shape {input_shapes[0]}: "
                             "put a Flatten layer before it")
        fan_in = input_shapes[0][0]
        self.params["weight"] = backend.asarray(
            self.initializer(rng, (fan_in, self.units), fan_in=fan_in, fan_out=self.units))
        if self.use_bias:
            self.params["bias"] = backend.xp.zeros(self.units, dtype=backend.dtype)
        return (self.units,)

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.x = x
        out = kernels.gemm(x, self.params["weight"])
        if self.use_bias:
            kernels.bias_add(out, self.params["bias"])
        return out

    def backward(self, grad_out: Any) -> Any:
        kernels.gemm(self.x, grad_out, trans_a=True, out=self.grads["weight"])
        if self.use_bias:
            kernels.bias_grad(grad_out, out=self.grads["bias"])
        grad_in = kernels.gemm(grad_out, self.params["weight"], trans_b=True) if self.needs_input_grad else None
        self.x = None
        return grad_in

    def costs(self, batch: int) -> list[KernelCost]:
        forward, backward = gemm_layer_costs(batch, self.units, self.input_shapes[0][0], self.itemsize,
                                             self.use_bias, self.needs_input_grad)
        return forward + backward

    def describe(self) -> str:
        return f"{self.units} units"
