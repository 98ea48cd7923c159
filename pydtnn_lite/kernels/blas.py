"""Matrix kernels: GEMM and the bias operations that accompany it."""
from __future__ import annotations

from typing import Any

from pydtnn_lite.backend import array_module


def gemm(a: Any, b: Any, trans_a: bool = False, trans_b: bool = False, out: Any | None = None) -> Any:
    """Return ``op(a) @ op(b)``, written into ``out`` when given.

    Transposes are views, so BLAS (or cuBLAS) reads them through its transpose flags
    instead of copying; ``out`` lets a weight gradient land directly in the buffer that
    the Allreduce sends.
    """
    lhs = a.T if trans_a else a
    rhs = b.T if trans_b else b
    if out is None:
        return lhs @ rhs
    return array_module(lhs).matmul(lhs, rhs, out=out)


def bias_add(out: Any, bias: Any) -> Any:
    """Add ``bias`` (length C) to every row of ``out`` (..., C), in place."""
    out += bias
    return out


def bias_grad(grad_out: Any, out: Any) -> Any:
    """Sum ``grad_out`` (rows, C) over its rows into ``out``: the gradient of a per-channel bias."""
    return grad_out.sum(axis=0, out=out)
