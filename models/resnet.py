"""ResNet-18 (basic blocks) and ResNet-50 (bottleneck blocks), He et al. (2016)."""
from __future__ import annotations

from pydtnn_lite.layers import Add, Dense, Flatten, GlobalAvgPool2D, MaxPool2D
from pydtnn_lite.models.blocks import conv_bn_relu, is_imagenet_sized
from pydtnn_lite.network import Network

STAGE_WIDTHS = (64, 128, 256, 512)


def _shortcut(net: Network, source: int, in_channels: int, out_channels: int, stride: int) -> int:
    """Identity, or a 1x1 projection + BN where the shape changes."""
    if stride == 1 and in_channels == out_channels:
        return source
    return conv_bn_relu(net, source, out_channels, 1, stride=stride, relu=False)


def _basic_block(net: Network, source: int, in_channels: int, width: int, stride: int) -> tuple[int, int]:
    branch = conv_bn_relu(net, source, width, 3, stride=stride, padding=1)
    branch = conv_bn_relu(net, branch, width, 3, padding=1, relu=False)
    shortcut = _shortcut(net, source, in_channels, width, stride)
    return net.add(Add(activation="relu"), branch, shortcut), width


def _bottleneck_block(net: Network, source: int, in_channels: int, width: int, stride: int) -> tuple[int, int]:
    out_channels = 4 * width
    branch = conv_bn_relu(net, source, width, 1)
    branch = conv_bn_relu(net, branch, width, 3, stride=stride, padding=1)
    branch = conv_bn_relu(net, branch, out_channels, 1, relu=False)
    shortcut = _shortcut(net, source, in_channels, out_channels, stride)
    return net.add(Add(activation="relu"), branch, shortcut), out_channels


def _resnet(name: str, block, blocks_per_stage: tuple, input_shape: tuple, num_classes: int) -> Network:
    net = Network(name, input_shape, num_classes)
    if is_imagenet_sized(input_shape):
        index = conv_bn_relu(net, Network.INPUT, 64, 7, stride=2, padding=3)
        index = net.add(MaxPool2D(3, stride=2, padding=1), index)
    else:  # CIFAR stem: keep the 32x32 resolution for the first stage
        index = conv_bn_relu(net, Network.INPUT, 64, 3, padding=1)
    channels = 64
    for stage, (width, blocks) in enumerate(zip(STAGE_WIDTHS, blocks_per_stage, strict=True)):
        for block_index in range(blocks):
            stride = 2 if stage > 0 and block_index == 0 else 1
            index, channels = block(net, index, channels, width, stride)
    net.add(GlobalAvgPool2D(), index)
    net.add(Flatten())
    net.add(Dense(num_classes, init="glorot"))
    return net


def resnet18(input_shape: tuple, num_classes: int) -> Network:
    """ResNet-18: basic blocks 2-2-2-2."""
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2), input_shape, num_classes)


def resnet50(input_shape: tuple, num_classes: int) -> Network:
    """ResNet-50: bottleneck blocks 3-4-6-3."""
    return _resnet("resnet50", _bottleneck_block, (3, 4, 6, 3), input_shape, num_classes)
