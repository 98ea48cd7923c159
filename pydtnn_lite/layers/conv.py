"""2-D convolution as im2col followed by one GEMM over the whole batch."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.initializers import get_initializer
from pydtnn_lite.kernels.conv import output_size
from pydtnn_lite.layers.base import Layer, Shape, StepContext, gemm_layer_costs


class Conv2D(Layer):
    """NHWC convolution; weight shape (KH, KW, C_in, C_out), bias (C_out,).

    Forward: ``cols = im2col(x)`` (N*Ho*Wo, KH*KW*C_in), ``y = cols @ W + b``.
    Backward: ``dW = cols^T @ dy``, ``db = sum(dy)``, ``dx = col2im(dy @ W^T)``; the last
    two kernels are skipped when no earlier layer needs the input gradient.
    """

    kind = "conv"

    def __init__(self, filters: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 use_bias: bool = True, init: str = "he") -> None:
        super().__init__()
        self.filters, self.kernel_size, self.stride, self.padding = filters, kernel_size, stride, padding
        self.use_bias = use_bias
        self.initializer = get_initializer(init)

    def init(self, input_shapes: Sequence[Shape], backend: Backend, rng: np.random.Generator) -> Shape:
        h, w, channels = input_shapes[0]
        k = self.kernel_size
        ho, wo = output_size(h, k, self.stride, self.padding), output_size(w, k, self.stride, self.padding)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: a {k}x{k} kernel does not fit a {h}x{w} input")
        shape = (k, k, channels, self.filters)
        self.params["weight"] = backend.asarray(
            self.initializer(rng, shape, fan_in=k * k * channels, fan_out=k * k * self.filters))
        if self.use_bias:
            self.params["bias"] = backend.xp.zeros(self.filters, dtype=backend.dtype)
        return (ho, wo, self.filters)

    def _weight_matrix(self, array: Any) -> Any:
        return array.reshape(-1, self.filters)

    def forward(self, x: Any, ctx: StepContext) -> Any:
        k = self.kernel_size
        self.x_shape = x.shape
        self.cols = kernels.im2col(x, k, k, self.stride, self.padding)
        out = kernels.gemm(self.cols, self._weight_matrix(self.params["weight"]))
        if self.use_bias:
            kernels.bias_add(out, self.params["bias"])
        return out.reshape((x.shape[0],) + self.output_shape)

    def backward(self, grad_out: Any) -> Any:
        k = self.kernel_size
        grad_rows = grad_out.reshape(-1, self.filters)
        kernels.gemm(self.cols, grad_rows, trans_a=True, out=self._weight_matrix(self.grads["weight"]))
        if self.use_bias:
            kernels.bias_grad(grad_rows, out=self.grads["bias"])
        grad_in = None
        if self.needs_input_grad:
            grad_cols = kernels.gemm(grad_rows, self._weight_matrix(self.params["weight"]), trans_b=True)
            grad_in = kernels.col2im(grad_cols, self.x_shape, k, k, self.stride, self.padding)
        self.cols = None
        return grad_in

    def gemm_dims(self, batch: int) -> tuple[int, int, int]:
        """(M, N, K) of the forward GEMM: output pixels, filters, patch length."""
        ho, wo, _ = self.output_shape
        return batch * ho * wo, self.filters, self.kernel_size ** 2 * self.input_shapes[0][2]

    def costs(self, batch: int) -> list[KernelCost]:
        m, n, k = self.gemm_dims(batch)
        s = self.itemsize
        x_bytes = self.elements(batch, self.input_shapes[0]) * s
        trivial_im2col = self.kernel_size == 1 and self.padding == 0 and self.stride == 1
        cols_bytes = 0 if trivial_im2col else m * k * s
        forward, backward = gemm_layer_costs(m, n, k, s, self.use_bias, self.needs_input_grad)
        # The patch copy's speed depends on the window, not only on the matrix it fills:
        # (m, k, input channels, kernel size, stride, padding).
        patches = (m, k, self.input_shapes[0][2], self.kernel_size, self.stride, self.padding)
        out = [KernelCost(Stage.FP, "im2col", 0, x_bytes + cols_bytes, patches)] + forward + backward
        if self.needs_input_grad:
            out.append(KernelCost(Stage.BP, "col2im", 0 if trivial_im2col else m * k, cols_bytes + 2 * x_bytes,
                                  patches))
        return out

    def describe(self) -> str:
        k = self.kernel_size
        return f"{self.filters} filters {k}x{k}/{self.stride} pad {self.padding}"
