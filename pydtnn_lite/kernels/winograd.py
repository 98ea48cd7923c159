"""Winograd's minimal filtering F(4x4, 3x3) for NHWC maps: the tile transforms.

A 3x3 stride-1 convolution computes each 4x4 block of its output (a *tile*) from a 6x6
block of its padded input. In the transformed domain that is 36 products of numbers per
(tile, input channel, filter) instead of 144 (Lavin and Gray, 2016), so a convolution over
``C`` channels to ``K`` filters becomes

- ``V = input_tiles(x)``: every tile's ``B^T d B``, a (36, tiles, C) array;
- ``U = filter_tiles(w)``: every filter's ``G g G^T``, (36, C, K);
- 36 GEMMs ``M[p] = V[p] @ U[p]``, a (36, tiles, K) array;
- ``y = output_tiles(M)``: every tile's ``A^T m A``, cropped to the output.

Each step is linear, so the backward pass runs the adjoints in reverse:
``dM = output_tiles_grad(dy)``, ``dU[p] = V[p]^T @ dM[p]``,
``dw = filter_tiles_grad(dU)``, ``dV[p] = dM[p] @ U[p]^T`` and
``dx = input_tiles_grad(dV)``, which adds the overlapping tiles back. The transforms use
the interpolation points 0, +-1, +-2 and infinity; in float32 the output differs from the
direct convolution's by about 1e-5 relative, in float64 by about 1e-14. The transformed
arrays are point-major, so that each of the 36 GEMMs reads and writes contiguous matrices.

These are the array-library versions (NumPy's the reference for the host's Numba loops in
:mod:`~pydtnn_lite.kernels.winograd_cpu`, CuPy's the GPU's).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from pydtnn_lite.backend import array_module
from pydtnn_lite.kernels.conv import windows

TILE = 4  # output pixels per tile side
SPAN = TILE + 2  # input pixels per tile side: a tile and the 3x3 window's border
POINTS = SPAN * SPAN  # the transformed domain's size per tile: one GEMM per point

INPUT_TRANSFORM = np.array([[4, 0, -5, 0, 1, 0],  # B^T
                            [0, -4, -4, 1, 1, 0],
                            [0, 4, -4, -1, 1, 0],
                            [0, -2, -1, 2, 1, 0],
                            [0, 2, -1, -2, 1, 0],
                            [0, 4, 0, -5, 0, 1]], dtype=np.float64)
_FILTER_POINTS = np.array([[1 / 4, 0, 0],  # G
                           [-1 / 6, -1 / 6, -1 / 6],
                           [-1 / 6, 1 / 6, -1 / 6],
                           [1 / 24, 1 / 12, 1 / 6],
                           [1 / 24, -1 / 12, 1 / 6],
                           [0, 0, 1]], dtype=np.float64)
OUTPUT_TRANSFORM = np.array([[1, 1, 1, 1, 1, 0],  # A^T
                             [0, 1, -1, 2, -2, 0],
                             [0, 1, 1, 4, 4, 0],
                             [0, 1, -1, 8, -8, 1]], dtype=np.float64)
# Arithmetic per (tile, channel), for the cost model: the input transform (and its adjoint)
# applies B^T to six columns and six rows of six, 24 operations each; the output
# transform (and its adjoint) A^T to six columns and four rows, 17 each.
INPUT_TRANSFORM_FLOPS = 12 * 24
OUTPUT_TRANSFORM_FLOPS = 10 * 17
# G g G^T of a 3x3 filter g as one product: a (36, 9) matrix times the filter's nine taps
# (row-major), so that the weight (3, 3, C, K) seen as (9, C*K) is transformed by one GEMM.
FILTER_TRANSFORM = np.kron(_FILTER_POINTS, _FILTER_POINTS)
# G is a diagonal scaling of a matrix of small integers, G = diag(FILTER_SCALES) @ G_hat; so
# G g G^T is G_hat g G_hat^T with each of its 36 values scaled by FILTER_SCALES[a] * FILTER_SCALES[b].
FILTER_SCALES = np.array([1 / 4, 1 / 6, 1 / 6, 1 / 24, 1 / 24, 1], dtype=np.float64)
# The filters' transform (and its adjoint) per (channel, filter): nine 1-D transforms of
# about 12 operations each and the 36 scalings.
FILTER_TRANSFORM_FLOPS = 9 * 12 + POINTS


def tile_counts(out_h: int, out_w: int) -> tuple[int, int]:
    """Tiles down and across an output of ``out_h`` x ``out_w`` (the last ones may be partial)."""
    return -(-out_h // TILE), -(-out_w // TILE)


def filter_tiles(weight: Any) -> Any:
    """``G g G^T`` of every 3x3 filter ``g`` of ``weight`` (3, 3, C, K): (36, C, K)."""
    xp = array_module(weight)
    _, _, c, k = weight.shape
    transform = xp.asarray(FILTER_TRANSFORM, dtype=weight.dtype)
    return (transform @ weight.reshape(9, -1)).reshape(POINTS, c, k)


def filter_tiles_grad(tile_grads: Any, out: Any) -> Any:
    """The adjoint of :func:`filter_tiles`: ``G^T u G`` of every filter's (36, C, K) gradient
    ``u``, written into ``out`` (3, 3, C, K), which it returns."""
    xp = array_module(tile_grads)
    transform = xp.asarray(FILTER_TRANSFORM, dtype=tile_grads.dtype)
    xp.matmul(transform.T, tile_grads.reshape(POINTS, -1), out=out.reshape(9, -1))
    return out


def padded_input(x: Any, padding: int, tiles_h: int, tiles_w: int) -> Any:
    """``x`` (N, H, W, C) with ``padding`` zeros before and as many after as the tiles need."""
    xp = array_module(x)
    n, h, w, c = x.shape
    padded = xp.zeros((n, TILE * tiles_h + 2, TILE * tiles_w + 2, c), dtype=x.dtype)
    padded[:, padding:padding + h, padding:padding + w] = x
    return padded


def _both_sides(matrix: Any, blocks: Any, pattern: str) -> Any:
    """``matrix`` applied to the two spatial axes of ``blocks``, as ``pattern`` names them."""
    xp = array_module(blocks)
    first, second = pattern.split(";")
    return xp.einsum(second, matrix, xp.einsum(first, matrix, blocks))


def input_tiles(x: Any, padding: int, tiles_h: int, tiles_w: int) -> Any:
    """``B^T d B`` of every 6x6 input block ``d``: (36, N*tiles_h*tiles_w, C), tiles row-major."""
    xp = array_module(x)
    n, _, _, c = x.shape
    blocks = windows(padded_input(x, padding, tiles_h, tiles_w), SPAN, SPAN, TILE)
    transform = xp.asarray(INPUT_TRANSFORM, dtype=x.dtype)
    tiles = _both_sides(transform, blocks, "ai,ntuijc->ntuajc;bj,ntuajc->abntuc")
    return tiles.reshape(POINTS, n * tiles_h * tiles_w, c)


def output_tiles(products: Any, out_shape: tuple) -> Any:
    """``A^T m A`` of every tile's products, (36, tiles, K): the output (N, Ho, Wo, K)."""
    xp = array_module(products)
    n, out_h, out_w, k = out_shape
    tiles_h, tiles_w = tile_counts(out_h, out_w)
    transform = xp.asarray(OUTPUT_TRANSFORM, dtype=products.dtype)
    blocks = products.reshape(SPAN, SPAN, n, tiles_h, tiles_w, k)
    out = _both_sides(transform, blocks, "ai,ijntuk->ntajuk;bj,ntajuk->ntaubk")
    out = out.reshape(n, TILE * tiles_h, TILE * tiles_w, k)
    return xp.ascontiguousarray(out[:, :out_h, :out_w])


