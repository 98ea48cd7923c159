"""Gradient clipping by global norm."""
from __future__ import annotations

from typing import Any


def clip_by_global_norm(gradient: Any, max_norm: float) -> float:
    """Scale the flat ``gradient`` (NumPy or CuPy, in place) down to norm ``max_norm`` when its
    L2 norm is larger; return the norm it had.

    Applied to the gradient after the Allreduce, which every rank holds identically, so
    every rank computes the same norm and scales by the same factor.
    """
    norm = float((gradient * gradient).sum()) ** 0.5
    if norm > max_norm:
        gradient *= max_norm / norm
    return norm
