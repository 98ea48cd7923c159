"""How a (rows, C) matrix's rows lie in memory, for the compiled kernels on either backend.

The batch-norm kernels and the concatenation read a channel slice of a wider NHWC map (a
concatenation's part, or its gradient cut back into the parts) in place, by the distance
between its rows, where NumPy or CuPy would copy it first.
"""
from __future__ import annotations

from typing import Any


def row_stride(matrix: Any) -> int | None:
    """The distance in elements between the rows of a (rows, C) NumPy or CuPy ``matrix``
    whose rows lie evenly apart, each contiguous (a contiguous matrix, or a channel slice
    of a wider one); None where they do not, or where there are fewer than two rows: the
    kernels then take a contiguous copy."""
    rows, channels = matrix.shape
    between, along = matrix.strides
    item = matrix.itemsize
    if rows > 1 and along == item and between % item == 0 and between >= channels * item:
        return between // item
    return None
