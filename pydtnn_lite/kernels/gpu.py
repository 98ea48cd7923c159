"""GPU versions of the kernels whose NumPy formulation is slow on a GPU.

The window kernels: the NumPy versions in :mod:`~pydtnn_lite.kernels.conv` and
:mod:`~pydtnn_lite.kernels.pooling` loop in Python over the KH*KW window offsets, one
whole-batch strided operation each: on a GPU that is KH*KW kernel launches over
non-contiguous views (twice that for the read-modify-write of the backward kernels). The
kernels of ``gpu_kernels.cu`` do each job in one launch and give the NumPy versions'
results. Where a NumPy version is only a view, a reshape or one library call (a 1x1
unpadded window, global average pooling) it is already the best GPU code, and runs as it is.

The batch-norm kernels: written with CuPy's operators each is a chain of element-wise
kernels, a pass over memory per operator (11.8 ms of a 41.9 ms ResNet18 step on an H200).
Those of ``gpu_kernels.cu`` make one pass each, as the host's Numba loops do; their sums
are partial sums per slot of rows in float64, added up by the product below.

The bias gradient and the slots' partial sums: a sum over the rows of a (rows, C) matrix,
which CuPy's reduction runs with one block per column striding across the rows (on an
H200, 0.36 ms for a 131072 x 64 bias gradient). Here it is one cuBLAS product with a
vector of ones, which reads the matrix at memory speed.

The functions take and return CuPy arrays, with the signatures of the NumPy versions. CuPy is
imported when a kernel first runs, so this module imports without it.
"""
from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import numpy as np

from pydtnn_lite.kernels import conv, pooling
from pydtnn_lite.kernels.conv import output_size
from pydtnn_lite.kernels.layout import row_stride

_THREADS = 256  # per block: a multiple of the warp size, ample for these memory-bound loops
_MAX_BLOCKS = 65535  # more threads than any GPU keeps resident; the grid-stride loops do the rest
_SLOT_THREADS = 1 << 17  # threads of a channel-sum kernel: enough to keep a GPU's memory busy
_SLOT_ROWS = 8  # ... each summing this many rows at least
# Sizes below this index in 32 bits: a grid-stride step (at most _THREADS x _MAX_BLOCKS) past
# the last element still fits in an int.
INDEX_LIMIT = 1 << 30
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


