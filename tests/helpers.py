"""Test utilities: finite differences, a float64 CPU backend, a one-process trainer on digits."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import Augmentation, open_dataset
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
    ReLU,
    SoftmaxCrossEntropy,
    StepContext,
)
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.training import Trainer, TrainerSettings, build_trainer

FLOAT64 = make_backend("cpu", "float64")


def every_layer_network(input_shape: tuple, num_classes: int) -> Network:
    """Each layer kind once, wired with a shortcut (so backward sums gradients) and a concatenation."""
    net = Network("every", input_shape, num_classes)
    stem = net.add(Conv2D(3, 3, padding=1))
    a = net.add(BatchNorm(), stem)
    a = net.add(ReLU(), a)
    a = net.add(Conv2D(3, 3, padding=1), a)
    merged = net.add(Add(), a, stem)
    net.add(Concat(), merged, stem)
    net.add(MaxPool2D(2))
    net.add(AvgPool2D(2, stride=1))
    net.add(GlobalAvgPool2D())
    net.add(Flatten())
    net.add(Dropout(0.3, seed=1))
    net.add(Dense(num_classes))
    return net


def numeric_gradient(f: Callable[[], float], array: np.ndarray, eps: float = 1e-6,
                     indices: np.ndarray | None = None) -> np.ndarray:
    """Central-difference gradient of scalar ``f()`` with respect to ``array`` (perturbed in place),
    at the flat ``indices`` given (default: every element; the rest stay 0)."""
    grad = np.zeros_like(array)
    flat, flat_grad = array.reshape(-1), grad.reshape(-1)
    for i in (range(flat.size) if indices is None else indices):
        original = flat[i]
        flat[i] = original + eps
        plus = f()
        flat[i] = original - eps
        minus = f()
        flat[i] = original
        flat_grad[i] = (plus - minus) / (2 * eps)
    return grad


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """Norm-wise relative error, guarded against two zero gradients."""
    scale = max(np.linalg.norm(analytic), np.linalg.norm(numeric), 1e-12)
    return float(np.linalg.norm(analytic - numeric) / scale)


def network_gradient_error(network: Network, x: np.ndarray, labels: np.ndarray,
                           indices: np.ndarray | None = None) -> float:
    """Relative error of ``network``'s parameter gradients, back-propagated from the mean
    softmax cross-entropy of the batch ``x``, against its central differences, at the flat
    parameter ``indices`` (default: every parameter)."""
    loss = SoftmaxCrossEntropy()
    ctx = StepContext(training=True, global_batch=len(x))

    def objective() -> float:
        return float(loss.forward(network.forward(x, ctx), labels, ctx)[0]) / len(x)

    objective()
    network.backward(loss.backward())
    picks = np.arange(network.flat_params.size) if indices is None else indices
    analytic = network.flat_grads[picks]
    numeric = numeric_gradient(objective, network.flat_params, indices=picks)[picks]
    return relative_error(analytic, numeric)


def sample_per_segment(network, per_segment: int, seed: int = 0) -> np.ndarray:
    """Flat parameter indices: ``per_segment`` random ones from every layer's segment."""
    rng = np.random.default_rng(seed)
    picks = [rng.choice(np.arange(seg.start, seg.stop), size=min(per_segment, seg.stop - seg.start),
                        replace=False) for seg in network.segments]
    return np.concatenate(picks)


def digits_trainer(model: str, lr: float, batch: int = 32, augmentation: Augmentation = Augmentation()) -> Trainer:
    """A one-process Trainer of ``model`` on the digits training split, weights seeded with 0."""
    data = open_dataset("digits")
    network = create_model(model, data.input_shape, data.num_classes).build(make_backend(), seed=0)
    return build_trainer(network, data, TrainerSettings(batch, augmentation=augmentation),
                         optimizer=SGD(network, momentum=0.9), schedule=LearningRateSchedule(lr))
