"""The Numba host kernels (kernels/cpu.py) against the NumPy reference kernels they replace."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from pydtnn_lite import kernels
from pydtnn_lite.backend import make_backend
from pydtnn_lite.kernels import conv, cpu, elementwise, normalization, pooling, update, winograd, winograd_cpu
from pydtnn_lite.kernels.layout import row_stride
from pydtnn_lite.layers import Dense
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Adam
from pydtnn_lite.optim.adam import EPSILON_FORMS

DTYPES = (np.float32, np.float64)
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}
# Batch-norm statistics: float32 deviations are summed in float32 over runs of 16 rows, well
# within the input's own precision.
STATISTICS_TOLERANCE = {np.float32: 1e-6, np.float64: 1e-9}


def normal(shape, dtype, seed=0, offset=0.0):
    return (offset + np.random.default_rng(seed).normal(size=shape)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kernel,stride,padding", [
    ((2, 7, 6, 3), 3, 1, 1), ((2, 9, 8, 3), 5, 2, 2), ((1, 8, 8, 2), 3, 2, 0), ((2, 6, 6, 4), 1, 2, 0)])
def test_im2col_and_col2im_match_numpy(dtype, shape, kernel, stride, padding):
    x = normal(shape, dtype)
    cols = cpu.im2col(x, kernel, kernel, stride, padding)
    np.testing.assert_array_equal(cols, conv.im2col(x, kernel, kernel, stride, padding))
    grad_cols = normal(cols.shape, dtype, seed=1)
    np.testing.assert_allclose(cpu.col2im(grad_cols, shape, kernel, kernel, stride, padding),
                               conv.col2im(grad_cols, shape, kernel, kernel, stride, padding),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,padding", [((2, 8, 8, 3), 1), ((3, 7, 6, 5), 1), ((2, 9, 7, 4), 0), ((1, 6, 5, 2), 2),
                                           ((1, 17, 9, 3), 1)])
def test_winograd_transforms_match_numpy(dtype, shape, padding):
    """Whole and partial tiles (outputs of 8x8, 7x6, 7x5, 8x7 and 17x9 pixels), with 0-2 pixels of
    padding; the one image of 17 rows split into bands of rows of tiles on two threads."""
    n, h, w, c = shape
    out_h, out_w = h + 2 * padding - 2, w + 2 * padding - 2
    tiles_h, tiles_w = winograd.tile_counts(out_h, out_w)
    x = normal(shape, dtype)
    tiles = winograd_cpu.input_tiles(x, padding, tiles_h, tiles_w)
    np.testing.assert_allclose(tiles, winograd.input_tiles(x, padding, tiles_h, tiles_w),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    np.testing.assert_allclose(winograd_cpu.input_tiles_grad(tiles, shape, padding),
                               winograd.input_tiles_grad(tiles, shape, padding),
                               rtol=TOLERANCE[dtype], atol=100 * TOLERANCE[dtype])
    products = normal(tiles.shape[:2] + (3,), dtype, seed=1)
    out_shape = (n, out_h, out_w, 3)
    np.testing.assert_allclose(winograd_cpu.output_tiles(products, out_shape),
                               winograd.output_tiles(products, out_shape), rtol=TOLERANCE[dtype],
                               atol=10 * TOLERANCE[dtype])
    grad_out = normal(out_shape, dtype, seed=2)
    np.testing.assert_allclose(winograd_cpu.output_tiles_grad(grad_out), winograd.output_tiles_grad(grad_out),
                               rtol=TOLERANCE[dtype], atol=10 * TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels,filters", [(1, 1), (3, 5), (64, 64), (48, 100)])
def test_winograd_filter_transforms_match_numpy(dtype, channels, filters):
    """One partial block of (channel, filter) pairs, whole ones, and whole ones with a partial one
    after them (4800 pairs: four blocks of 1024 and one of 704)."""
    weight = normal((3, 3, channels, filters), dtype)
    tiles = winograd_cpu.filter_tiles(weight)
    np.testing.assert_allclose(tiles, winograd.filter_tiles(weight), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    tile_grads = normal((36, channels, filters), dtype, seed=1)
    out = np.full(weight.shape, np.nan, dtype=dtype)
    assert winograd_cpu.filter_tiles_grad(tile_grads, out) is out
    np.testing.assert_allclose(out, winograd.filter_tiles_grad(tile_grads, np.empty_like(out)),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_winograd_filter_transform_is_g_g_gt_of_every_filter():
    """Independent of the (36, 9) matrix the NumPy version multiplies by: G g G^T, filter by filter."""
    weight = normal((3, 3, 2, 3), np.float64)
    g = winograd._FILTER_POINTS
    expected = np.stack([[g @ weight[:, :, c, k] @ g.T for k in range(3)] for c in range(2)])  # (C, K, 6, 6)
    np.testing.assert_allclose(winograd_cpu.filter_tiles(weight),
                               expected.reshape(2, 3, 36).transpose(2, 0, 1), rtol=1e-12, atol=1e-15)


def test_winograd_transforms_are_each_others_adjoints():
    """<input_tiles(x), v> = <x, input_tiles_grad(v)> and likewise for the output and the filters'
    transforms: what makes the backward pass the gradient of the forward one."""
    x, tiles_grad = normal((2, 7, 6, 3), np.float64), normal((36, 8, 3), np.float64, seed=1)
    assert np.vdot(winograd_cpu.input_tiles(x, 1, 2, 2), tiles_grad) == pytest.approx(
        np.vdot(x, winograd_cpu.input_tiles_grad(tiles_grad, x.shape, 1)), rel=1e-12)
    products, grad_out = normal((36, 8, 3), np.float64, seed=2), normal((2, 7, 6, 3), np.float64, seed=3)
    assert np.vdot(winograd_cpu.output_tiles(products, grad_out.shape), grad_out) == pytest.approx(
        np.vdot(products, winograd_cpu.output_tiles_grad(grad_out)), rel=1e-12)
    weight, filter_grads = normal((3, 3, 40, 30), np.float64, seed=4), normal((36, 40, 30), np.float64, seed=5)
    assert np.vdot(winograd_cpu.filter_tiles(weight), filter_grads) == pytest.approx(
        np.vdot(weight, winograd_cpu.filter_tiles_grad(filter_grads, np.empty_like(weight))), rel=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_kernels_match_numpy(dtype):
    x, grad, third = (normal((3, 5, 4, 7), dtype, seed) for seed in range(3))
    out = cpu.relu(x)
    np.testing.assert_array_equal(out, elementwise.relu(x))
    np.testing.assert_array_equal(cpu.relu_grad(grad, out), elementwise.relu_grad(grad, out))
    np.testing.assert_array_equal(cpu.add([x, grad]), elementwise.add([x, grad]))
    np.testing.assert_allclose(cpu.add([x, grad, third]), elementwise.add([x, grad, third]), rtol=1e-6)


@pytest.mark.parametrize("parallel_elements", [0, cpu.CONCAT_PARALLEL_ELEMENTS])
def test_concat_matches_numpy(parallel_elements, monkeypatch):
    """Three inputs, one a channel slice (a view whose rows are not contiguous), through the
    threads' copy and through NumPy's below its size threshold; and with a read-only input,
    which the compiled copy cannot take with the others."""
    monkeypatch.setattr(cpu, "CONCAT_PARALLEL_ELEMENTS", parallel_elements)
    first, wide, third = (normal((2, 5, 3, channels), np.float32, seed) for seed, channels in enumerate((4, 9, 1)))
    inputs = [first, wide[..., 2:7], third]
    np.testing.assert_array_equal(cpu.concat(inputs), np.concatenate(inputs, axis=-1))
    third.flags.writeable = False
    np.testing.assert_array_equal(cpu.concat(inputs), np.concatenate(inputs, axis=-1))


@pytest.mark.parametrize("parallel_elements", [0, cpu.CONCAT_PARALLEL_ELEMENTS])
def test_concat_writes_into_a_channel_slice_of_a_wider_map(parallel_elements, monkeypatch):
    """A dense block's join: the inputs written into their channels of a shared buffer, in
    place, every other channel left as it was; NumPy's version the same."""
    monkeypatch.setattr(cpu, "CONCAT_PARALLEL_ELEMENTS", parallel_elements)
    first, second = normal((2, 5, 3, 4), np.float32, seed=1), normal((2, 5, 3, 2), np.float32, seed=2)
    for concat in (cpu.concat, elementwise.concat):
        buffer = normal((2, 5, 3, 9), np.float32, seed=3)
        expected = buffer.copy()
        expected[..., 3:9] = np.concatenate([first, second], axis=-1)
        assert concat([first, second], out=buffer[..., 3:9]).base is buffer
        np.testing.assert_array_equal(buffer, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_host_total_is_numpys_sum_and_lets_nan_and_inf_through(dtype):
    """The divergence check's sum of a step's gradients: NumPy's sum to rounding, and NaN or
    inf wherever an element is one, or where the sum overflows."""
    backend = make_backend("cpu", dtype.__name__)
    values = np.random.default_rng(5).normal(size=100_002).astype(dtype)
    rounding = (1e-6 if dtype == np.float32 else 1e-14) * float(np.abs(values).sum())
    assert backend.total(values) == pytest.approx(float(values.sum()), abs=rounding)
    columns = values.reshape(-1, 3)[:, :2]  # a strided view
    assert backend.total(columns) == pytest.approx(float(columns.sum()), abs=rounding)
    assert backend.total(np.zeros(0, dtype)) == 0.0
    for bad, expected in ((np.nan, np.isnan), (np.inf, np.isposinf), (-np.inf, np.isneginf)):
        broken = values.copy()
        broken[77_777] = bad
        assert expected(backend.total(broken))
    both = values.copy()
    both[[3, 99_999]] = np.inf, -np.inf
    assert np.isnan(backend.total(both))
    huge = np.full(4, np.finfo(dtype).max / 2, dtype)
    assert np.isposinf(backend.total(huge))


def test_relu_lets_nan_through_as_numpy_does():
    """A NaN must reach the loss, where the trainer stops before updating a weight."""
    x = np.array([np.nan, -1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(cpu.relu(x), elementwise.relu(x))
    grad = np.array([np.nan, np.nan, 1.0], dtype=np.float32)
    np.testing.assert_array_equal(cpu.relu_grad(grad, x), elementwise.relu_grad(grad, x))
    np.testing.assert_array_equal(cpu.relu_grad_sum([grad, grad], x), elementwise.relu_grad_sum([grad, grad], x))
    np.testing.assert_array_equal(cpu.add_relu([x, grad]), elementwise.add_relu([x, grad]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_relu_gradient_of_a_sum_matches_numpy(dtype):
    """Two gradients in one pass (one of them a channel slice of a wider map, read in place),
    and a third added to the second first."""
    activated = cpu.relu(normal((4, 5, 5, 6), dtype))
    wide = normal((4, 5, 5, 10), dtype, seed=1)
    terms = [normal(activated.shape, dtype, seed=2), wide[..., 2:8], normal(activated.shape, dtype, seed=3)]
    two = cpu.relu_grad_sum(terms[:2], activated)
    np.testing.assert_array_equal(two, elementwise.relu_grad_sum(terms[:2], activated))  # the same sums, in order
    assert (two == 0).any() and (two != 0).any()
    np.testing.assert_allclose(cpu.relu_grad_sum(terms, activated), elementwise.relu_grad_sum(terms, activated),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_relu_of_a_sum_matches_numpy(dtype):
    """A residual block's output: two inputs in one pass (one a channel slice of a wider map,
    read in place), and a third added to the second first."""
    wide = normal((4, 5, 5, 10), dtype, seed=1)
    inputs = [normal((4, 5, 5, 6), dtype), wide[..., 2:8], normal((4, 5, 5, 6), dtype, seed=3)]
    two = cpu.add_relu(inputs[:2])
    np.testing.assert_array_equal(two, elementwise.add_relu(inputs[:2]))  # the same sums, in order
    assert (two == 0).any() and (two > 0).any()
    np.testing.assert_allclose(cpu.add_relu(inputs), elementwise.add_relu(inputs),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 5, 5, 3), (700, 6), (0, 4), (15, 32, 32, 8)])
def test_batchnorm_kernels_match_numpy(dtype, shape):
    """Map and vector inputs, more rows than one parallel chunk, an empty share, and more rows
    than one cached block of the statistics (7.5 blocks: the last one partial)."""
    channels = shape[-1]
    x, grad = normal(shape, dtype, offset=1e3), normal(shape, dtype, seed=1)
    np.testing.assert_allclose(cpu.batchnorm_sums(x), normalization.batchnorm_sums(x),
                               rtol=STATISTICS_TOLERANCE[dtype], atol=1e-9)
    mean, inv_std, gamma, beta = (normal(channels, dtype, seed) for seed in range(2, 6))
    np.testing.assert_allclose(cpu.batchnorm_normalize(x, mean, inv_std, gamma, beta),
                               normalization.batchnorm_normalize(x, mean, inv_std, gamma, beta),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    sums = cpu.batchnorm_grad_sums(grad, x, mean, inv_std)
    assert sums.dtype == dtype
    np.testing.assert_allclose(sums, normalization.batchnorm_grad_sums(grad, x, mean, inv_std), rtol=1e-4, atol=1e-3)
    rows = max(1, x.size // channels)
    np.testing.assert_allclose(cpu.batchnorm_grad_input(grad, x, mean, inv_std, gamma, sums, rows),
                               normalization.batchnorm_grad_input(grad, x, mean, inv_std, gamma, sums, rows),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("relu", [False, True])
def test_float32_gradient_sums_hold_float32_precision_over_many_rows(relu):
    """The gradient's sums run in float32 over runs of rows, then in float64: over a map of
    131072 rows (8192 runs), with a gradient far from zero, they stay within a few float32
    roundings of the sums taken in float64."""
    x, grad = normal((128, 32, 32, 16), np.float32, offset=3.0), normal((128, 32, 32, 16), np.float32, 1, offset=1e3)
    mean, inv_std = np.full(16, 3.0, np.float32), np.full(16, 0.5, np.float32)
    gamma, beta = np.ones(16, np.float32), np.full(16, 0.2, np.float32)
    wide = [array.astype(np.float64) for array in (grad, x, mean, inv_std, gamma, beta)]
    if relu:
        sums, exact = cpu.batchnorm_relu_grad_sums(grad, x, mean, inv_std, gamma, beta), \
            normalization.batchnorm_relu_grad_sums(*wide)
    else:
        sums, exact = cpu.batchnorm_grad_sums(grad, x, mean, inv_std), normalization.batchnorm_grad_sums(*wide[:4])
    # The second sum is of zero-mean x_hat times ~1e3: the scale its error goes by.
    scale = np.abs(wide[0] * ((wide[1] - 3.0) * 0.5)).sum(axis=(0, 1, 2))
    np.testing.assert_allclose(sums[0], exact[0], rtol=2e-7)  # summed row by row in float32: 4e-6
    assert np.all(np.abs(sums[1] - exact[1]) <= 2e-7 * scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_read_a_channel_slice_in_place_and_match_numpy(dtype):
    """A concatenation's gradient reaches its inputs' layers as channel slices (``split``):
    the batch-norm kernels, the gradient sums and the input gradient that adds one in read them
    in place, with the same results."""
    whole = normal((6, 5, 5, 12), dtype, offset=10.0)
    part, other = whole[..., 3:10], normal((6, 5, 5, 7), dtype, seed=1)
    assert not part.flags.c_contiguous
    np.testing.assert_allclose(cpu.batchnorm_sums(part), normalization.batchnorm_sums(part),
                               rtol=STATISTICS_TOLERANCE[dtype], atol=1e-9)
    mean, inv_std = np.full(7, 10.0, dtype), np.full(7, 0.5, dtype)
    np.testing.assert_allclose(cpu.batchnorm_grad_sums(part, other, mean, inv_std),
                               normalization.batchnorm_grad_sums(part, other, mean, inv_std), rtol=1e-4, atol=1e-4)
    sums = cpu.batchnorm_relu_grad_sums(other, other, mean, inv_std, mean, inv_std)
    for fused in (cpu.batchnorm_relu_grad_input, normalization.batchnorm_relu_grad_input):
        np.testing.assert_allclose(fused(other, other, mean, inv_std, mean, inv_std, sums, 150, part),
                                   normalization.batchnorm_relu_grad_input(other, other, mean, inv_std, mean, inv_std,
                                                                           sums, 150) + part, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cpu.batchnorm_grad_input(other, other, mean, inv_std, mean, sums, 150, part),
                               normalization.batchnorm_grad_input(other, other, mean, inv_std, mean, sums, 150) + part,
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cpu.add([part, other]), elementwise.add([part, other]), rtol=TOLERANCE[dtype])
    np.testing.assert_allclose(cpu.add([other, part, part]), elementwise.add([other, part, part]),
                               rtol=TOLERANCE[dtype])


POOL_CASES = [
    ((2, 9, 8, 3), 3, 3, 2, 1),  # ResNet's stem pooling: overlapping windows over padding
    ((2, 8, 6, 3), 2, 2, 2, 0),  # the windows tile the map
    ((2, 8, 6, 8), 2, 2, 2, 0),  # ... with a vector of channels: the gradient gathered
    ((2, 9, 6, 16), 3, 3, 3, 0),  # 3x3 windows tiling a map of 16 channels
    ((2, 7, 9, 2), 2, 3, 2, 0),  # odd sizes: the last row and column are in no window
    ((1, 6, 6, 2), 2, 2, 3, 1),  # stride > window: gaps between the windows
    ((2, 4, 4, 3), 4, 4, 4, 0),  # global
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kh,kw,stride,padding", POOL_CASES)
def test_pooling_kernels_match_numpy(dtype, shape, kh, kw, stride, padding):
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, size=shape).astype(dtype)  # few values: most windows hold ties
    out, argmax = cpu.maxpool(x, kh, kw, stride, padding)
    expected_out, expected_argmax = pooling.maxpool(x, kh, kw, stride, padding)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(argmax, expected_argmax)
    grad_out = normal(out.shape, dtype, seed=2)
    np.testing.assert_array_equal(cpu.maxpool_grad(grad_out, argmax, shape, kh, kw, stride, padding),
                                  pooling.maxpool_grad(grad_out, argmax, shape, kh, kw, stride, padding))
    x = normal(shape, dtype)
    np.testing.assert_allclose(cpu.avgpool(x, kh, kw, stride, padding), pooling.avgpool(x, kh, kw, stride, padding),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    np.testing.assert_allclose(cpu.avgpool_grad(grad_out, shape, kh, kw, stride, padding),
                               pooling.avgpool_grad(grad_out, shape, kh, kw, stride, padding),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_maxpool_propagates_nan_and_infinities_as_numpy_does():
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(2, 9, 9, 3)).astype(np.float32)
    x.flat[rng.choice(x.size, 30, replace=False)] = -np.inf
    x.flat[rng.choice(x.size, 10, replace=False)] = np.nan
    x[0, :4, :4, 0] = -np.inf  # a window, and its padding, of -inf only
    out, argmax = cpu.maxpool(x, 3, 3, 2, 1)
    expected_out, expected_argmax = pooling.maxpool(x, 3, 3, 2, 1)
    assert np.isnan(expected_out).any() and np.isneginf(expected_out).any()
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(argmax, expected_argmax)


@pytest.mark.parametrize("channels", [3, 8])  # 2x2/2 windows: the scatter, then the gather
def test_a_nan_or_infinite_max_pool_gradient_goes_to_the_maximum_alone(channels):
    x = normal((1, 4, 4, channels), np.float32)
    out, argmax = cpu.maxpool(x, 2, 2, 2, 0)
    grad_out = np.ones(out.shape, dtype=np.float32)
    grad_out[0, 0, 0, :], grad_out[0, 1, 1, :] = np.nan, np.inf
    grad = cpu.maxpool_grad(grad_out, argmax, x.shape, 2, 2, 2, 0)
    for window, special in (((slice(0, 2), slice(0, 2)), np.isnan), ((slice(2, 4), slice(2, 4)), np.isinf)):
        values = grad[0][window].reshape(4, channels)
        maxima = values != 0
        assert (maxima.sum(axis=0) == 1).all() and special(values[maxima]).all()
        assert (np.argmax(maxima, axis=0) == argmax[0][(window[0].start // 2, window[1].start // 2)]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum,weight_decay,nesterov", [(0.9, 0.0, False), (0.9, 1e-4, True), (0.0, 1e-4, False)])
def test_sgd_update_matches_numpy(dtype, momentum, weight_decay, nesterov):
    param, grad, velocity = (normal(1000, dtype, seed) for seed in range(3))
    expected_param, expected_velocity = param.copy(), velocity.copy()
    update.sgd_update(expected_param, grad, expected_velocity if momentum else None, 0.1, momentum,
                      weight_decay, nesterov)
    cpu.sgd_update(param, grad, velocity if momentum else None, 0.1, momentum, weight_decay, nesterov)
    np.testing.assert_allclose(param, expected_param, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    np.testing.assert_allclose(velocity, expected_velocity, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_sum_of_micro_batch_gradients_matches_numpy(dtype):
    gradients = [normal(1000, dtype, seed) for seed in range(3)]
    total, expected = np.full(1000, np.nan, dtype), np.full(1000, np.nan, dtype)
    for index, gradient in enumerate(gradients):
        if index == 0:
            cpu.start_gradient_sum(total, gradient)
            update.start_gradient_sum(expected, gradient)
        else:
            cpu.accumulate_gradients(total, gradient)
            update.accumulate_gradients(expected, gradient)
    # Sums of the same terms in the same order: equal to the last bit.
    np.testing.assert_array_equal(total, expected)
    np.testing.assert_allclose(total, gradients[0] + gradients[1] + gradients[2], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gradient_s_norm_and_its_scaling_match_numpy(dtype):
    gradient = normal(100_003, dtype, 4)
    exact = float(np.sqrt(np.sum(gradient.astype(np.float64) ** 2)))
    # Summed in float64: as close to the exact norm as float64 rounding allows, in any dtype.
    assert cpu.gradient_norm(gradient) == pytest.approx(exact, rel=1e-12)
    assert update.gradient_norm(gradient) == pytest.approx(exact, rel=TOLERANCE[dtype])
    expected = gradient.copy()
    update.scale_gradient(expected, 0.3)
    cpu.scale_gradient(gradient, 0.3)
    np.testing.assert_array_equal(gradient, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_adam_update_matches_numpy(dtype, weight_decay):
    param, grad, first = (normal(1000, dtype, seed) for seed in range(3))
    second = np.abs(normal(1000, dtype, seed=3))
    expected = [array.copy() for array in (param, first, second)]
    for step in (1, 7):
        update.adam_update(expected[0], grad, expected[1], expected[2], 1e-2, 0.9, 0.999, 1e-3, step, weight_decay)
        cpu.adam_update(param, grad, first, second, 1e-2, 0.9, 0.999, 1e-3, step, weight_decay)
    for actual, wanted in zip((param, first, second), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("form", EPSILON_FORMS)
def test_adam_on_the_numba_kernel_steps_as_on_numpy(form, monkeypatch):
    """Both epsilon forms, through the optimizer and the kernel entry, in float32."""
    def trained(adam_kernel):
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "adam_update", adam_kernel)
            network = Network("dense", (6,), 3)
            network.add(Dense(3))
            network.build(make_backend("cpu", "float32"), seed=0)
            optimizer = Adam(network, eps=1e-3, weight_decay=1e-2, epsilon_form=form)
            for step in range(3):
                network.flat_grads[...] = normal(network.flat_grads.size, np.float32, seed=step)
                optimizer.step(0.1)
            return network.flat_params.copy()

    assert kernels.adam_update.__wrapped__ is cpu.adam_update
    np.testing.assert_allclose(trained(kernels.adam_update), trained(update.adam_update), rtol=1e-6, atol=1e-6)


def test_host_arrays_take_the_numba_kernels():
    """The kernel entries the layers call route NumPy arrays to these kernels."""
    x = normal((2, 5, 5, 3), np.float32)
    np.testing.assert_array_equal(kernels.im2col(x, 3, 3, 1, 1), cpu.im2col(x, 3, 3, 1, 1))
    assert kernels.relu.__wrapped__ is cpu.relu
    assert kernels.batchnorm_sums.__wrapped__ is cpu.batchnorm_sums
    assert kernels.sgd_update.__wrapped__ is cpu.sgd_update
    assert kernels.maxpool.__wrapped__ is cpu.maxpool
    assert kernels.avgpool_grad.__wrapped__ is cpu.avgpool_grad


def test_one_thread_runs_every_loop_in_place_with_the_same_results(monkeypatch):
    """A process of one thread calls each loop's serial compilation, not Numba's pool
    (which hands even a one-thread loop to a worker: two wake-ups per kernel, each a wait
    for the scheduler where ranks outnumber the cores), and it matches NumPy as the
    parallel one does."""
    loops = [loop for module in (cpu, winograd_cpu) for loop in vars(module).values()
             if isinstance(loop, cpu.ParallelLoop)]
    before = numba.get_num_threads()
    cpu.set_threads(1)
    try:
        for shape, kernel, stride, padding in [((2, 7, 6, 3), 3, 1, 1), ((2, 9, 8, 3), 5, 2, 2)]:
            test_im2col_and_col2im_match_numpy(np.float32, shape, kernel, stride, padding)
        test_elementwise_kernels_match_numpy(np.float32)
        test_the_relu_gradient_of_a_sum_matches_numpy(np.float32)
        test_the_relu_of_a_sum_matches_numpy(np.float32)
        test_concat_matches_numpy(0, monkeypatch)
        test_batchnorm_kernels_match_numpy(np.float32, (15, 32, 32, 8))
        test_kernels_read_a_channel_slice_in_place_and_match_numpy(np.float32)
        for case in POOL_CASES:
            test_pooling_kernels_match_numpy(np.float32, *case)
        test_sgd_update_matches_numpy(np.float32, 0.9, 1e-4, True)
        test_adam_update_matches_numpy(np.float32, 1e-2)
        test_the_sum_of_micro_batch_gradients_matches_numpy(np.float32)
        test_the_gradient_s_norm_and_its_scaling_match_numpy(np.float32)
        test_winograd_transforms_match_numpy(np.float32, (3, 7, 6, 5), 1)
        test_winograd_filter_transforms_match_numpy(np.float32, 48, 100)
        assert [loop.__name__ for loop in loops if not loop.serial.signatures] == []
    finally:
        numba.set_num_threads(before)


def test_in_place_calls_the_serial_loops_meanwhile_and_gives_the_threads_back():
    """A kernel model's MLP makes thousands of tiny calls: inside ``in_place`` each runs on
    the calling thread, and the process's threads are back afterwards, an error or not."""
    before = numba.get_num_threads()
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    with pytest.raises(RuntimeError), cpu.in_place():
        assert numba.get_num_threads() == 1
        np.testing.assert_array_equal(cpu.relu(x), np.maximum(x, 0))
        raise RuntimeError("a failing forward pass")
    assert numba.get_num_threads() == before


def test_the_kernels_read_a_channel_slice_in_place_by_its_row_stride_and_copy_other_layouts():
    wide = np.zeros((6, 10), dtype=np.float32)
    assert row_stride(wide) == 10 and row_stride(wide[:, 3:7]) == 10  # a concatenation's part, in place
    assert row_stride(wide[::2]) == 20  # rows evenly apart, further
    assert row_stride(wide[:, ::2]) is None  # channels apart: a copy
    assert row_stride(wide.T) is None and row_stride(wide[:1]) is None  # transposed; a single row