def _launch(kernel: str, dtype: Any, iterations: int, *args: Any) -> None:
    """Run ``kernel``, in ``dtype``, with ``iterations`` grid-stride iterations in all; ``args``
    are arrays and integers. The kernel indexes in 32 bits where the iterations and every
    array are below :data:`INDEX_LIMIT` (64-bit division is many times slower on a GPU)."""
    suffix = _SUFFIXES.get(np.dtype(dtype))
    if suffix is None:
        raise TypeError(f"no CUDA {kernel} kernel for {dtype}: use float32 or float64")
    if not iterations:  # CUDA rejects an empty grid
        return
    integers = [isinstance(arg, (int, np.integer)) for arg in args]
    narrow = iterations < INDEX_LIMIT and all(is_integer or _extent(arg) < INDEX_LIMIT
                                              for arg, is_integer in zip(args, integers, strict=True))
    index, index_suffix = (np.int32, "i32") if narrow else (np.int64, "i64")
    args = tuple(index(arg) if is_integer else arg for arg, is_integer in zip(args, integers, strict=True))
    blocks = min(-(-iterations // _THREADS), _MAX_BLOCKS)
    _function(f"{kernel}_{suffix}_{index_suffix}")((blocks,), (_THREADS,), args)


def _extent(array: Any) -> int:
    """Elements from ``array``'s first to its last, one past: its size, or more for a strided view."""
    if array.flags.c_contiguous or not array.size:  # the common case, at a tenth of the cost
        return array.size
    return 1 + sum((n - 1) * abs(step) // array.itemsize for n, step in zip(array.shape, array.strides, strict=True))


def _geometry(x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> tuple[int, int, tuple]:
    """(Ho, Wo, the kernels' geometry arguments n, h, w, c, kh, kw, stride, pad, ho, wo)."""
    n, h, w, c = x_shape
    ho, wo = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    return ho, wo, (n, h, w, c, kh, kw, stride, padding, ho, wo)


def _input_gradient(kernel: str, x_shape: tuple, kh: int, kw: int, stride: int, padding: int,
                    *inputs: Any) -> Any:
    """Run the backward gather ``kernel`` on ``inputs`` into a new input-shaped gradient (N, H, W, C)."""
    import cupy
    inputs = tuple(cupy.ascontiguousarray(array) for array in inputs)
    _, _, geometry = _geometry(x_shape, kh, kw, stride, padding)
    grad = cupy.empty(x_shape, dtype=inputs[0].dtype)
    _launch(kernel, grad.dtype, grad.size, *inputs, grad, *geometry)
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
    _launch("im2col", cols.dtype, cols.size, x, cols, *geometry)
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
    _launch("maxpool", out.dtype, out.size, x, out, argmax, *geometry)
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
    _launch("avgpool", out.dtype, out.size, x, out, *geometry)
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


def _matrix(array: Any) -> tuple[Any, int]:
    """``array`` (..., C) as a (rows, C) matrix whose rows lie evenly apart, each contiguous,
    and that distance in elements: a view of a channel slice of a wider map (a
    concatenation's part), a contiguous copy where the rows are not so laid out."""
    import cupy
    matrix = array.reshape(-1, array.shape[-1])
    stride = row_stride(matrix)
    if stride is None:
        return cupy.ascontiguousarray(matrix), matrix.shape[1]
    return matrix, stride


def _per_channel(dtype: Any, *vectors: Any) -> tuple:
    """The per-channel vectors as the kernels read them: contiguous, in ``dtype``."""
    import cupy
    return tuple(cupy.ascontiguousarray(vector.astype(dtype, copy=False)) for vector in vectors)


def _partial_sums(rows: int, channels: int) -> tuple[Any, int]:
    """A float64 buffer for a channel-sum kernel's partial sums (slots, 2 * channels), and its
    slot count: enough threads (slots x channels) to keep the memory busy, each summing 8
    rows or more."""
    import cupy
    slots = max(1, min(rows // _SLOT_ROWS, -(-_SLOT_THREADS // channels)))
    return cupy.empty((slots, 2 * channels), dtype=cupy.float64), slots


def batchnorm_sums(x: Any) -> Any:
    """Per-channel sum and sum of squared deviations, in float64, in one pass, as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_sums`."""
    import cupy
    matrix, stride = _matrix(x)
    rows, channels = matrix.shape
    if rows == 0:
        return cupy.zeros((2, channels), dtype=cupy.float64)
    partial, slots = _partial_sums(rows, channels)
    _launch("batchnorm_sums", x.dtype, slots * channels, matrix, stride, partial, rows, channels, slots)
    deviations = column_sums(partial).reshape(2, channels)  # about the first row
    first = matrix[0].astype(cupy.float64)
    return cupy.stack([deviations[0] + rows * first, deviations[1] - deviations[0] * deviations[0] / rows])


def _grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any, relu: bool) -> Any:
    import cupy
    grad, grad_stride = _matrix(grad_out.astype(x.dtype, copy=False))
    matrix, x_stride = _matrix(x)
    rows, channels = matrix.shape
    if rows == 0:
        return cupy.zeros((2, channels), dtype=grad_out.dtype)
    partial, slots = _partial_sums(rows, channels)
    _launch("batchnorm_grad_sums", x.dtype, slots * channels, grad, grad_stride, matrix, x_stride,
            *_per_channel(x.dtype, mean, inv_std, gamma, beta), partial, rows, channels, slots, relu)
    return column_sums(partial).reshape(2, channels).astype(grad_out.dtype)


def batchnorm_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any) -> Any:
    """Per-channel (sum of grad, sum of grad * x_hat) in one pass, summed in float64, as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_grad_sums`."""
    return _grad_sums(grad_out, x, mean, inv_std, mean, mean, False)  # no mask: mean stands in for gamma and beta


def batchnorm_relu_grad_sums(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """:func:`batchnorm_grad_sums` of the upstream gradient masked on the fly, as
    :func:`~pydtnn_lite.kernels.normalization.batchnorm_relu_grad_sums` masks it."""
    return _grad_sums(grad_out, x, mean, inv_std, gamma, beta, True)


def _normalized(x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any, relu: bool) -> Any:
    import cupy
    matrix, stride = _matrix(x)
    out = cupy.empty(x.shape, dtype=x.dtype)
    _launch("batchnorm_normalize", x.dtype, out.size, matrix, stride,
            *_per_channel(x.dtype, mean, inv_std, gamma, beta), out, *matrix.shape, relu)
    return out


def batchnorm_normalize(x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """:func:`~pydtnn_lite.kernels.normalization.batchnorm_normalize` in one pass."""
    return _normalized(x, mean, inv_std, gamma, beta, False)


def batchnorm_relu_normalize(x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any) -> Any:
    """:func:`~pydtnn_lite.kernels.normalization.batchnorm_relu_normalize` in one pass."""
    return _normalized(x, mean, inv_std, gamma, beta, True)


def _input_gradient_of_batchnorm(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any,
                                 grad_sums: Any, rows: int, relu: bool, addend: Any) -> Any:
    import cupy
    dtype = x.dtype
    grad, grad_stride = _matrix(grad_out.astype(dtype, copy=False))
    matrix, x_stride = _matrix(x)
    out = cupy.empty(x.shape, dtype=dtype)
    # An addend of another dtype (a float64 gradient reaching a float32 layer) is added after;
    # without one, the output stands in for it, unread.
    fused = addend if addend is not None and addend.dtype == dtype else None
    added, added_stride = _matrix(fused) if fused is not None else (out, 0)
    derived = _per_channel(dtype, gamma * inv_std, grad_sums[0] / rows, grad_sums[1] / rows)
    _launch("batchnorm_grad_input", dtype, out.size, grad, grad_stride, matrix, x_stride,
            *_per_channel(dtype, mean, inv_std, gamma, beta), *derived, added, added_stride, out,
            *matrix.shape, relu, fused is not None)
    return out if addend is None or fused is not None else out + addend


def batchnorm_grad_input(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, grad_sums: Any, rows: int,
                         addend: Any = None) -> Any:
    """:func:`~pydtnn_lite.kernels.normalization.batchnorm_grad_input` in one pass, ``addend``
    added as each element is written."""
    return _input_gradient_of_batchnorm(grad_out, x, mean, inv_std, gamma, gamma, grad_sums, rows, False, addend)


def batchnorm_relu_grad_input(grad_out: Any, x: Any, mean: Any, inv_std: Any, gamma: Any, beta: Any,
                              grad_sums: Any, rows: int, addend: Any = None) -> Any:
    """:func:`~pydtnn_lite.kernels.normalization.batchnorm_relu_grad_input` in one pass, masking
    on the fly and adding ``addend``."""
    return _input_gradient_of_batchnorm(grad_out, x, mean, inv_std, gamma, beta, grad_sums, rows, True, addend)
