"""The Winograd transforms on the host: the tiles' one parallel Numba loop over the rows of tiles each.

A tile's 2-D transform is two passes of a 1-D one, and a row of tiles shares the first:
each task takes one row of tiles of one image, applies the 1-D transform down the block
rows of the whole row at once (one pass over a strip of the map), then across each tile.
Every 1-D transform reads six (or four) equally spaced vectors and writes six (or four),
the matrices written out as the sums they make (most of their entries are 0 or +-1); the
vectors are contiguous slices, which the compiler vectorises. Transforming tile by tile,
with strided views of the channels, took 1.1-2.4x the CPU time (1.24x over the calls
on ResNet18's four map sizes). The transformed values are point-major, (36, tiles, C), so
that the 36 GEMMs read and write contiguous matrices (tile-major, (tiles, 36, C), the
products of 64 channels ran 1.3x slower); the loops take the points in their outer loop
and the tiles of the row in the inner one, so that each 1-D transform's six vectors extend
six contiguous runs, one per point, where taking a tile's 36 points together wrote 36 runs
at once and ran 1.4-2x slower on 64 channels.

The filters' transform and its adjoint run the same way over blocks of
:data:`FILTER_COLUMNS` (channel, filter) pairs, ``G`` as a diagonal scaling of a matrix of
small integers: a (36, 9) by (9, C*K) GEMM, which OpenBLAS runs at a few GB/s, took twice
their time. :mod:`~pydtnn_lite.kernels.winograd` holds the NumPy versions these are
checked against.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from pydtnn_lite.kernels.cpu import ParallelLoop
from pydtnn_lite.kernels.winograd import FILTER_SCALES, POINTS, SPAN, TILE, tile_counts

_F = np.float32  # the constants' type: exact, and no wider than the data in float32
FILTER_COLUMNS = 1024  # (channel, filter) pairs per task of the filters' transform: rows of 4 KiB in float32

# The slicing helpers are inlined into each transform: called, they cost the transforms
# 1.17x their CPU time.


@njit(cache=True, inline="always")
def _three(array, start, step, length):  # pragma: no cover (compiled)
    """Three vectors of ``length`` in flat ``array``, ``step`` apart from ``start``."""
    return (array[start:start + length], array[start + step:start + step + length],
            array[start + 2 * step:start + 2 * step + length])


@njit(cache=True, inline="always")
def _four(array, start, step, length):  # pragma: no cover (compiled)
    """Four vectors of ``length`` in flat ``array``, ``step`` apart from ``start``."""
    return (array[start:start + length], array[start + step:start + step + length],
            array[start + 2 * step:start + 2 * step + length], array[start + 3 * step:start + 3 * step + length])


@njit(cache=True, inline="always")
def _six(array, start, step, length):  # pragma: no cover (compiled)
    """Six vectors of ``length`` in flat ``array``, ``step`` apart from ``start``."""
    return (array[start:start + length], array[start + step:start + step + length],
            array[start + 2 * step:start + 2 * step + length], array[start + 3 * step:start + 3 * step + length],
            array[start + 4 * step:start + 4 * step + length], array[start + 5 * step:start + 5 * step + length])


@njit(cache=True, inline="always")
def _point_row(row, tiles, tile, channels):  # pragma: no cover (compiled)
    """In a point-major (36, ``tiles``, ``channels``) array, flat, where ``tile``'s point
    (``row``, 0) starts: its six points of that row lie ``tiles * channels`` apart."""
    return (row * SPAN * tiles + tile) * channels


@njit(cache=True)
def _b_t(src, s, step, dst, d, dstep, length):  # pragma: no cover (compiled)
    """``B^T`` of six vectors of ``src`` (from ``s``, ``step`` apart) into six of ``dst`` (likewise)."""
    s0, s1, s2, s3, s4, s5 = _six(src, s, step, length)
    o0, o1, o2, o3, o4, o5 = _six(dst, d, dstep, length)
    for e in range(length):
        d0, d1, d2, d3, d4, d5 = s0[e], s1[e], s2[e], s3[e], s4[e], s5[e]
        o0[e] = _F(4) * d0 - _F(5) * d2 + d4
        o1[e] = d3 + d4 - _F(4) * (d1 + d2)
        o2[e] = _F(4) * (d1 - d2) + d4 - d3
        o3[e] = _F(2) * (d3 - d1) + d4 - d2
        o4[e] = _F(2) * (d1 - d3) + d4 - d2
        o5[e] = _F(4) * d1 - _F(5) * d3 + d5


@njit(cache=True)
def _b_added(src, s, step, dst, d, dstep, length):  # pragma: no cover (compiled)
    """``B`` (the adjoint of ``B^T``) of six vectors of ``src``, added to six of ``dst``."""
    s0, s1, s2, s3, s4, s5 = _six(src, s, step, length)
    o0, o1, o2, o3, o4, o5 = _six(dst, d, dstep, length)
    for e in range(length):
        v0, v1, v2, v3, v4, v5 = s0[e], s1[e], s2[e], s3[e], s4[e], s5[e]
        o0[e] += _F(4) * v0
        o1[e] += _F(4) * (v2 - v1 + v5) + _F(2) * (v4 - v3)
        o2[e] += -_F(5) * v0 - _F(4) * (v1 + v2) - v3 - v4
        o3[e] += v1 - v2 + _F(2) * (v3 - v4) - _F(5) * v5
        o4[e] += v0 + v1 + v2 + v3 + v4
        o5[e] += v5


@njit(cache=True)
def _a_t(src, s, step, dst, d, dstep, length):  # pragma: no cover (compiled)
    """``A^T``: six vectors of ``src`` to four of ``dst``."""
    s0, s1, s2, s3, s4, s5 = _six(src, s, step, length)
    o0, o1, o2, o3 = _four(dst, d, dstep, length)
    for e in range(length):
        m0, m1, m2, m3, m4, m5 = s0[e], s1[e], s2[e], s3[e], s4[e], s5[e]
        o0[e] = m0 + m1 + m2 + m3 + m4
        o1[e] = m1 - m2 + _F(2) * (m3 - m4)
        o2[e] = m1 + m2 + _F(4) * (m3 + m4)
        o3[e] = m1 - m2 + _F(8) * (m3 - m4) + m5


@njit(cache=True)
def _a(src, s, step, dst, d, dstep, length):  # pragma: no cover (compiled)
    """``A`` (the adjoint of ``A^T``): four vectors of ``src`` to six of ``dst``."""
    s0, s1, s2, s3 = _four(src, s, step, length)
    o0, o1, o2, o3, o4, o5 = _six(dst, d, dstep, length)
    for e in range(length):
        g0, g1, g2, g3 = s0[e], s1[e], s2[e], s3[e]
        o0[e] = g0
        o1[e] = g0 + g1 + g2 + g3
        o2[e] = g0 - g1 + g2 - g3
        o3[e] = g0 + _F(2) * g1 + _F(4) * g2 + _F(8) * g3
        o4[e] = g0 - _F(2) * g1 + _F(4) * g2 - _F(8) * g3
        o5[e] = g3


@njit(cache=True)
def _g(src, s, step, dst, d, dstep, length, scales):  # pragma: no cover (compiled)
    """``G``: three vectors of ``src`` to six of ``dst``, the integer matrix's rows scaled by ``scales``."""
    s0, s1, s2 = _three(src, s, step, length)
    o0, o1, o2, o3, o4, o5 = _six(dst, d, dstep, length)
    c0, c1, c2, c3, c4, c5 = scales[0], scales[1], scales[2], scales[3], scales[4], scales[5]
    for e in range(length):
        g0, g1, g2 = s0[e], s1[e], s2[e]
        o0[e] = c0 * g0
        o1[e] = -c1 * (g0 + g1 + g2)
        o2[e] = c2 * (g1 - g0 - g2)
        o3[e] = c3 * (g0 + _F(2) * g1 + _F(4) * g2)
        o4[e] = c4 * (g0 - _F(2) * g1 + _F(4) * g2)
        o5[e] = c5 * g2


