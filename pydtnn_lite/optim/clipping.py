"""Gradient clipping by global norm."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels


def clip_by_global_norm(gradient: Any, max_norm: float) -> float:
    """Scale the flat ``gradient`` (NumPy or CuPy, in place) down to norm ``max_norm`` when its
    L2 norm is larger; return the norm it had.

    Applied to the gradient after the Allreduce, which every rank holds identically, so
    every rank computes the same norm and scales by the same factor. A gradient no longer
    than the limit is scaled by 1 (its values unchanged), as PyTorch's ``clip_grad_norm_``
    does: a step costs the same whether it clips or not, and is predicted so.
    """
    norm = kernels.gradient_norm(gradient)
    kernels.scale_gradient(gradient, max_norm / norm if norm > max_norm else 1.0)
    return norm
