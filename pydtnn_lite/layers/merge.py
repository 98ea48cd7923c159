"""Layers that join branches: residual Add and channel Concat."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.layers.base import Layer, Shape, StepContext


class Add(Layer):
    """Element-wise sum of two or more same-shaped inputs (ResNet's shortcut)."""

    kind = "add"

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        if len(set(map(tuple, input_shapes))) != 1:
            raise ValueError(f"{self.name}: inputs must have one shape, got {list(input_shapes)}")
        return tuple(input_shapes[0])

    def forward(self, *inputs: Any, ctx: StepContext) -> Any:
        return kernels.add(inputs)

    def backward(self, grad_out: Any) -> list:
        return [grad_out] * len(self.input_shapes)

    def costs(self, batch: int) -> list[KernelCost]:
        n, inputs = self.elements(batch), len(self.input_shapes)
        return [KernelCost(Stage.FP, "add", (inputs - 1) * n, (inputs + 1) * n * self.itemsize, (n,))]


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
