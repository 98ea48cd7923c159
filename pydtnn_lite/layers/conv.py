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
    Backward: ``dW = cols^T @ dy``, ``db = sum(dy)``, and the input gradient ``dx``,
    skipped when no earlier layer needs it, in one of two ways:

    - ``col2im(dy @ W^T)``: the product spreads each output pixel's gradient over its
      window, a (N*Ho*Wo, KH*KW*C_in) matrix that col2im sums back into place;
    - with stride 1, a window wider than one pixel and fewer filters than input channels
      (DenseNet's 3x3 convolutions), as a convolution of its own:
      ``im2col(dy, padding KH-1-pad) @ W'``, with ``W`` turned half a turn in the window
      and its channel axes swapped. Its patch matrix has KH*KW*C_out columns against
      the other's KH*KW*C_in, and its product the better shape for BLAS: 2-2.4x faster
      for DenseNet121's first block (32x32 maps, 128 channels in, 32 out).
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
        self.input_grad_by_convolution = self.stride == 1 and k > 1 and self.filters < channels
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
        if self.needs_input_grad and self.input_grad_by_convolution:
            grad_out_cols = kernels.im2col(grad_out, k, k, 1, k - 1 - self.padding)
            grad_in = kernels.gemm(grad_out_cols, self._turned_weight_matrix()).reshape(self.x_shape)
        elif self.needs_input_grad:
            grad_cols = kernels.gemm(grad_rows, self._weight_matrix(self.params["weight"]), trans_b=True)
            grad_in = kernels.col2im(grad_cols, self.x_shape, k, k, self.stride, self.padding)
        self.cols = None
        return grad_in

    def _turned_weight_matrix(self) -> Any:
        """The weight turned half a turn in the window, input and output channels swapped,
        as a (KH*KW*C_out, C_in) matrix: the kernel that convolves ``dy`` into ``dx``."""
        turned = self.params["weight"][::-1, ::-1].transpose(0, 1, 3, 2)
        return turned.reshape(-1, self.input_shapes[0][2])

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
        by_col2im = self.needs_input_grad and not self.input_grad_by_convolution
        forward, backward = gemm_layer_costs(m, n, k, s, self.use_bias, by_col2im)
        # The patch copy's speed depends on the window, not only on the matrix it fills:
        # (m, k, input channels, kernel size, stride, padding).
        patches = (m, k, self.input_shapes[0][2], self.kernel_size, self.stride, self.padding)
        out = [KernelCost(Stage.FP, "im2col", 0, x_bytes + cols_bytes, patches)] + forward + backward
        if by_col2im:
            out.append(KernelCost(Stage.BP, "col2im", 0 if trivial_im2col else m * k, cols_bytes + 2 * x_bytes,
                                  patches))
        elif self.needs_input_grad:
            out += self._input_grad_convolution_costs(batch)
        return out

    def _input_grad_convolution_costs(self, batch: int) -> list[KernelCost]:
        """The patches of ``dy`` (one row per input pixel) and their product with the turned weight."""
        h, w, channels = self.input_shapes[0]
        rows, inner, s = batch * h * w, self.kernel_size ** 2 * self.filters, self.itemsize
        dy_bytes, cols_bytes = self.elements(batch) * s, rows * inner * s
        patches = (rows, inner, self.filters, self.kernel_size, 1, self.kernel_size - 1 - self.padding)
        return [KernelCost(Stage.BP, "im2col", 0, dy_bytes + cols_bytes, patches),
                KernelCost(Stage.BP, "gemm", 2.0 * rows * channels * inner,
                           cols_bytes + (inner + rows) * channels * s, (rows, channels, inner, 0, 0))]

    def describe(self) -> str:
        k = self.kernel_size
        return f"{self.filters} filters {k}x{k}/{self.stride} pad {self.padding}"
