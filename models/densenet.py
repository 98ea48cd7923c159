"""DenseNet-121 (Huang et al., 2017): growth rate 32, blocks 6-12-24-16, compression 0.5."""
from __future__ import annotations

from pydtnn_lite.layers import AvgPool2D, BatchNorm, Concat, Dense, Flatten, GlobalAvgPool2D, MaxPool2D
from pydtnn_lite.models.blocks import bn_relu_conv, conv_bn_relu, is_imagenet_sized
from pydtnn_lite.network import Network

GROWTH = 32
BOTTLENECK = 4
BLOCKS = (6, 12, 24, 16)


def densenet121(input_shape: tuple, num_classes: int) -> Network:
    """Dense blocks of BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 whose outputs are concatenated to their inputs."""
    net = Network("densenet121", input_shape, num_classes)
    channels = 2 * GROWTH
    if is_imagenet_sized(input_shape):
        index = conv_bn_relu(net, Network.INPUT, channels, 7, stride=2, padding=3)
        index = net.add(MaxPool2D(3, stride=2, padding=1), index)
    else:
        index = conv_bn_relu(net, Network.INPUT, channels, 3, padding=1)
    for block, layers in enumerate(BLOCKS):
        for _ in range(layers):
            new = bn_relu_conv(net, index, BOTTLENECK * GROWTH, 1)
            new = bn_relu_conv(net, new, GROWTH, 3, padding=1)
            index = net.add(Concat(), index, new)
            channels += GROWTH
        if block < len(BLOCKS) - 1:
            channels //= 2
            index = bn_relu_conv(net, index, channels, 1)
            index = net.add(AvgPool2D(2), index)
    index = net.add(BatchNorm(activation="relu"), index)
    net.add(GlobalAvgPool2D(), index)
    net.add(Flatten())
    net.add(Dense(num_classes, init="glorot"))
    return net