def output_tiles_grad(grad_out: Any) -> Any:
    """The adjoint of :func:`output_tiles`: ``A g A^T`` of every 4x4 gradient tile ``g``
    (zeros beyond the output), (36, tiles, K)."""
    xp = array_module(grad_out)
    n, out_h, out_w, k = grad_out.shape
    tiles_h, tiles_w = tile_counts(out_h, out_w)
    whole = xp.zeros((n, TILE * tiles_h, TILE * tiles_w, k), dtype=grad_out.dtype)
    whole[:, :out_h, :out_w] = grad_out
    blocks = whole.reshape(n, tiles_h, TILE, tiles_w, TILE, k)
    transform = xp.asarray(OUTPUT_TRANSFORM, dtype=grad_out.dtype)
    grads = _both_sides(transform, blocks, "ai,ntaubk->ntiubk;bj,ntiubk->ijntuk")
    return grads.reshape(POINTS, n * tiles_h * tiles_w, k)


def input_tiles_grad(tile_grads: Any, x_shape: tuple, padding: int) -> Any:
    """The adjoint of :func:`input_tiles`: ``B v B^T`` of every tile's gradient ``v``, added
    into the input's gradient (N, H, W, C) where the 6x6 blocks overlap."""
    xp = array_module(tile_grads)
    n, h, w, c = x_shape
    tiles_h, tiles_w = tile_counts(h + 2 * padding - 2, w + 2 * padding - 2)
    transform = xp.asarray(INPUT_TRANSFORM, dtype=tile_grads.dtype)
    blocks = _both_sides(transform, tile_grads.reshape(SPAN, SPAN, n, tiles_h, tiles_w, c),
                         "ai,abntuc->ntuibc;bj,ntuibc->ntuijc")
    grad = xp.zeros((n, TILE * tiles_h + 2, TILE * tiles_w + 2, c), dtype=tile_grads.dtype)
    for i in range(SPAN):
        for j in range(SPAN):
            grad[:, i:i + TILE * tiles_h:TILE, j:j + TILE * tiles_w:TILE] += blocks[:, :, :, i, j]
    return xp.ascontiguousarray(grad[:, padding:padding + h, padding:padding + w])
