"""The Winograd tile transforms on the host: one parallel Numba loop over the tiles each.

A tile's 2-D transform is two passes of a 1-D one: over the rows of its block, into a
scratch block, then over the columns. Each pass is a loop over the channels that reads
six (or four) rows of channels and writes six (or four), the matrices written out as the
sums they make (most of their entries are 0 or +-1). With so few rows in one loop the
compiler vectorises it over the channels; the whole 2-D transform in one channel loop
(36 loads and 36 stores) stayed scalar and ran 1.3-1.5x slower. The transformed values
are stored tile by tile, (tiles, 36, C): the 36 GEMMs then read strided matrices, where a
point-major layout (36, tiles, C) made the loops write 36 streams at once and ran them
2-3x slower. :mod:`~pydtnn_lite.kernels.winograd` holds the NumPy versions these are
checked against.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from pydtnn_lite.kernels.cpu import ParallelLoop
from pydtnn_lite.kernels.winograd import POINTS, SPAN, TILE, tile_counts

_F = np.float32  # the constants' type: exact, and no wider than the data in float32


@njit(cache=True)
def _b_t(src, dst):  # pragma: no cover (compiled)
    """``dst = B^T src`` over six rows of channels."""
    for ch in range(src.shape[1]):
        d0, d1, d2, d3, d4, d5 = src[0, ch], src[1, ch], src[2, ch], src[3, ch], src[4, ch], src[5, ch]
        dst[0, ch] = _F(4) * d0 - _F(5) * d2 + d4
        dst[1, ch] = d3 + d4 - _F(4) * (d1 + d2)
        dst[2, ch] = _F(4) * (d1 - d2) + d4 - d3
        dst[3, ch] = _F(2) * (d3 - d1) + d4 - d2
        dst[4, ch] = _F(2) * (d1 - d3) + d4 - d2
        dst[5, ch] = _F(4) * d1 - _F(5) * d3 + d5


@njit(cache=True)
def _b(src, dst):  # pragma: no cover (compiled)
    """``dst = B src`` (B the adjoint of B^T) over six rows of channels."""
    for ch in range(src.shape[1]):
        v0, v1, v2, v3, v4, v5 = src[0, ch], src[1, ch], src[2, ch], src[3, ch], src[4, ch], src[5, ch]
        dst[0, ch] = _F(4) * v0
        dst[1, ch] = _F(4) * (v2 - v1 + v5) + _F(2) * (v4 - v3)
        dst[2, ch] = -_F(5) * v0 - _F(4) * (v1 + v2) - v3 - v4
        dst[3, ch] = v1 - v2 + _F(2) * (v3 - v4) - _F(5) * v5
        dst[4, ch] = v0 + v1 + v2 + v3 + v4
        dst[5, ch] = v5


@njit(cache=True)
def _a_t(src, dst):  # pragma: no cover (compiled)
    """``dst = A^T src``: six rows of channels to four."""
    for ch in range(src.shape[1]):
        m0, m1, m2, m3, m4, m5 = src[0, ch], src[1, ch], src[2, ch], src[3, ch], src[4, ch], src[5, ch]
        dst[0, ch] = m0 + m1 + m2 + m3 + m4
        dst[1, ch] = m1 - m2 + _F(2) * (m3 - m4)
        dst[2, ch] = m1 + m2 + _F(4) * (m3 + m4)
        dst[3, ch] = m1 - m2 + _F(8) * (m3 - m4) + m5


@njit(cache=True)
def _a(src, dst):  # pragma: no cover (compiled)
    """``dst = A src`` (A the adjoint of A^T): four rows of channels to six."""
    for ch in range(src.shape[1]):
        g0, g1, g2, g3 = src[0, ch], src[1, ch], src[2, ch], src[3, ch]
        dst[0, ch] = g0
        dst[1, ch] = g0 + g1 + g2 + g3
        dst[2, ch] = g0 - g1 + g2 - g3
        dst[3, ch] = g0 + _F(2) * g1 + _F(4) * g2 + _F(8) * g3
        dst[4, ch] = g0 - _F(2) * g1 + _F(4) * g2 - _F(8) * g3
        dst[5, ch] = g3


@njit(cache=True)
def _tile_origin(t, tiles_h, tiles_w):  # pragma: no cover (compiled)
    """(image, first row, first column) of tile ``t``, tiles numbered row-major per image."""
    image, r = t // (tiles_h * tiles_w), t % (tiles_h * tiles_w)
    return image, (r // tiles_w) * TILE, (r % tiles_w) * TILE


@ParallelLoop
def _input_tiles(x, tiles_h, tiles_w, padding, tiles):  # pragma: no cover (compiled)
    # Block pixels in the padding read as zeros: a block row wholly outside transforms to
    # zeros, one partly outside is copied into a zeroed row first.
    n, h, w, c = x.shape
    for t in prange(n * tiles_h * tiles_w):
        image, y0, x0 = _tile_origin(t, tiles_h, tiles_w)
        y0, x0 = y0 - padding, x0 - padding
        across = np.zeros((SPAN, SPAN, c), dtype=x.dtype)  # [block row, transformed column]
        inside = max(0, -x0), min(SPAN, w - x0)
        edge = np.zeros((SPAN, c), dtype=x.dtype)
        for i in range(max(0, -y0), min(SPAN, h - y0)):
            if inside == (0, SPAN):
                _b_t(x[image, y0 + i, x0:x0 + SPAN], across[i])
                continue
            edge[inside[0]:inside[1]] = x[image, y0 + i, x0 + inside[0]:x0 + inside[1]]
            _b_t(edge, across[i])
        for b in range(SPAN):
            _b_t(across[:, b], tiles[t, b::SPAN])


def input_tiles(x: np.ndarray, padding: int, tiles_h: int, tiles_w: int) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.input_tiles`, the padding never materialised."""
    tiles = np.empty((x.shape[0] * tiles_h * tiles_w, POINTS, x.shape[3]), dtype=x.dtype)
    _input_tiles(np.ascontiguousarray(x), tiles_h, tiles_w, padding, tiles)
    return tiles


