"""Finite-difference gradient checks, in float64, for every layer type and a whole model."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn_lite.costs import Stage
from pydtnn_lite.layers import (
    Add,
    AvgPool2D,
    BatchNorm,
    Concat,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    GlobalAvgPool2D,
    MaxPool2D,
    MeanSquaredError,
    ReLU,
    SoftmaxCrossEntropy,
    StepContext,
)
from pydtnn_lite.layers import conv as conv_module
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network

from helpers import (
    FLOAT64,
    every_layer_network,
    network_gradient_error,
    numeric_gradient,
    relative_error,
    sample_per_segment,
)

TOLERANCE = 1e-6


def check_layer(layer, input_shapes, batch=3, seed=0):
    """Compare a layer's input and parameter gradients with central differences of sum(out * R)."""
    rng = np.random.default_rng(seed)
    layer.build(input_shapes, FLOAT64, rng)
    inputs = [rng.normal(size=(batch,) + tuple(s)) for s in input_shapes]
    ctx = StepContext(training=True, global_batch=batch, step=1)
    projection = rng.normal(size=(batch,) + tuple(layer.output_shape))

    def objective():
        return float((layer.forward(*inputs, ctx=ctx) * projection).sum())

    objective()
    grad_in = layer.backward(projection)
    grad_in = grad_in if isinstance(grad_in, list) else [grad_in]
    for x, analytic in zip(inputs, grad_in, strict=True):
        assert relative_error(analytic, numeric_gradient(objective, x)) <= TOLERANCE
    for name, param in layer.params.items():
        objective()
        layer.backward(projection)
        analytic = layer.grads[name].copy()
        assert relative_error(analytic, numeric_gradient(objective, param)) <= TOLERANCE, name


@pytest.mark.parametrize("stride,padding,kernel", [(1, 1, 3), (2, 0, 3), (2, 2, 5), (1, 0, 1), (2, 0, 1)])
def test_conv2d(stride, padding, kernel):
    check_layer(Conv2D(4, kernel, stride=stride, padding=padding), [(7, 6, 3)])


@pytest.mark.parametrize("padding,kernel", [(1, 3), (0, 3), (2, 3), (1, 5)])
def test_conv2d_in_its_transposed_form(padding, kernel):
    """Fewer filters than input channels at stride 1: the transposed convolution of the turned kernel."""
    conv = Conv2D(2, kernel, padding=padding)
    check_layer(conv, [(7, 6, 5)])
    assert conv.batch_form == "transposed"


@pytest.mark.parametrize("padding,shape,filters", [(1, (7, 6, 3), 4), (0, (8, 9, 2), 4), (2, (5, 6, 3), 4),
                                                   (1, (6, 5, 5), 2)])
def test_conv2d_in_its_winograd_form(padding, shape, filters, monkeypatch):
    """Whole and partial 4x4 tiles, and fewer filters than channels; the thresholds lowered
    so that a small layer takes the form."""
    for threshold in ("WINOGRAD_MIN_CHANNELS", "WINOGRAD_MIN_TILES", "WINOGRAD_MIN_TILES_NARROW"):
        monkeypatch.setattr(conv_module, threshold, 1)
    conv = Conv2D(filters, 3, padding=padding)
    check_layer(conv, [shape])
    assert conv.batch_form == "winograd"


def test_conv2d_without_bias():
    check_layer(Conv2D(2, 3, padding=1, use_bias=False), [(5, 5, 2)])


def test_dense():
    check_layer(Dense(5), [(7,)])


