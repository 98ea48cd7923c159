"""Building blocks shared by the model definitions."""
from __future__ import annotations

from pydtnn_lite.layers import BatchNorm, Conv2D, MaxPool2D, ReLU
from pydtnn_lite.network import Network

IMAGENET_MIN_SIDE = 64


def is_imagenet_sized(input_shape: tuple) -> bool:
    """True for inputs of 64x64 pixels or more: models then use their ImageNet stems and heads."""
    return min(input_shape[0], input_shape[1]) >= IMAGENET_MIN_SIDE


def conv_bn_relu(net: Network, source: int, filters: int, kernel: int, stride: int = 1,
                 padding: int = 0, relu: bool = True) -> int:
    """Conv (no bias: batch norm's beta replaces it) + BatchNorm (with the ReLU fused in);
    returns the last index."""
    index = net.add(Conv2D(filters, kernel, stride=stride, padding=padding, use_bias=False), source)
    return net.add(BatchNorm(activation="relu" if relu else None), index)


def bn_relu_conv(net: Network, source: int, filters: int, kernel: int, padding: int = 0) -> int:
    """Pre-activation order (DenseNet): BatchNorm with the ReLU fused in + Conv; returns the last index."""
    index = net.add(BatchNorm(activation="relu"), source)
    return net.add(Conv2D(filters, kernel, padding=padding, use_bias=False), index)


def pool_then_relu(net: Network, pool: MaxPool2D) -> int:
    """A convolution's ReLU and the max pool after it, the pool first; returns the last index.

    The maximum of rectified values is the rectified maximum, and the gradient reaches the
    same input element (or none), bit for bit: the ReLU then passes over the pool's output,
    a quarter of its input for a 2x2/2 pool (docs/performance.md has the time it saves).
    """
    net.add(pool)
    return net.add(ReLU())


def relu_before_pools(network: Network) -> Network:
    """An unbuilt copy of ``network`` with each pool - ReLU pair of :func:`pool_then_relu`
    in the textbook order, ReLU first: what it replaces, for the tests and
    ``benchmarks/pool_relu_order.py``. For a chain of layers (no shortcuts)."""
    layers = list(network.layers)
    for index in range(len(layers) - 1):
        if isinstance(layers[index], MaxPool2D) and isinstance(layers[index + 1], ReLU):
            layers[index], layers[index + 1] = layers[index + 1], layers[index]
    textbook = Network(network.name, network.input_shape, network.num_classes)
    for layer in layers:
        textbook.add(layer)
    return textbook
