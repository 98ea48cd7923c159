"""Optimizers against their formulas, computed by hand over several steps with decay and momentum."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.layers import Dense
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, Optimizer

GRADIENTS = [np.array([1.0, -2.0, 0.5, 3.0]), np.array([-0.5, 1.0, 2.0, -1.0]), np.array([0.25, 0.0, -3.0, 1.5])]
LR, DECAY = 0.1, 0.1


def one_layer() -> Network:
    network = Network("one", (2,), 2)
    network.add(Dense(2, use_bias=False))
    return network.build(make_backend("cpu", "float64"))


def run(optimizer_of, steps: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) weights after ``steps`` updates with the gradients above."""
    network = one_layer()
    start = network.flat_params.copy()
    optimizer: Optimizer = optimizer_of(network)
    for g in GRADIENTS[:steps]:
        network.flat_grads[...] = g
        optimizer.step(LR)
    return start, network.flat_params.copy()


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_sgd_momentum_follows_its_formula(nesterov):
    start, end = run(lambda network: SGD(network, momentum=0.5, nesterov=nesterov, weight_decay=DECAY))
    p, v = start.copy(), np.zeros(4)
    for g in GRADIENTS:
        d = g + DECAY * p
        v = 0.5 * v + d
        p = p - LR * (d + 0.5 * v if nesterov else v)
    np.testing.assert_allclose(end, p, rtol=1e-12)


def test_plain_sgd_steps_along_the_gradient():
    start, end = run(lambda network: SGD(network, momentum=0.0))
    np.testing.assert_allclose(end, start - LR * sum(GRADIENTS), rtol=1e-12)


@pytest.mark.parametrize("form", ["torch", "kingma"])
def test_adam_follows_its_formula_with_bias_correction(form):
    beta1, beta2 = 0.9, 0.999
    eps = 1e-3  # large enough to tell where it joins the update
    start, end = run(lambda network: Adam(network, beta1, beta2, eps, weight_decay=DECAY, epsilon_form=form))
    p, m, v = start.copy(), np.zeros(4), np.zeros(4)
    for t, g in enumerate(GRADIENTS, start=1):
        d = g + DECAY * p
        m = beta1 * m + (1 - beta1) * d
        v = beta2 * v + (1 - beta2) * d * d
        if form == "torch":  # torch.optim.Adam: epsilon after the bias correction
            p = p - LR * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
        else:  # Kingma and Ba's efficient form, as Keras: epsilon before it
            p = p - LR * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(end, p, rtol=1e-12)


def test_adam_refuses_an_unknown_epsilon_form():
    with pytest.raises(ValueError, match="epsilon_form"):
        run(lambda network: Adam(network, epsilon_form="tensorflow"))


def test_adam_s_first_step_is_about_lr_whatever_the_gradient():
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    # The first step of Adam moves every weight by about lr, whatever its gradient's size.
    first_start, first_end = run(lambda network: Adam(network, beta1, beta2, eps), steps=1)
    np.testing.assert_allclose(np.abs(first_end - first_start), LR, rtol=1e-6)
