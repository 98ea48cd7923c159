"""Flatten: NHWC maps to one feature vector per sample."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite.backend import Backend
from pydtnn_lite.layers.base import Layer, Shape, StepContext


class Flatten(Layer):
    """(N, H, W, C) to (N, H*W*C), features ordered (h, w, c). A view: no kernel runs."""

    kind = "flatten"

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        return (int(np.prod(input_shapes[0])),)

    def forward(self, x: Any, ctx: StepContext) -> Any:
        self.x_shape = x.shape
        return x.reshape((x.shape[0],) + self.output_shape)  # not -1: a rank may hold 0 samples

    def backward(self, grad_out: Any) -> Any:
        return grad_out.reshape(self.x_shape)
