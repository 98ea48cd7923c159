"""Max, average and global-average pooling over NHWC tensors."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.kernels.conv import output_size
from pydtnn_lite.layers.base import Layer, Shape, StepContext


class _Pool2D(Layer):
    """Shared geometry of the pooling layers: a square window, a stride, a padding."""

    def __init__(self, pool_size: int = 2, stride: int | None = None, padding: int = 0) -> None:
        super().__init__()
        self.pool_size = pool_size
        self.stride = stride if stride is not None else pool_size
        self.padding = padding

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        h, w, channels = input_shapes[0]
        ho = output_size(h, self.pool_size, self.stride, self.padding)
        wo = output_size(w, self.pool_size, self.stride, self.padding)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: a {self.pool_size}x{self.pool_size} window does not fit "
                             f"a {h}x{w} input")
        return (ho, wo, channels)

    def window(self) -> tuple[int, int, int, int]:
        return self.pool_size, self.pool_size, self.stride, self.padding

    def _costs(self, batch: int, kernel: str) -> list[KernelCost]:
        inputs = self.elements(batch, self.input_shapes[0])
        outputs = self.elements(batch)
        taps = self.pool_size ** 2 * outputs
        s = self.itemsize
        dims = (batch,) + tuple(self.input_shapes[0]) + (self.pool_size, self.stride, self.padding)
        return [KernelCost(Stage.FP, kernel, taps, (inputs + outputs) * s, dims),
                KernelCost(Stage.BP, f"{kernel}_grad", taps, (inputs + outputs) * s, dims)]

    def describe(self) -> str:
        return f"{self.pool_size}x{self.pool_size}/{self.stride} pad {self.padding}"


class MaxPool2D(_Pool2D):
    """Maximum over each window; the gradient goes to the first maximum of a window."""

    kind = "maxpool"

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.x_shape = x.shape
        out, self.argmax = kernels.maxpool(x, *self.window())
        return out

    def backward(self, grad_out: Any) -> Any:
        grad_in = kernels.maxpool_grad(grad_out, self.argmax, self.x_shape, *self.window())
        self.argmax = None
        return grad_in

    def costs(self, batch: int) -> list[KernelCost]:
        return self._costs(batch, "maxpool")


class AvgPool2D(_Pool2D):
    """Mean over each window (padding counts as zeros)."""

    kind = "avgpool"

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.x_shape = x.shape
        return kernels.avgpool(x, *self.window())

    def backward(self, grad_out: Any) -> Any:
        return kernels.avgpool_grad(grad_out, self.x_shape, *self.window())

    def costs(self, batch: int) -> list[KernelCost]:
        return self._costs(batch, "avgpool")


class GlobalAvgPool2D(AvgPool2D):
    """Mean over the whole spatial map: (H, W, C) becomes (1, 1, C)."""

    kind = "globalpool"

    def __init__(self) -> None:
        super().__init__(pool_size=1)  # until build makes the window the whole map

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        h, w, _ = input_shapes[0]
        if h != w:
            raise ValueError(f"{self.name}: global pooling needs a square map, got {h}x{w}")
        self.pool_size = self.stride = h
        return super().init(input_shapes, backend, rng)

    def describe(self) -> str:
        return "global"
