"""Forward results against direct loop implementations on tiny shapes."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn_lite import kernels
from pydtnn_lite.backend import make_backend
from pydtnn_lite.kernels.normalization import shifted_sums
from pydtnn_lite.layers import AvgPool2D, BatchNorm, Conv2D, Dense, MaxPool2D, SoftmaxCrossEntropy, StepContext
from pydtnn_lite.layers import conv as conv_module

from helpers import FLOAT64

CTX = StepContext(training=True, global_batch=2)


def naive_conv(x, w, b, stride, pad):
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, ho, wo, f))
    for i in range(n):
        for r in range(ho):
            for col in range(wo):
                patch = xp[i, r * stride:r * stride + kh, col * stride:col * stride + kw, :]
                for k in range(f):
                    out[i, r, col, k] = (patch * w[..., k]).sum() + b[k]
    return out


def naive_pool(x, size, stride, pad, reduce, fill):
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=fill)
    ho, wo = (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1
    out = np.zeros((n, ho, wo, c))
    for r in range(ho):
        for col in range(wo):
            out[:, r, col, :] = reduce(xp[:, r * stride:r * stride + size, col * stride:col * stride + size, :],
                                       axis=(1, 2))
    return out


def build(layer, shape, seed=0):
    layer.build([shape], FLOAT64, np.random.default_rng(seed))
    return layer


@pytest.mark.parametrize("kernel,stride,pad", [(3, 1, 1), (3, 2, 0), (5, 2, 2), (1, 1, 0), (1, 2, 0)])
def test_conv_matches_direct_convolution(kernel, stride, pad):
    rng = np.random.default_rng(1)
    conv = build(Conv2D(4, kernel, stride=stride, padding=pad), (7, 6, 3))
    conv.params["bias"][...] = rng.normal(size=4)
    x = rng.normal(size=(2, 7, 6, 3))
    expected = naive_conv(x, conv.params["weight"], conv.params["bias"], stride, pad)
    np.testing.assert_allclose(conv.forward(x, ctx=CTX), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,pad", [(3, 0), (3, 1), (3, 2), (5, 1)])
def test_conv_in_its_transposed_form_matches_direct_convolution(kernel, pad):
    """Fewer filters than channels at stride 1: computed as a transposed convolution."""
    rng = np.random.default_rng(3)
    conv = build(Conv2D(2, kernel, padding=pad), (7, 6, 5))
    assert conv.form(2) == "transposed"
    conv.params["bias"][...] = rng.normal(size=2)
    x = rng.normal(size=(2, 7, 6, 5))
    expected = naive_conv(x, conv.params["weight"], conv.params["bias"], 1, pad)
    np.testing.assert_allclose(conv.forward(x, ctx=CTX), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pad", [0, 1, 2])
def test_conv_in_its_winograd_form_matches_direct_convolution(pad, monkeypatch):
    monkeypatch.setattr(conv_module, "WINOGRAD_MIN_CHANNELS", 1)
    monkeypatch.setattr(conv_module, "WINOGRAD_MIN_TILES", 1)
    rng = np.random.default_rng(4)
    conv = build(Conv2D(4, 3, padding=pad), (9, 7, 3))
    assert conv.form(2) == "winograd"
    conv.params["bias"][...] = rng.normal(size=4)
    x = rng.normal(size=(2, 9, 7, 3))
    expected = naive_conv(x, conv.params["weight"], conv.params["bias"], 1, pad)
    np.testing.assert_allclose(conv.forward(x, ctx=CTX), expected, rtol=1e-12, atol=1e-12)


def test_winograd_in_float32_stays_near_the_direct_convolution():
    """A ResNet-sized layer: the transforms cost float32 about 1e-5 of the output's scale."""
    rng = np.random.default_rng(5)
    conv = Conv2D(64, 3, padding=1)
    conv.build([(8, 8, 64)], make_backend("cpu", "float32"), rng)
    assert conv.form(8) == "winograd"
    x = rng.normal(size=(8, 8, 8, 64)).astype(np.float32)
    expected = naive_conv(x.astype(np.float64), conv.params["weight"].astype(np.float64),
                          conv.params["bias"].astype(np.float64), 1, 1)
    assert np.abs(conv.forward(x, ctx=CTX) - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("input_shape,filters,winograd,batch,form", [
    ((32, 32, 64), 64, True, 64, "winograd"),  # ResNet's first blocks
    ((32, 32, 64), 64, True, 1, "winograd"),  # 64 tiles in one image
    ((4, 4, 512), 512, True, 32, "winograd"),  # one whole tile an image
    ((4, 4, 512), 512, True, 16, "direct"),  # too few tiles for the filters' transforms to pay
    ((8, 8, 256), 256, True, 8, "winograd"),  # four tiles an image
    ((2, 2, 512), 512, True, 64, "direct"),  # VGG's last maps: a partial tile only
    ((32, 32, 32), 32, True, 64, "direct"),  # too few channels for the transforms to pay
    ((32, 32, 128), 32, True, 4, "winograd"),  # DenseNet's bottlenecked 3x3: 256 tiles
    ((16, 16, 128), 32, True, 15, "transposed"),  # 240 tiles: too few to beat the transposed form
    ((8, 8, 128), 32, True, 64, "winograd"),
    ((4, 4, 128), 32, True, 64, "transposed"),
    ((32, 32, 128), 32, False, 64, "transposed"),
    ((32, 32, 64), 64, False, 64, "direct"),
])
def test_the_layer_chooses_its_form_by_its_shape_and_batch(input_shape, filters, winograd, batch, form):
    assert build(Conv2D(filters, 3, padding=1, winograd=winograd), input_shape).form(batch) == form


@pytest.mark.parametrize("size,stride,pad", [(2, 2, 0), (3, 2, 1), (3, 1, 0)])
def test_pools_match_direct_pooling(size, stride, pad):
    x = np.random.default_rng(2).normal(size=(2, 7, 7, 3))
    maxpool = build(MaxPool2D(size, stride=stride, padding=pad), (7, 7, 3))
    avgpool = build(AvgPool2D(size, stride=stride, padding=pad), (7, 7, 3))
    np.testing.assert_allclose(maxpool.forward(x, ctx=CTX), naive_pool(x, size, stride, pad, np.max, -np.inf))
    np.testing.assert_allclose(avgpool.forward(x, ctx=CTX), naive_pool(x, size, stride, pad, np.mean, 0.0))


def test_maxpool_gradient_goes_to_the_first_maximum_of_a_tie():
    pool = build(MaxPool2D(2), (2, 2, 1))
    x = np.zeros((1, 2, 2, 1))
    pool.forward(x, ctx=CTX)
    grad = pool.backward(np.ones((1, 1, 1, 1)))
    assert grad.reshape(-1).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_dense_and_batchnorm_match_formulas():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 4))
    dense = build(Dense(3), (4,))
    np.testing.assert_allclose(dense.forward(x, ctx=CTX), x @ dense.params["weight"] + dense.params["bias"])
    bn = build(BatchNorm(), (4,))
    ctx = StepContext(training=True, global_batch=5)
    out = bn.forward(x, ctx=ctx)
    np.testing.assert_allclose(out, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), atol=1e-12)
    np.testing.assert_allclose(bn.buffers["running_mean"], 0.1 * x.mean(0))
    np.testing.assert_allclose(bn.buffers["running_var"], 0.9 + 0.1 * x.var(0, ddof=1))
    evaluation = bn.forward(x, ctx=StepContext(training=False, global_batch=5))
    expected = (x - bn.buffers["running_mean"]) / np.sqrt(bn.buffers["running_var"] + 1e-5)
    np.testing.assert_allclose(evaluation, expected, atol=1e-12)


