"""Element-wise kernels: activation, dropout and the merges of residual and dense blocks."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pydtnn_lite.backend import array_module


def relu(x: Any) -> Any:
    """max(x, 0)."""
    return array_module(x).maximum(x, 0)


def relu_grad(grad_out: Any, out: Any) -> Any:
    """Gradient of ReLU from its output: ``grad_out`` where ``out > 0``, else 0."""
    return grad_out * (out > 0)


def relu_grad_sum(grad_outs: Sequence[Any], out: Any) -> Any:
    """:func:`relu_grad` of the sum of ``grad_outs`` (two or more): the gradients of an
    output that feeds several layers (a residual block's)."""
    return relu_grad(add(grad_outs), out)


def add_relu(inputs: Sequence[Any]) -> Any:
    """:func:`relu` of the :func:`add` of ``inputs``: a residual block's output."""
    return relu(add(inputs))


def dropout_mask(x: Any, key: Sequence[int], global_batch: int, offset: int, rate: float) -> Any:
    """Inverted-dropout mask for ``x``, rows ``offset...`` of a global batch: 0 with
    probability ``rate``, else 1/(1-rate).

    The draws cover the whole global batch from ``key``, so every rank's rows are what a
    single process would draw for them.
    """
    uniform = np.random.default_rng(list(key)).random((global_batch,) + x.shape[1:], dtype=np.float32)
    rows = array_module(x).asarray(uniform[offset:offset + x.shape[0]])
    return (rows >= rate).astype(x.dtype) * (1.0 / (1.0 - rate))


def dropout_apply(x: Any, mask: Any) -> Any:
    """``x * mask`` (forward and backward of dropout alike)."""
    return x * mask


def add(inputs: Sequence[Any]) -> Any:
    """Element-wise sum of same-shaped tensors (the residual merge)."""
    total = inputs[0] + inputs[1]
    for extra in inputs[2:]:
        total += extra
    return total


def concat(inputs: Sequence[Any], out: Any = None) -> Any:
    """Join NHWC tensors along channels (the dense-block merge); with ``out``, into it (its
    channels as many as the inputs' together: a channel slice of a wider map, for one)."""
    if out is None:
        return array_module(inputs[0]).concatenate(inputs, axis=-1)
    start = 0
    for term in inputs:
        out[..., start:start + term.shape[-1]] = term
        start += term.shape[-1]
    return out


def split(grad_out: Any, channels: Sequence[int]) -> list:
    """Cut a channel-concatenated gradient back into one piece per input."""
    pieces, start = [], 0
    for width in channels:
        pieces.append(grad_out[..., start:start + width])
        start += width
    return pieces