@njit(cache=True)
def _g_t(src, s, step, dst, d, dstep, length, scales):  # pragma: no cover (compiled)
    """``G^T`` (the adjoint of :func:`_g`): six vectors of ``src`` to three of ``dst``."""
    s0, s1, s2, s3, s4, s5 = _six(src, s, step, length)
    o0, o1, o2 = _three(dst, d, dstep, length)
    c0, c1, c2, c3, c4, c5 = scales[0], scales[1], scales[2], scales[3], scales[4], scales[5]
    for e in range(length):
        v0, v1, v2, v3, v4, v5 = c0 * s0[e], c1 * s1[e], c2 * s2[e], c3 * s3[e], c4 * s4[e], c5 * s5[e]
        o0[e] = v0 - v1 - v2 + v3 + v4
        o1[e] = v2 - v1 + _F(2) * (v3 - v4)
        o2[e] = _F(4) * (v3 + v4) - v1 - v2 + v5


@ParallelLoop
def _filter_tiles(weight, scales, tiles):  # pragma: no cover (compiled)
    # The weight as (9, n) taps by (channel, filter) pairs, the tiles as (36, n): a task
    # transforms a block of columns down the filters' rows, then across.
    flat_weight, flat_tiles = weight.reshape(-1), tiles.reshape(-1)
    n = flat_weight.size // 9
    for task in prange((n + FILTER_COLUMNS - 1) // FILTER_COLUMNS):
        start = task * FILTER_COLUMNS
        length = min(n, start + FILTER_COLUMNS) - start
        down = np.empty(SPAN * 3 * length, dtype=weight.dtype)  # [3 * transformed row + column, pair]
        for j in range(3):
            _g(flat_weight, j * n + start, 3 * n, down, j * length, 3 * length, length, scales)
        for a in range(SPAN):
            _g(down, 3 * a * length, length, flat_tiles, SPAN * a * n + start, n, length, scales)


def filter_tiles(weight: np.ndarray) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.filter_tiles`."""
    _, _, c, k = weight.shape
    tiles = np.empty((POINTS, c, k), dtype=weight.dtype)
    _filter_tiles(np.ascontiguousarray(weight), FILTER_SCALES.astype(weight.dtype), tiles)
    return tiles


@ParallelLoop
def _filter_tiles_grad(tile_grads, scales, grad):  # pragma: no cover (compiled)
    flat_tile_grads, flat_grad = tile_grads.reshape(-1), grad.reshape(-1)
    n = flat_grad.size // 9
    for task in prange((n + FILTER_COLUMNS - 1) // FILTER_COLUMNS):
        start = task * FILTER_COLUMNS
        length = min(n, start + FILTER_COLUMNS) - start
        across = np.empty(SPAN * 3 * length, dtype=grad.dtype)  # [3 * transformed row + column, pair]
        for a in range(SPAN):
            _g_t(flat_tile_grads, SPAN * a * n + start, n, across, 3 * a * length, length, length, scales)
        for j in range(3):
            _g_t(across, j * length, 3 * length, flat_grad, j * n + start, 3 * n, length, scales)


def filter_tiles_grad(tile_grads: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.filter_tiles_grad` (``out`` contiguous)."""
    _filter_tiles_grad(np.ascontiguousarray(tile_grads), FILTER_SCALES.astype(tile_grads.dtype), out)
    return out


@ParallelLoop
def _input_tiles(x, tiles_h, tiles_w, padding, tiles):  # pragma: no cover (compiled)
    # A row of tiles reads six rows of the map, padded by ``padding`` zeros on the left and
    # as many on the right as its blocks reach: a strip ``width`` wide. Rows inside the map
    # are transformed down in place; a row of tiles at the top or bottom edge copies its
    # rows into a zeroed strip first.
    n, h, w, c = x.shape
    total = n * tiles_h * tiles_w
    width = (TILE * tiles_w + 2) * c
    flat_x, flat_tiles = x.reshape(-1), tiles.reshape(-1)
    for task in prange(n * tiles_h):
        image, tile_row = task // tiles_h, task % tiles_h
        y0 = tile_row * TILE - padding
        down = np.zeros(SPAN * width, dtype=x.dtype)  # [transformed row, strip column]
        if 0 <= y0 and y0 + SPAN <= h:
            _b_t(flat_x, (image * h + y0) * w * c, w * c, down, padding * c, width, w * c)
        else:
            strip = np.zeros(SPAN * width, dtype=x.dtype)
            for i in range(max(0, -y0), min(SPAN, h - y0)):
                start = (image * h + y0 + i) * w * c
                strip[i * width + padding * c:i * width + (padding + w) * c] = flat_x[start:start + w * c]
            _b_t(strip, 0, width, down, 0, width, width)
        for a in range(SPAN):
            for tile_col in range(tiles_w):
                _b_t(down, a * width + tile_col * TILE * c, c,
                     flat_tiles, _point_row(a, total, task * tiles_w + tile_col, c), total * c, c)


def input_tiles(x: np.ndarray, padding: int, tiles_h: int, tiles_w: int) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.input_tiles`, the padding never materialised."""
    tiles = np.empty((POINTS, x.shape[0] * tiles_h * tiles_w, x.shape[3]), dtype=x.dtype)
    _input_tiles(np.ascontiguousarray(x), tiles_h, tiles_w, padding, tiles)
    return tiles


@ParallelLoop
def _output_tiles(products, tiles_h, tiles_w, out):  # pragma: no cover (compiled)
    n, out_h, out_w, k = out.shape
    total = n * tiles_h * tiles_w
    width = TILE * tiles_w * k  # a row of the tiles' outputs, flattened
    flat_products, flat_out = products.reshape(-1), out.reshape(-1)
    for task in prange(n * tiles_h):
        image, tile_row = task // tiles_h, task % tiles_h
        y0 = tile_row * TILE
        across = np.empty(SPAN * width, dtype=out.dtype)  # [product row, output column]
        for i in range(SPAN):
            for tile_col in range(tiles_w):
                _a_t(flat_products, _point_row(i, total, task * tiles_w + tile_col, k), total * k,
                     across, i * width + tile_col * TILE * k, k, k)
        rows, start = min(TILE, out_h - y0), (image * out_h + y0) * out_w * k
        if rows == TILE:  # columns beyond the output lie at the ends of the rows: left out
            _a_t(across, 0, width, flat_out, start, out_w * k, out_w * k)
            continue
        down = np.empty(TILE * width, dtype=out.dtype)  # a partial row of tiles: transformed whole, cropped
        _a_t(across, 0, width, down, 0, width, width)
        for a in range(rows):
            flat_out[start + a * out_w * k:start + (a + 1) * out_w * k] = down[a * width:a * width + out_w * k]


def output_tiles(products: np.ndarray, out_shape: tuple) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.output_tiles`."""
    out = np.empty(out_shape, dtype=products.dtype)
    _output_tiles(np.ascontiguousarray(products), *tile_counts(out_shape[1], out_shape[2]), out)
    return out


@ParallelLoop
def _output_tiles_grad(grad_out, tiles_h, tiles_w, grads):  # pragma: no cover (compiled)
    n, out_h, out_w, k = grad_out.shape
    total = n * tiles_h * tiles_w
    width = TILE * tiles_w * k
    flat_grad_out, flat_grads = grad_out.reshape(-1), grads.reshape(-1)
    for task in prange(n * tiles_h):
        image, tile_row = task // tiles_h, task % tiles_h
        y0 = tile_row * TILE
        down = np.empty(SPAN * width, dtype=grad_out.dtype)  # [transformed row, gradient column]
        if y0 + TILE <= out_h and out_w * k == width:
            _a(flat_grad_out, (image * out_h + y0) * width, width, down, 0, width, width)
        else:  # a partial row or column of tiles reads zeros beyond the output
            strip = np.zeros(TILE * width, dtype=grad_out.dtype)
            for a in range(min(TILE, out_h - y0)):
                start = (image * out_h + y0 + a) * out_w * k
                strip[a * width:a * width + out_w * k] = flat_grad_out[start:start + out_w * k]
            _a(strip, 0, width, down, 0, width, width)
        for i in range(SPAN):
            for tile_col in range(tiles_w):
                _a(down, i * width + tile_col * TILE * k, k,
                   flat_grads, _point_row(i, total, task * tiles_w + tile_col, k), total * k, k)


def output_tiles_grad(grad_out: np.ndarray) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.output_tiles_grad`."""
    n, out_h, out_w, k = grad_out.shape
    tiles_h, tiles_w = tile_counts(out_h, out_w)
    grads = np.empty((POINTS, n * tiles_h * tiles_w, k), dtype=grad_out.dtype)
    _output_tiles_grad(np.ascontiguousarray(grad_out), tiles_h, tiles_w, grads)
    return grads


@ParallelLoop
def _input_tiles_grad(tile_grads, tiles_h, tiles_w, padding, bands, grad):  # pragma: no cover (compiled)
    # A task walks one band of an image's rows of tiles top to bottom: each row's blocks are
    # added across into a strip, transformed down and added to six accumulated rows, of
    # which the top four are then complete and copied out, the bottom two (the next row of
    # tiles overlaps them) carried. So each row of the gradient is written once, never read.
    # A band starts a row of tiles early, to carry in what its first rows owe to that one.
    n, h, w, c = grad.shape
    total = n * tiles_h * tiles_w
    width = (TILE * tiles_w + 2) * c
    band_rows = (tiles_h + bands - 1) // bands
    flat_tile_grads, flat_grad = tile_grads.reshape(-1), grad.reshape(-1)
    for task in prange(n * bands):
        image, first = task // bands, task % bands * band_rows
        rows = np.zeros(SPAN * width, dtype=grad.dtype)  # [row down from the row of tiles' top, strip column]
        across = np.empty(SPAN * width, dtype=grad.dtype)
        for tile_row in range(max(first - 1, 0), min(first + band_rows, tiles_h)):
            across[:] = 0
            row_start = (image * tiles_h + tile_row) * tiles_w  # the row's first tile
            for a in range(SPAN):
                for tile_col in range(tiles_w):
                    _b_added(flat_tile_grads, _point_row(a, total, row_start + tile_col, c), total * c,
                             across, a * width + tile_col * TILE * c, c, c)
            _b_added(across, 0, width, rows, 0, width, width)
            if tile_row >= first:
                y0 = tile_row * TILE - padding
                for i in range(SPAN if tile_row == tiles_h - 1 else TILE):  # the last row of tiles owes no carry
                    if 0 <= y0 + i < h:
                        start = (image * h + y0 + i) * w * c
                        flat_grad[start:start + w * c] = rows[i * width + padding * c:i * width + (padding + w) * c]
            rows[:2 * width] = rows[TILE * width:]
            rows[2 * width:] = 0


def input_tiles_grad(tile_grads: np.ndarray, x_shape: tuple, padding: int) -> np.ndarray:
    """:func:`~pydtnn_lite.kernels.winograd.input_tiles_grad`, the padding never materialised."""
    n, h, w, _ = x_shape
    tiles_h, tiles_w = tile_counts(h + 2 * padding - 2, w + 2 * padding - 2)
    # Bands of rows of tiles split an image only where there are fewer images than threads:
    # each band costs one row of tiles done twice.
    bands = min(tiles_h, -(-numba.get_num_threads() // n))
    grad = np.empty(x_shape, dtype=tile_grads.dtype)  # every row is written
    _input_tiles_grad(np.ascontiguousarray(tile_grads), tiles_h, tiles_w, padding, bands, grad)
    return grad
