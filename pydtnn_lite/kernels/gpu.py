"""GPU versions of the kernels whose NumPy formulation is slow on a GPU.

The window kernels: the NumPy versions in :mod:`~pydtnn_lite.kernels.conv` and
:mod:`~pydtnn_lite.kernels.pooling` loop in Python over the KH*KW window offsets, one
whole-batch strided operation each: on a GPU that is KH*KW kernel launches over
non-contiguous views (twice that for the read-modify-write of the backward kernels). The
kernels of ``gpu_kernels.cu`` do each job in one launch and give the NumPy versions'
results. Where a NumPy version is only a view, a reshape or one library call (a 1x1
unpadded window, global average pooling) it is already the best GPU code, and runs as it is.

The channel sums (a bias gradient, the batch-norm statistics and their gradients): a sum
over the rows of a (rows, C) matrix, which CuPy's reduction runs with one block per column
striding across the rows (on an H200, 0.36 ms for a 131072 x 64 bias gradient). Here they
are one cuBLAS product with a vector of ones, which reads the matrix at memory speed.

The functions take and return CuPy arrays, with the signatures of the NumPy versions. CuPy is
imported when a kernel first runs, so this module imports without it.
"""
from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import numpy as np

from pydtnn_lite.kernels import conv, normalization, pooling
from pydtnn_lite.kernels.conv import output_size

_THREADS = 256  # per block: a multiple of the warp size, ample for these memory-bound loops
_MAX_BLOCKS = 65535  # more threads than any GPU keeps resident; the grid-stride loops do the rest
_SUFFIXES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


@functools.cache
def _module() -> Any:
    """The kernels as a CuPy module, compiled by NVRTC on first use (and cached on disk by CuPy)."""
    import cupy
    return cupy.RawModule(code=resources.files(__package__).joinpath("gpu_kernels.cu").read_text())


@functools.cache
def _function(name: str) -> Any:
    """Kernel ``name`` of the module, looked up once."""
    return _module().get_function(name)


