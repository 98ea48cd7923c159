"""VGG (Simonyan and Zisserman, 2014), configurations A (VGG11) and D (VGG16)."""
from __future__ import annotations

from pydtnn_lite.layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D, ReLU
from pydtnn_lite.models.blocks import is_imagenet_sized, pool_then_relu
from pydtnn_lite.network import Network

POOL = "M"
CONFIGS = {
    "vgg11": [64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL],
    "vgg16": [64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL,
              512, 512, 512, POOL],
}


def _vgg(name: str, input_shape: tuple, num_classes: int) -> Network:
    """3x3 conv + ReLU stacks and 2x2 max pools (the ReLU before a pool runs after it:
    :func:`pool_then_relu`); CIFAR head 512 -> classes, ImageNet head 4096-4096."""
    net = Network(name, input_shape, num_classes)
    config = CONFIGS[name]
    for index, item in enumerate(config):
        if item == POOL:
            pool_then_relu(net, MaxPool2D(2))
        else:
            net.add(Conv2D(item, 3, padding=1))
            if config[index + 1] != POOL:
                net.add(ReLU())
    net.add(Flatten())
    if is_imagenet_sized(input_shape):
        for _ in range(2):
            net.add(Dense(4096))
            net.add(ReLU())
            net.add(Dropout(0.5))
    net.add(Dense(num_classes, init="small"))
    return net


def vgg11(input_shape: tuple, num_classes: int) -> Network:
    """VGG11: 8 convolutions, the performance model's validation network."""
    return _vgg("vgg11", input_shape, num_classes)


def vgg16(input_shape: tuple, num_classes: int) -> Network:
    """VGG16: 13 convolutions."""
    return _vgg("vgg16", input_shape, num_classes)
