"""2-D convolution as im2col followed by one GEMM over the whole batch; 3x3 stride-1 layers
by Winograd's F(4x4, 3x3), narrow stride-1 layers in the transposed form."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.backend import Backend, array_module
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.initializers import get_initializer
from pydtnn_lite.kernels.conv import output_size
from pydtnn_lite.kernels.winograd import (
    FILTER_TRANSFORM_FLOPS,
    INPUT_TRANSFORM_FLOPS,
    OUTPUT_TRANSFORM_FLOPS,
    POINTS,
    TILE,
    tile_counts,
)
from pydtnn_lite.layers.base import Layer, Shape, StepContext, bias_costs, gemm_layer_costs

# Below 64 channels the products the transforms save do not pay for their passes over memory
# (``benchmarks/conv_forms.py --layers``: 16 channels 1.19-1.33x the patch matrix's time,
# 32 channels 0.94-1.09x, 64 channels 0.67x; docs/performance.md).
WINOGRAD_MIN_CHANNELS = 64
# Below 32 tiles a call the filters' transforms and the point GEMMs' passes over the
# transformed filters, whose cost does not shrink with the batch, outweigh the products
# saved (4x4 maps of 512 channels: 8 tiles 1.43x the patch matrix's time on one thread,
# 16 tiles 0.90x on one thread and 1.19x on two, 32 tiles 0.87x on two; docs/performance.md).
WINOGRAD_MIN_TILES = 32
# A layer with fewer filters than channels has a cheaper alternative, the transposed form,
# so it takes Winograd's from more tiles (DenseNet's 3x3 layers, 128 channels in and 32 out,
# on two threads: 4096 tiles 0.67x the transposed form's time, 1024 tiles 0.72x, 512 0.71x,
# 256 0.96x, 128 1.15x, 64 1.44x; on one thread 0.56-0.71x from 32 tiles up).
WINOGRAD_MIN_TILES_NARROW = 256


def convolution_form(channels: int, filters: int, kernel: int, stride: int, out_size: tuple[int, int],
                     batch: int, winograd: bool = True) -> str:
    """The form a :class:`Conv2D` of these sizes computes a batch of ``batch`` in:
    ``"transposed"``, ``"winograd"`` (only where ``winograd``) or ``"direct"`` (see the class)."""
    narrow = stride == 1 and kernel > 1 and filters < channels
    if (winograd and kernel == 3 and stride == 1 and channels >= WINOGRAD_MIN_CHANNELS and min(out_size) >= TILE
            and batch * math.prod(tile_counts(*out_size)) >= (WINOGRAD_MIN_TILES_NARROW if narrow
                                                              else WINOGRAD_MIN_TILES)):
        return "winograd"
    return "transposed" if narrow else "direct"


class Conv2D(Layer):
    """NHWC convolution; weight shape (KH, KW, C_in, C_out), bias (C_out,).

    Forward: ``cols = im2col(x)`` (N*Ho*Wo, KH*KW*C_in), ``y = cols @ W + b``.
    Backward: ``dW = cols^T @ dy``, ``db = sum(dy)``, ``dx = col2im(dy @ W^T)``; the last
    two kernels are skipped when no earlier layer needs the input gradient.

    Two other forms do the same work with less (:meth:`form`, by the layer's sizes and the
    batch; otherwise ``"direct"``):

    - *Transposed* (``"transposed"``): stride 1, a window wider than one pixel and fewer
      filters than input channels, where the Winograd form does not apply (DenseNet's 3x3
      convolutions, 128 channels in and 32 out, on 4x4 maps, and on 8x8 maps in batches
      under 64 images).
      A stride-1 convolution is the transposed convolution of its kernel turned half a
      turn in the window, channel axes swapped (``W'``, a (KH*KW*C_out, C_in) matrix),
      with padding ``KH-1-pad``. So ``y = col2im(x @ W'^T)``, ``G = im2col(dy)``,
      ``dW' = x^T @ G``, ``dx = G @ W'``, all with padding ``KH-1-pad``: every matrix is
      KH*KW*C_out wide instead of KH*KW*C_in, and the layer keeps ``x`` for the backward
      instead of a patch matrix KH*KW times its size.
    - *Winograd* (``"winograd"``): a 3x3 stride-1 layer with at least
      :data:`WINOGRAD_MIN_CHANNELS` input channels, an output of one whole 4x4 tile or
      more and :data:`WINOGRAD_MIN_TILES` tiles in the batch or more,
      :data:`WINOGRAD_MIN_TILES_NARROW` with fewer filters than channels (ResNet's and
      VGG's 3x3 convolutions but the first, those on 4x4 maps only with 32 images or more;
      DenseNet's on 32x32 maps from 4 images, 16x16 from 16, 8x8 from 64).
      Winograd's minimal filtering F(4x4, 3x3) computes each 4x4 output tile from the 6x6
      input block around it with 36 products per (tile, channel, filter) where the patch
      matrix takes 144: 36 GEMMs of (tiles, C) by (C, K) between transforms of the tiles
      (:mod:`~pydtnn_lite.kernels.winograd`). The backward pass runs the transforms'
      adjoints, so the gradients are those of the same computation; the layer keeps the
      transformed input tiles (2.25x the input) instead of a patch matrix (9x).
      ``winograd=False`` keeps such a layer on the patch matrix, as a GPU backend does
      every layer (``Backend.winograd``).
    """

    kind = "conv"

    def __init__(self, filters: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 use_bias: bool = True, init: str = "he", winograd: bool = True) -> None:
        super().__init__()
        self.winograd = winograd  # False: the patch matrix (or the transposed form) even where Winograd applies
        self.winograd_allowed = winograd  # whether any batch may take it: ``winograd`` and, once built, the backend's
        self.batch_form = "direct"  # the form of the last forward, which its backward follows
        self.tiles: Any = None  # the Winograd form's transformed input tiles, kept for the backward
        self.tile_filters: Any = None  # and its transformed filters
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
        self.winograd_allowed = self.winograd and backend.winograd  # a GPU backend computes every layer directly
        return (ho, wo, self.filters)

    def form(self, batch: int) -> str:
        """The form this layer computes a batch of ``batch`` in (see the class)."""
        _, _, channels = self.input_shapes[0]
        out_h, out_w, _ = self.output_shape
        return convolution_form(channels, self.filters, self.kernel_size, self.stride, (out_h, out_w), batch,
                                self.winograd_allowed)

    def _weight_matrix(self, array: Any) -> Any:
        return array.reshape(-1, self.filters)

    def _turned_weight_matrix(self) -> Any:
        """The weight turned half a turn in the window, input and output channels swapped,
        as a (KH*KW*C_out, C_in) matrix: the transposed form's kernel."""
        turned = self.params["weight"][::-1, ::-1].transpose(0, 1, 3, 2)
        return turned.reshape(-1, self.input_shapes[0][2])

    def _turned_padding(self) -> int:
        return self.kernel_size - 1 - self.padding

    def forward(self, x: Any, ctx: StepContext) -> Any:
        k = self.kernel_size
        self.x_shape = x.shape
        out_shape = (x.shape[0],) + self.output_shape
        self.batch_form = self.form(x.shape[0])
        if self.batch_form == "winograd":
            out = self._winograd_forward(x, out_shape)
        elif self.batch_form == "transposed":
            self.x = x
            spread = kernels.gemm(x.reshape(-1, x.shape[-1]), self._turned_weight_matrix(), trans_b=True)
            out = kernels.col2im(spread, out_shape, k, k, 1, self._turned_padding())
        else:
            self.cols = kernels.im2col(x, k, k, self.stride, self.padding)
            out = kernels.gemm(self.cols, self._weight_matrix(self.params["weight"]))
        if self.use_bias:
            kernels.bias_add(out, self.params["bias"])
        return out.reshape(out_shape)

    def backward(self, grad_out: Any) -> Any:
        backward = {"winograd": self._winograd_backward, "transposed": self._transposed_backward,
                    "direct": self._backward}[self.batch_form]
        grad_in = backward(grad_out)
        self.cols = self.x = self.tiles = self.tile_filters = None
        return grad_in

    def _bias_grad(self, grad_rows: Any) -> None:
        if self.use_bias:
            kernels.bias_grad(grad_rows, out=self.grads["bias"])

    def _backward(self, grad_out: Any) -> Any:
        k = self.kernel_size
        grad_rows = grad_out.reshape(-1, self.filters)
        kernels.gemm(self.cols, grad_rows, trans_a=True, out=self._weight_matrix(self.grads["weight"]))
        self._bias_grad(grad_rows)
        if not self.needs_input_grad:
            return None
        grad_cols = kernels.gemm(grad_rows, self._weight_matrix(self.params["weight"]), trans_b=True)
        return kernels.col2im(grad_cols, self.x_shape, k, k, self.stride, self.padding)

    def _transposed_backward(self, grad_out: Any) -> Any:
        k, channels = self.kernel_size, self.x_shape[-1]
        grad_patches = kernels.im2col(grad_out, k, k, 1, self._turned_padding())
        turned_grad = kernels.gemm(self.x.reshape(-1, channels), grad_patches, trans_a=True)
        # (C_in, KH*KW*C_out) -> the weight's own layout: turned back, channel axes swapped back.
        unturned = turned_grad.T.reshape(k, k, self.filters, channels)[::-1, ::-1].transpose(0, 1, 3, 2)
        self.grads["weight"][...] = unturned
        self._bias_grad(grad_out.reshape(-1, self.filters))
        if not self.needs_input_grad:
            return None
        return kernels.gemm(grad_patches, self._turned_weight_matrix()).reshape(self.x_shape)

    def _winograd_forward(self, x: Any, out_shape: tuple) -> Any:
        tiles = kernels.winograd_input(x, self.padding, *tile_counts(*out_shape[1:3]))
        tile_filters = kernels.winograd_filter(self.params["weight"])
        products = array_module(x).empty(tiles.shape[:2] + (self.filters,), dtype=x.dtype)
        for point in range(POINTS):
            kernels.gemm(tiles[point], tile_filters[point], out=products[point])
        self.tiles, self.tile_filters = tiles, tile_filters
        return kernels.winograd_output(products, out_shape)

    def _winograd_backward(self, grad_out: Any) -> Any:
        xp = array_module(grad_out)
        product_grads = kernels.winograd_output_grad(grad_out)
        filter_grads = xp.empty_like(self.tile_filters)
        for point in range(POINTS):
            kernels.gemm(self.tiles[point], product_grads[point], trans_a=True, out=filter_grads[point])
        kernels.winograd_filter_grad(filter_grads, self.grads["weight"])
        self._bias_grad(grad_out.reshape(-1, self.filters))
        if not self.needs_input_grad:
            return None
        tile_grads = xp.empty_like(self.tiles)
        for point in range(POINTS):
            kernels.gemm(product_grads[point], self.tile_filters[point], trans_b=True, out=tile_grads[point])
        return kernels.winograd_input_grad(tile_grads, self.x_shape, self.padding)

    def gemm_dims(self, batch: int) -> tuple[int, int, int]:
        """(M, N, K) of the forward GEMM: output pixels, filters, patch length."""
        ho, wo, _ = self.output_shape
        return batch * ho * wo, self.filters, self.kernel_size ** 2 * self.input_shapes[0][2]

    def costs(self, batch: int) -> list[KernelCost]:
        form = self.form(batch)
        if form == "winograd":
            return self._winograd_costs(batch)
        if form == "transposed":
            return self._transposed_costs(batch)
        return self._direct_costs(batch)

    def direct_flops(self, batch: int, stage: Stage) -> float:
        """The FLOPs of ``stage`` as the patch matrix computes the convolution, whatever the form."""
        return sum(cost.flops for cost in self._direct_costs(batch) if cost.stage == stage)

    def _direct_costs(self, batch: int) -> list[KernelCost]:
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

    def _transposed_costs(self, batch: int) -> list[KernelCost]:
        """The transposed form's kernels: its matrices have one row per input pixel and
        ``q = KH*KW*C_out`` columns (``spread``: x @ W'^T; ``G``: the patches of dy)."""
        h, w, channels = self.input_shapes[0]
        rows, q, s = batch * h * w, self.kernel_size ** 2 * self.filters, self.itemsize
        m, n = batch * self.output_shape[0] * self.output_shape[1], self.filters
        x_bytes, y_bytes, wide_bytes = rows * channels * s, m * n * s, rows * q * s
        patches = (rows, q, n, self.kernel_size, 1, self._turned_padding())
        gemm_bytes = wide_bytes + x_bytes + q * channels * s
        bias = bias_costs(m, n, s) if self.use_bias else ()
        out = [KernelCost(Stage.FP, "gemm", 2.0 * rows * q * channels, gemm_bytes, (rows, q, channels, 0, 1)),
               KernelCost(Stage.FP, "col2im", rows * q, wide_bytes + 2 * y_bytes, patches),
               *bias[:1],
               KernelCost(Stage.BP, "im2col", 0, y_bytes + wide_bytes, patches),
               KernelCost(Stage.BP, "gemm", 2.0 * rows * q * channels, gemm_bytes, (channels, q, rows, 1, 0)),
               *bias[1:]]
        if self.needs_input_grad:
            out.append(KernelCost(Stage.BP, "gemm", 2.0 * rows * q * channels, gemm_bytes, (rows, channels, q, 0, 0)))
        return out

    def _winograd_costs(self, batch: int) -> list[KernelCost]:
        """The Winograd form's kernels, with ``T`` tiles of the batch: the tile transforms,
        the filters' transform and its adjoint, and the 36 GEMMs of each product
        (``point_gemms``)."""
        channels = self.input_shapes[0][2]
        out_h, out_w, filters = self.output_shape
        tiles_h, tiles_w = tile_counts(out_h, out_w)
        tiles, s = batch * tiles_h * tiles_w, self.itemsize
        x_bytes, y_bytes = self.elements(batch, self.input_shapes[0]) * s, self.elements(batch) * s
        tiles_in, tiles_out = tiles * POINTS * channels * s, tiles * POINTS * filters * s
        weights = channels * filters
        filter_flops, filter_bytes = FILTER_TRANSFORM_FLOPS * weights, (9 + POINTS) * weights * s

        def point_gemms(stage: Stage, dims: tuple) -> list[KernelCost]:
            return [KernelCost(stage, "gemm", 2.0 * tiles * weights, (tiles * (channels + filters) + weights) * s,
                               dims)] * POINTS

        out = [KernelCost(Stage.FP, "winograd_input", INPUT_TRANSFORM_FLOPS * tiles * channels,
                          x_bytes + tiles_in, (tiles, channels)),
               KernelCost(Stage.FP, "winograd_filter", filter_flops, filter_bytes, (channels, filters)),
               *point_gemms(Stage.FP, (tiles, filters, channels, 0, 0)),
               KernelCost(Stage.FP, "winograd_output", OUTPUT_TRANSFORM_FLOPS * tiles * filters,
                          tiles_out + y_bytes, (tiles, filters))]
        if self.use_bias:
            out += bias_costs(batch * out_h * out_w, filters, s)
        out += [KernelCost(Stage.BP, "winograd_output_grad", OUTPUT_TRANSFORM_FLOPS * tiles * filters,
                           y_bytes + tiles_out, (tiles, filters)),
                *point_gemms(Stage.BP, (channels, filters, tiles, 1, 0)),
                KernelCost(Stage.BP, "winograd_filter_grad", filter_flops, filter_bytes, (channels, filters))]
        if self.needs_input_grad:
            out += [*point_gemms(Stage.BP, (tiles, channels, filters, 0, 1)),
                    KernelCost(Stage.BP, "winograd_input_grad", INPUT_TRANSFORM_FLOPS * tiles * channels,
                               tiles_in + x_bytes, (tiles, channels))]
        return out

    def describe(self) -> str:
        k = self.kernel_size
        return f"{self.filters} filters {k}x{k}/{self.stride} pad {self.padding}"
