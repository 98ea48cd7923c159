"""A multilayer perceptron on flattened pixels."""
from __future__ import annotations

from pydtnn_lite.layers import Dense, Flatten, ReLU
from pydtnn_lite.network import Network

HIDDEN = (512, 256)


def mlp(input_shape: tuple, num_classes: int) -> Network:
    """Flatten, two ReLU hidden layers (512, 256), linear output."""
    net = Network("mlp", input_shape, num_classes)
    net.add(Flatten())
    for units in HIDDEN:
        net.add(Dense(units))
        net.add(ReLU())
    net.add(Dense(num_classes, init="glorot"))
    return net
