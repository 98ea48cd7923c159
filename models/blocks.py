"""Building blocks shared by the model definitions."""
from __future__ import annotations

from pydtnn_lite.layers import BatchNorm, Conv2D, ReLU
from pydtnn_lite.network import Network

IMAGENET_MIN_SIDE = 64


def is_imagenet_sized(input_shape: tuple) -> bool:
    """True for inputs of 64x64 pixels or more: models then use their ImageNet stems and heads."""
    return min(input_shape[0], input_shape[1]) >= IMAGENET_MIN_SIDE


def conv_bn_relu(net: Network, source: int, filters: int, kernel: int, stride: int = 1,
                 padding: int = 0, relu: bool = True) -> int:
    """Conv (no bias: batch norm's beta replaces it) + BatchNorm (+ ReLU); returns the last index."""
    index = net.add(Conv2D(filters, kernel, stride=stride, padding=padding, use_bias=False), source)
    index = net.add(BatchNorm(), index)
    return net.add(ReLU(), index) if relu else index


def bn_relu_conv(net: Network, source: int, filters: int, kernel: int, padding: int = 0) -> int:
    """Pre-activation order (DenseNet): BatchNorm + ReLU + Conv; returns the last index."""
    index = net.add(BatchNorm(), source)
    index = net.add(ReLU(), index)
    return net.add(Conv2D(filters, kernel, padding=padding, use_bias=False), index)