@ParallelLoop
def _output_tiles(products, tiles_h, tiles_w, out):  # pragma: no cover (compiled)
    n, out_h, out_w, k = out.shape
    for t in prange(n * tiles_h * tiles_w):
        image, y0, x0 = _tile_origin(t, tiles_h, tiles_w)
        down = np.empty((TILE, SPAN, k), dtype=out.dtype)  # [output row, product column]
        for b in range(SPAN):
            _a_t(products[t, b::SPAN], down[:, b])
        rows, cols = min(TILE, out_h - y0), min(TILE, out_w - x0)
        if cols == TILE:
            for a in range(rows):
                _a_t(down[a], out[image, y0 + a, x0:x0 + TILE])
            continue
        row = np.empty((TILE, k), dtype=out.dtype)  # a partial tile: transform whole, keep what fits
        for a in range(rows):
            _a_t(down[a], row)
            out[image, y0 + a, x0:x0 + cols] = row[:cols]


def output_tiles(products: np.ndarray, out_shape: tuple) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.output_tiles`."""
    out = np.empty(out_shape, dtype=products.dtype)
    _output_tiles(products, *tile_counts(out_shape[1], out_shape[2]), out)
    return out


@ParallelLoop
def _output_tiles_grad(whole, tiles_h, tiles_w, grads):  # pragma: no cover (compiled)
    n, _, _, k = whole.shape
    for t in prange(n * tiles_h * tiles_w):
        image, y0, x0 = _tile_origin(t, tiles_h, tiles_w)
        across = np.empty((TILE, SPAN, k), dtype=whole.dtype)  # [gradient row, transformed column]
        for a in range(TILE):
            _a(whole[image, y0 + a, x0:x0 + TILE], across[a])
        for j in range(SPAN):
            _a(across[:, j], grads[t, j::SPAN])


def output_tiles_grad(grad_out: np.ndarray) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.output_tiles_grad`."""
    n, out_h, out_w, k = grad_out.shape
    tiles_h, tiles_w = tile_counts(out_h, out_w)
    whole = np.ascontiguousarray(grad_out)
    if (out_h, out_w) != (TILE * tiles_h, TILE * tiles_w):  # partial tiles read zeros beyond the output
        whole = np.zeros((n, TILE * tiles_h, TILE * tiles_w, k), dtype=grad_out.dtype)
        whole[:, :out_h, :out_w] = grad_out
    grads = np.empty((n * tiles_h * tiles_w, POINTS, k), dtype=grad_out.dtype)
    _output_tiles_grad(whole, tiles_h, tiles_w, grads)
    return grads


@ParallelLoop
def _input_tiles_grad(tile_grads, tiles_h, tiles_w, padding, parity, grad):  # pragma: no cover (compiled)
    # A task is one row of tiles, added left to right; rows of one parity never overlap
    # (a block is 6 rows high, its neighbour below starts 4 rows down), so no two threads
    # add to one element. Block pixels in the padding are dropped.
    n, h, w, c = grad.shape
    rows_of_parity = (tiles_h - parity + 1) // 2
    for task in prange(n * rows_of_parity):
        image, tile_row = task // rows_of_parity, 2 * (task % rows_of_parity) + parity
        y0 = tile_row * TILE - padding
        down = np.empty((SPAN, SPAN, c), dtype=grad.dtype)  # [block row, transformed column]
        row = np.empty((SPAN, c), dtype=grad.dtype)
        for tile_col in range(tiles_w):
            x0 = tile_col * TILE - padding
            t = (image * tiles_h + tile_row) * tiles_w + tile_col
            for b in range(SPAN):
                _b(tile_grads[t, b::SPAN], down[:, b])
            for i in range(max(0, -y0), min(SPAN, h - y0)):
                _b(down[i], row)
                target = grad[image, y0 + i]
                for j in range(max(0, -x0), min(SPAN, w - x0)):
                    for ch in range(c):
                        target[x0 + j, ch] += row[j, ch]


def input_tiles_grad(tile_grads: np.ndarray, x_shape: tuple, padding: int) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.input_tiles_grad`, the padding never materialised."""
    _, h, w, _ = x_shape
    tiles_h, tiles_w = tile_counts(h + 2 * padding - 2, w + 2 * padding - 2)
    grad = np.zeros(x_shape, dtype=tile_grads.dtype)
    for parity in (0, 1):
        _input_tiles_grad(tile_grads, tiles_h, tiles_w, padding, parity, grad)
    return grad