def _launch(kernel: str, out: Any, *args: Any) -> None:
    """Run ``kernel``, in ``out``'s dtype, with one grid-stride iteration per element of ``out``."""
    suffix = _SUFFIXES.get(out.dtype)
    if suffix is None:
        raise TypeError(f"no CUDA {kernel} kernel for {out.dtype}: use float32 or float64")
    if out.size:  # CUDA rejects an empty grid
        blocks = min(-(-out.size // _THREADS), _MAX_BLOCKS)
        _function(f"{kernel}_{suffix}")((blocks,), (_THREADS,), args)


def _geometry(x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> tuple[int, int, tuple]:
    """(Ho, Wo, the kernels' geometry arguments n, h, w, c, kh, kw, stride, pad, ho, wo as int64)."""
    n, h, w, c = x_shape
    ho, wo = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    return ho, wo, tuple(np.int64(v) for v in (n, h, w, c, kh, kw, stride, padding, ho, wo))


def _input_gradient(kernel: str, x_shape: tuple, kh: int, kw: int, stride: int, padding: int,
                    *inputs: Any) -> Any:
    """Run the backward gather ``kernel`` on ``inputs`` into a new input-shaped gradient (N, H, W, C)."""
    import cupy
    inputs = tuple(cupy.ascontiguousarray(array) for array in inputs)
    _, _, geometry = _geometry(x_shape, kh, kw, stride, padding)
    grad = cupy.empty(x_shape, dtype=inputs[0].dtype)
    _launch(kernel, grad, *inputs, grad, *geometry)
    return grad


def im2col(x: Any, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Patch matrix (N*Ho*Wo, KH*KW*C) of ``x`` (N, H, W, C), as :func:`conv.im2col`."""
    if kh == kw == 1 and padding == 0:  # the (subsampled) input is the matrix
        return conv.im2col(x, kh, kw, stride, padding)
    import cupy
    x = cupy.ascontiguousarray(x)
    n, _, _, c = x.shape
    ho, wo, geometry = _geometry(x.shape, kh, kw, stride, padding)
    cols = cupy.empty((n * ho * wo, kh * kw * c), dtype=x.dtype)
    _launch("im2col", cols, x, cols, *geometry)
    return cols


def col2im(cols: Any, x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Input-shaped gradient (N, H, W, C) summed from a patch-matrix gradient, as :func:`conv.col2im`."""
    if kh == kw == 1 and padding == 0 and stride == 1:  # the matrix is the gradient, reshaped
        return conv.col2im(cols, x_shape, kh, kw, stride, padding)
    return _input_gradient("col2im", x_shape, kh, kw, stride, padding, cols)


def maxpool(x: Any, kh: int, kw: int, stride: int, padding: int) -> tuple[Any, Any]:
    """(output, uint8 argmax) of max pooling ``x``, as :func:`pooling.maxpool`."""
    import cupy
    x = cupy.ascontiguousarray(x)
    n, _, _, c = x.shape
    ho, wo, geometry = _geometry(x.shape, kh, kw, stride, padding)
    out = cupy.empty((n, ho, wo, c), dtype=x.dtype)
    argmax = cupy.empty((n, ho, wo, c), dtype=cupy.uint8)
    _launch("maxpool", out, x, out, argmax, *geometry)
    return out, argmax


def maxpool_grad(grad_out: Any, argmax: Any, x_shape: tuple, kh: int, kw: int,
                 stride: int, padding: int) -> Any:
    """Input gradient of max pooling, as :func:`pooling.maxpool_grad`."""
    return _input_gradient("maxpool_grad", x_shape, kh, kw, stride, padding, grad_out, argmax)


def avgpool(x: Any, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Average pooling of ``x``, as :func:`pooling.avgpool`."""
    n, h, w, c = x.shape
    if (kh, kw, padding) == (h, w, 0):  # global pooling: a mean over the map
        return pooling.avgpool(x, kh, kw, stride, padding)
    import cupy
    x = cupy.ascontiguousarray(x)
    ho, wo, geometry = _geometry(x.shape, kh, kw, stride, padding)
    out = cupy.empty((n, ho, wo, c), dtype=x.dtype)
    _launch("avgpool", out, x, out, *geometry)
    return out


def avgpool_grad(grad_out: Any, x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Input gradient of average pooling, as :func:`pooling.avgpool_grad`."""
    _, h, w, _ = x_shape
    if (kh, kw, padding) == (h, w, 0):  # global pooling: a broadcast of the output gradient
        return pooling.avgpool_grad(grad_out, x_shape, kh, kw, stride, padding)
    return _input_gradient("avgpool_grad", x_shape, kh, kw, stride, padding, grad_out)


def column_sums(matrix: Any) -> Any:
    """Sums over the rows of ``matrix`` (rows, C), in its dtype."""
    import cupy
    return cupy.matmul(cupy.ones(matrix.shape[0], dtype=matrix.dtype), matrix)


def bias_grad(grad_out: Any, out: Any) -> Any:
    """Sum ``grad_out`` (rows, C) over its rows into ``out``, as :func:`~pydtnn_lite.kernels.blas.bias_grad`."""
    out[...] = column_sums(grad_out)
    return out


def batchnorm_sums(x: Any) -> Any:
    """Per-channel sum and sum of squared deviations, in float64, as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_sums`."""
    import cupy
    wide = x.reshape(-1, x.shape[-1]).astype(cupy.float64)
    if wide.shape[0] == 0:
        return cupy.zeros((2, wide.shape[1]), dtype=cupy.float64)
    total = column_sums(wide)
    wide -= total / wide.shape[0]
    wide *= wide
    return cupy.stack([total, column_sums(wide)])


def batchnorm_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any) -> Any:
    """Per-channel (sum of grad, sum of grad * x_hat), as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_grad_sums`."""
    import cupy
    channels = grad_out.shape[-1]
    flat_grad = grad_out.reshape(-1, channels)
    product = normalization.normalized(x, mean, inv_std).reshape(-1, channels)
    product *= flat_grad
    return cupy.stack([column_sums(flat_grad), column_sums(product)])


def batchnorm_relu_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """:func:`batchnorm_grad_sums` of the upstream gradient masked as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_relu_grad_sums` masks it."""
    return batchnorm_grad_sums(normalization.relu_masked(grad_out, x, mean, inv_std, gamma, beta), x, mean, inv_std)
