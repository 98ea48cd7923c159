"""im2col and col2im for NHWC tensors.

With NHWC the patch matrix has one row per output pixel and columns ordered
(kernel row, kernel column, input channel), so a convolution is ``cols @ W`` with
``W`` of shape (KH*KW*C, F) and the product is already the NHWC output: no transpose
anywhere on the forward or backward path.
"""
from __future__ import annotations

from typing import Any

from pydtnn_lite.backend import array_module


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial output size of a window of ``kernel`` sliding with ``stride`` over a padded axis."""
    return (size + 2 * padding - kernel) // stride + 1


def pad_spatial(x: Any, padding: int, value: float = 0.0) -> Any:
    """Return ``x`` (N, H, W, C) with ``padding`` rows/columns of ``value`` on each side."""
    if padding == 0:
        return x
    xp = array_module(x)
    n, h, w, c = x.shape
    padded = xp.full((n, h + 2 * padding, w + 2 * padding, c), value, dtype=x.dtype)
    padded[:, padding:padding + h, padding:padding + w, :] = x
    return padded


def windows(x: Any, kh: int, kw: int, stride: int) -> Any:
    """A strided view (N, Ho, Wo, KH, KW, C) of every window of ``x``; nothing is copied."""
    xp = array_module(x)
    n, h, w, c = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    s0, s1, s2, s3 = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, (n, ho, wo, kh, kw, c), (s0, s1 * stride, s2 * stride, s1, s2, s3))


def im2col(x: Any, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Patch matrix (N*Ho*Wo, KH*KW*C) of ``x`` (N, H, W, C)."""
    n, _, _, c = x.shape
    if kh == kw == 1 and padding == 0:
        # A 1x1 convolution needs no patches: the input (subsampled) is the matrix.
        sub = x if stride == 1 else x[:, ::stride, ::stride, :]
        return sub.reshape(-1, c)
    view = windows(pad_spatial(x, padding), kh, kw, stride)
    return view.reshape(-1, kh * kw * c)


def col2im(cols: Any, x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Scatter-add a patch-matrix gradient back to an input-shaped gradient (N, H, W, C)."""
    xp = array_module(cols)
    n, h, w, c = x_shape
    ho, wo = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    if kh == kw == 1 and padding == 0 and stride == 1:
        return cols.reshape(x_shape)
    grad = xp.zeros((n, h + 2 * padding, w + 2 * padding, c), dtype=cols.dtype)
    patches = cols.reshape(n, ho, wo, kh, kw, c)
    for i in range(kh):
        for j in range(kw):
            grad[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :] += patches[:, :, :, i, j, :]
    if padding:
        grad = grad[:, padding:padding + h, padding:padding + w, :]
    return grad
