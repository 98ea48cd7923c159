"""Max and average pooling over NHWC windows.

Both loop over the KH*KW positions of the window, each step a strided slice of the
whole batch, so one code path serves overlapping (AlexNet's 3x3/2) and
non-overlapping windows, padding, and NumPy and CuPy alike.
"""
from __future__ import annotations

from typing import Any

from pydtnn_lite.backend import array_module
from pydtnn_lite.kernels.conv import output_size, pad_spatial


def _position(x: Any, i: int, j: int, stride: int, ho: int, wo: int) -> Any:
    """The slice of ``x`` seen by window position (i, j) of every output pixel."""
    return x[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :]


def exact_cover(h: int, w: int, kh: int, kw: int, stride: int, padding: int) -> bool:
    """True when the windows tile the input exactly once (e.g. 2x2/2 on an even map)."""
    return padding == 0 and kh == kw == stride and h % stride == 0 and w % stride == 0


def maxpool(x: Any, kh: int, kw: int, stride: int, padding: int) -> tuple[Any, Any]:
    """Return (output, argmax) where argmax holds, per output, the first window position of the max."""
    xp = array_module(x)
    n, h, w, c = x.shape
    ho, wo = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    padded = pad_spatial(x, padding, value=-xp.inf)
    out = _position(padded, 0, 0, stride, ho, wo).copy()
    argmax = xp.zeros(out.shape, dtype=xp.uint8)
    for k in range(1, kh * kw):
        candidate = _position(padded, k // kw, k % kw, stride, ho, wo)
        larger = candidate > out  # strictly: the first maximum keeps a tie, as in the reference frameworks
        # k exceeds every earlier position, so max(argmax, k * larger) records k exactly where
        # larger holds; both this and maximum() run far faster than a masked copy.
        xp.maximum(argmax, larger.view(xp.uint8) * xp.uint8(k), out=argmax)
        xp.maximum(out, candidate, out=out)
    return out, argmax


def maxpool_grad(grad_out: Any, argmax: Any, x_shape: tuple, kh: int, kw: int,
                 stride: int, padding: int) -> Any:
    """Route each output gradient to the input element that was the window's maximum."""
    xp = array_module(grad_out)
    n, h, w, c = x_shape
    ho, wo = grad_out.shape[1:3]
    if exact_cover(h, w, kh, kw, stride, padding):
        # Every input element belongs to one window: write each position once, no zeroing, no adds.
        grad = xp.empty(x_shape, dtype=grad_out.dtype)
        for k in range(kh * kw):
            xp.multiply(grad_out, argmax == k, out=_position(grad, k // kw, k % kw, stride, ho, wo))
        return grad
    grad = xp.zeros((n, h + 2 * padding, w + 2 * padding, c), dtype=grad_out.dtype)
    for k in range(kh * kw):
        _position(grad, k // kw, k % kw, stride, ho, wo)[...] += xp.where(argmax == k, grad_out, 0)
    return grad[:, padding:padding + h, padding:padding + w, :] if padding else grad


def avgpool(x: Any, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Mean over each window; padded zeros count towards the mean."""
    n, h, w, c = x.shape
    ho, wo = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    if kh == h and kw == w and padding == 0:
        return x.mean(axis=(1, 2), keepdims=True)
    padded = pad_spatial(x, padding)
    out = _position(padded, 0, 0, stride, ho, wo).copy()
    for k in range(1, kh * kw):
        out += _position(padded, k // kw, k % kw, stride, ho, wo)
    out *= 1.0 / (kh * kw)
    return out


def avgpool_grad(grad_out: Any, x_shape: tuple, kh: int, kw: int, stride: int, padding: int) -> Any:
    """Spread each output gradient evenly over its window."""
    xp = array_module(grad_out)
    n, h, w, c = x_shape
    ho, wo = grad_out.shape[1:3]
    share = grad_out * (1.0 / (kh * kw))
    if kh == h and kw == w and padding == 0:
        return xp.broadcast_to(share, x_shape).copy()
    grad = xp.zeros((n, h + 2 * padding, w + 2 * padding, c), dtype=grad_out.dtype)
    for k in range(kh * kw):
        _position(grad, k // kw, k % kw, stride, ho, wo)[...] += share
    return grad[:, padding:padding + h, padding:padding + w, :] if padding else grad