@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_float32_batchnorm_keeps_the_variance_of_inputs_far_from_zero(offset):
    """E[x^2] - E[x]^2 in float32 cancels to 0 here; the output must still have unit spread, in
    the first step (no shift: the running mean is 0) and the next (the running mean as shift)."""
    x = (offset + np.random.default_rng(4).normal(size=(64, 8, 8, 4))).astype(np.float32)
    bn = BatchNorm()
    bn.build([(8, 8, 4)], make_backend("cpu", "float32"), np.random.default_rng(0))
    for _ in range(2):
        out = bn.forward(x, ctx=StepContext(training=True, global_batch=64))
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.reshape(-1, 4).std(axis=0, dtype=np.float64), 1.0, atol=1e-3)
        np.testing.assert_allclose(out.reshape(-1, 4).mean(axis=0, dtype=np.float64), 0.0, atol=1e-3)


def test_batchnorm_sums_of_uneven_shares_give_the_whole_batch_statistics():
    """Ranks add their sums about a shared shift: shares of 0, 3, 13 and 48 samples of float32 data
    near 1e4 give the mean and variance of the whole batch (as one float64 process computes them)."""
    x = (1e4 + np.random.default_rng(5).normal(size=(64, 3, 3, 2))).astype(np.float32)
    shift = np.array([9990.0, 0.0])
    sums = sum(shifted_sums(kernels.batchnorm_sums(x[a:b]), (b - a) * 9, shift)
               for a, b in [(0, 0), (0, 3), (3, 16), (16, 64)])
    rows = x.size // 2
    offset = sums[0] / rows
    reference = x.reshape(-1, 2).astype(np.float64)
    np.testing.assert_allclose(shift + offset, reference.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(sums[1] / rows - offset ** 2, reference.var(axis=0), rtol=1e-7)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])
    loss_sum, correct = SoftmaxCrossEntropy().forward(logits, np.array([2, 1]), CTX)
    assert np.isfinite(loss_sum)
    np.testing.assert_allclose(loss_sum, 2000.0 + np.log(3.0))
    assert correct == 0
