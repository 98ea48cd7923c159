"""LeNet-5 (LeCun et al., 1998) with 'same' padding, so it fits 8x8 digits as well as 32x32 images."""
from __future__ import annotations

from pydtnn_lite.layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from pydtnn_lite.models.blocks import pool_then_relu
from pydtnn_lite.network import Network


def lenet(input_shape: tuple, num_classes: int) -> Network:
    """conv5(6)-pool-conv5(16)-pool-120-84-classes, ReLU activations (a pool's before it:
    :func:`pool_then_relu`)."""
    net = Network("lenet", input_shape, num_classes)
    for filters in (6, 16):
        net.add(Conv2D(filters, 5, padding=2))
        pool_then_relu(net, MaxPool2D(2))
    net.add(Flatten())
    for units in (120, 84):
        net.add(Dense(units))
        net.add(ReLU())
    net.add(Dense(num_classes, init="glorot"))
    return net