@pytest.mark.parametrize("pool,stride,padding", [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_maxpool(pool, stride, padding):
    check_layer(MaxPool2D(pool, stride=stride, padding=padding), [(7, 7, 2)])


@pytest.mark.parametrize("pool,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 0)])
def test_avgpool(pool, stride, padding):
    check_layer(AvgPool2D(pool, stride=stride, padding=padding), [(7, 7, 2)])


def test_global_avgpool():
    check_layer(GlobalAvgPool2D(), [(4, 4, 3)])


def test_batchnorm_on_maps_and_vectors():
    check_layer(BatchNorm(), [(3, 4, 5)], batch=4)
    check_layer(BatchNorm(), [(6,)], batch=5)


def test_batchnorm_with_relu_fused():
    check_layer(BatchNorm(activation="relu"), [(3, 4, 5)], batch=4)
    check_layer(BatchNorm(activation="relu"), [(6,)], batch=5)


def test_relu():
    check_layer(ReLU(), [(4, 4, 3)])


def test_flatten():
    check_layer(Flatten(), [(3, 2, 4)])


def test_dropout():
    check_layer(Dropout(0.4), [(10,)], batch=4)


def test_add_and_concat():
    check_layer(Add(), [(3, 3, 2), (3, 3, 2)])
    check_layer(Add(activation="relu"), [(3, 3, 2), (3, 3, 2), (3, 3, 2)])
    check_layer(Concat(), [(3, 3, 2), (3, 3, 5)])


def test_an_add_with_its_relu_fused_in_sums_the_gradients_of_its_output_in_its_backward():
    """ResNet's block outputs as one layer: the sum and its ReLU in one forward pass, and the
    gradients of the layers the output feeds masked as they are added up."""
    net = Network("residual", (5, 5, 2), 3)
    stem = net.add(Conv2D(3, 3, padding=1))
    first = net.add(Add(activation="relu"), net.add(Conv2D(3, 3, padding=1), stem), stem)
    second = net.add(Add(activation="relu"), net.add(Conv2D(3, 3, padding=1), first), first)
    net.add(GlobalAvgPool2D(), second)
    net.add(Flatten())
    net.add(Dense(3))
    net.build(FLOAT64, seed=6)
    assert [net.layers[index].output_grad_terms for index in (first, second)] == [2, 1]
    kernels = [(index, cost.stage, cost.kernel) for index, cost in net.costs(2) if index in (first, second)]
    assert kernels == [(first, Stage.FP, "add_relu"), (first, Stage.BP, "relu_grad_sum"),
                       (second, Stage.FP, "add_relu"), (second, Stage.BP, "relu_grad")]
    x = np.random.default_rng(7).normal(size=(3, 5, 5, 2))
    assert network_gradient_error(net, x, np.array([2, 0, 1])) <= TOLERANCE


def test_softmax_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 6)) * 3
    labels = np.array([0, 5, 2, 2])
    loss = SoftmaxCrossEntropy()
    ctx = StepContext(training=True, global_batch=10)  # a share of a larger global batch

    def objective():
        return float(loss.forward(logits, labels, ctx)[0]) / ctx.global_batch

    objective()
    analytic = loss.backward()
    assert relative_error(analytic, numeric_gradient(objective, logits)) <= TOLERANCE


@pytest.mark.parametrize("name,shape", [("lenet", (8, 8, 1)), ("mlp", (4, 4, 2))])
def test_whole_model(name, shape):
    """40 parameter gradients of every layer of a small model, through the network's backward and the loss."""
    net = create_model(name, shape, 3).build(FLOAT64, seed=3)
    x = np.random.default_rng(0).normal(size=(4,) + shape)
    labels = np.array([0, 1, 2, 1])
    assert network_gradient_error(net, x, labels, indices=sample_per_segment(net, 40)) <= TOLERANCE


def test_residual_and_dense_connectivity():
    """A branchy graph (shortcut Add, Concat, BatchNorm, pooling, dropout) back-propagates exactly."""
    net = every_layer_network((5, 5, 2), 3)
    net.build(FLOAT64, seed=1)
    x = np.random.default_rng(2).normal(size=(3, 5, 5, 2))
    labels = np.array([2, 0, 1])
    assert network_gradient_error(net, x, labels) <= TOLERANCE


def test_a_relu_whose_output_feeds_several_layers_sums_their_gradients_in_its_backward():
    """ResNet's block outputs: a ReLU feeding a convolution and the block's Add (two
    gradients), and one feeding a Concat as well (three)."""
    net = Network("residual", (5, 5, 2), 3)
    stem = net.add(Conv2D(3, 3, padding=1))
    first = net.add(ReLU(), stem)
    total = net.add(Add(), net.add(Conv2D(3, 3, padding=1), first), first)
    second = net.add(ReLU(), total)
    joined = net.add(Concat(), net.add(Add(), net.add(Conv2D(3, 3, padding=1), second), second), first)
    net.add(GlobalAvgPool2D(), joined)
    net.add(Flatten())
    net.add(Dense(3))
    net.build(FLOAT64, seed=4)
    assert [net.layers[index].output_grad_terms for index in (first, second)] == [3, 2]
    backward = [cost.kernel for _, cost in net.costs(2) if cost.stage == Stage.BP]
    assert backward.count("relu_grad_sum") == 2 and "add" not in backward and "relu_grad" not in backward
    x = np.random.default_rng(5).normal(size=(3, 5, 5, 2))
    assert network_gradient_error(net, x, np.array([2, 0, 1])) <= TOLERANCE


def test_mean_squared_error():
    rng = np.random.default_rng(3)
    predictions = rng.normal(size=(4, 3))
    targets = rng.normal(size=(4, 3))
    loss = MeanSquaredError()
    ctx = StepContext(training=True, global_batch=10)  # a share of a larger global batch

    def objective():
        return float(loss.forward(predictions, targets, ctx)) / ctx.global_batch

    assert objective() * ctx.global_batch == pytest.approx(((predictions - targets) ** 2).mean(axis=1).sum())
    analytic = loss.backward()
    assert relative_error(analytic, numeric_gradient(objective, predictions)) <= TOLERANCE
