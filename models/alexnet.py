"""AlexNet (Krizhevsky et al., 2012) in its single-tower form, and a CIFAR-sized variant."""
from __future__ import annotations

from pydtnn_lite.layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D, ReLU
from pydtnn_lite.models.blocks import is_imagenet_sized, pool_then_relu
from pydtnn_lite.network import Network


def alexnet(input_shape: tuple, num_classes: int) -> Network:
    """Five convolutions with overlapping 3x3/2 max pools (each after its ReLU's place:
    :func:`pool_then_relu`), then two dropout-regularised FC layers.

    ImageNet: 11x11/4 stem, 4096-wide head. CIFAR: 5x5/1 stem, 1024-wide head.
    """
    net = Network("alexnet", input_shape, num_classes)
    imagenet = is_imagenet_sized(input_shape)
    if imagenet:
        net.add(Conv2D(64, 11, stride=4, padding=2))
    else:
        net.add(Conv2D(64, 5, padding=2))
    pool_then_relu(net, MaxPool2D(3, stride=2))
    net.add(Conv2D(192, 5, padding=2))
    pool_then_relu(net, MaxPool2D(3, stride=2))
    for filters in (384, 256):
        net.add(Conv2D(filters, 3, padding=1))
        net.add(ReLU())
    net.add(Conv2D(256, 3, padding=1))
    pool_then_relu(net, MaxPool2D(3, stride=2))
    net.add(Flatten())
    width = 4096 if imagenet else 1024
    for _ in range(2):
        net.add(Dropout(0.5))
        net.add(Dense(width))
        net.add(ReLU())
    net.add(Dense(num_classes, init="glorot"))
    return net
