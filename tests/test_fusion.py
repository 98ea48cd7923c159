"""Batch norm with the ReLU fused in: the same numbers as BatchNorm then ReLU, traced and
predicted as the fused kernels."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pydtnn_lite import kernels
from pydtnn_lite.costs import FUSED_KERNELS
from pydtnn_lite.errors import UserError
from pydtnn_lite.kernels import cpu, elementwise, normalization
from pydtnn_lite.layers import BatchNorm, Conv2D, Dense, Flatten, GlobalAvgPool2D, ReLU, StepContext
from pydtnn_lite.network import Network
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine
from pydtnn_lite.perfmodel.modelling.prediction import predict_step
from pydtnn_lite.perfmodel.modelling.workload import build_workload

from helpers import FLOAT64
from mpi import REPO

REFERENCE_CALIBRATION = os.path.join(REPO, "calibration", "dev-2core.json")
SHAPE = (5, 6, 7, 4)


def normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


def test_an_unknown_activation_is_refused():
    with pytest.raises(UserError, match="activation"):
        BatchNorm(activation="tanh")


@pytest.mark.parametrize("module", [cpu, normalization], ids=["numba", "numpy"])
def test_fused_kernels_equal_the_unfused_ones(module):
    """Each version of the fused kernels against the same version's unfused kernels, in float64."""
    relu, relu_grad = (cpu.relu, cpu.relu_grad) if module is cpu else (elementwise.relu, elementwise.relu_grad)
    x, grad = normal(SHAPE, 0), normal(SHAPE, 1)
    mean, inv_std, gamma, beta = (normal(SHAPE[-1], seed) for seed in range(2, 6))
    out = module.batchnorm_relu_normalize(x, mean, inv_std, gamma, beta)
    expected_out = relu(module.batchnorm_normalize(x, mean, inv_std, gamma, beta))
    assert (out > 0).any() and (out == 0).any()
    np.testing.assert_allclose(out, expected_out, rtol=1e-15, atol=1e-15)
    masked = relu_grad(grad, expected_out)
    sums = module.batchnorm_relu_grad_sums(grad, x, mean, inv_std, gamma, beta)
    np.testing.assert_allclose(sums, module.batchnorm_grad_sums(masked, x, mean, inv_std), rtol=1e-13, atol=1e-13)
    rows = x.size // SHAPE[-1]
    np.testing.assert_allclose(module.batchnorm_relu_grad_input(grad, x, mean, inv_std, gamma, beta, sums, rows),
                               module.batchnorm_grad_input(masked, x, mean, inv_std, gamma, sums, rows),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_the_fused_layer_equals_batchnorm_then_relu(training):
    """The layer (its Numba kernels on NumPy arrays) against the two unfused layers, forward and backward."""
    fused, bn, relu = BatchNorm(activation="relu"), BatchNorm(), ReLU()
    for layer in (fused, bn, relu):
        layer.build([SHAPE[1:]], FLOAT64, np.random.default_rng(0))
    for layer in (fused, bn):
        layer.params["gamma"][...] = normal(SHAPE[-1], 2)
        layer.params["beta"][...] = normal(SHAPE[-1], 3)
    ctx = StepContext(training=training, global_batch=SHAPE[0], step=1)
    x, grad = normal(SHAPE, 0), normal(SHAPE, 1)
    out = fused.forward(x, ctx=ctx)
    np.testing.assert_allclose(out, relu.forward(bn.forward(x, ctx=ctx), ctx=ctx), rtol=1e-14, atol=1e-14)
    if not training:
        return
    np.testing.assert_allclose(fused.backward(grad), bn.backward(relu.backward(grad)), rtol=1e-12, atol=1e-13)
    for name in ("gamma", "beta"):
        np.testing.assert_allclose(fused.grads[name], bn.grads[name], rtol=1e-13, atol=1e-13)
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(fused.buffers[name], bn.buffers[name])


def test_the_fused_kernels_are_kernel_entries():
    assert set(FUSED_KERNELS) <= set(kernels.__all__)


def test_a_calibration_without_the_fused_kernels_predicts_them_from_the_unfused_ones():
    machine = calibrated_machine(REFERENCE_CALIBRATION)
    for kernel in FUSED_KERNELS:  # as a file measured before the fusion
        machine.calibration.kernel_models.pop(kernel, None)
        machine.calibration.kernel_samples.pop(kernel, None)
    network, optimizer = build_workload("resnet18", "cifar10")
    prediction = predict_step(network, optimizer, 16, 1, machine)
    fused = [k for k in prediction.kernels if k.kernel in FUSED_KERNELS]
    assert fused and all(k.seconds > 0 for k in fused)
    # Each is its unfused calls' predicted time scaled by the bytes it moves against theirs.
    layer = next(layer for layer in network.layers if isinstance(layer, BatchNorm) and layer.activation)
    for cost in layer.costs(16):
        if cost.replaces:
            parts = sum(machine.kernel_seconds(part.kernel, part) for part in cost.replaces)
            expected = parts * cost.bytes / sum(part.bytes for part in cost.replaces)
            assert machine.kernel_seconds(cost.kernel, cost) == pytest.approx(expected)


def small_network(fused: bool) -> Network:
    """Conv - BN - ReLU - Conv - BN - ReLU - head, with each BN - ReLU fused or not."""
    net = Network("bn-relu", (6, 6, 3), 4)
    for filters in (5, 7):
        net.add(Conv2D(filters, 3, padding=1, use_bias=False))
        if fused:
            net.add(BatchNorm(activation="relu"))
        else:
            net.add(BatchNorm())
            net.add(ReLU())
    net.add(GlobalAvgPool2D())
    net.add(Flatten())
    net.add(Dense(4))
    return net.build(FLOAT64, seed=0)


def test_weights_of_the_unfused_network_load_into_the_fused_one():
    """The fused layer keeps the parameter and buffer names: weight files and checkpoints
    written before the fusion load, and compute the same."""
    unfused, fused = small_network(False), small_network(True)
    x = normal((3, 6, 6, 3), 7)
    ctx = StepContext(training=True, global_batch=3, step=1)
    unfused.forward(x, ctx)  # moves the running statistics off their start
    fused.load_state_dict(unfused.state_dict())
    evaluation = StepContext(training=False, global_batch=3, step=1)
    np.testing.assert_allclose(fused.forward(x, evaluation), unfused.forward(x, evaluation), rtol=1e-13, atol=1e-13)
