"""Building blocks shared by the model definitions."""
from __future__ import annotations

from pydtnn_lite.layers import BatchNorm, Conv2D
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
