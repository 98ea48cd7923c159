"""The model zoo: a registry of network builders by name.

Every builder takes the per-sample input shape (H, W, C) and the number of classes, and
picks the CIFAR-style or ImageNet-style variant from the input size (see
:func:`is_imagenet_sized`), so ``--dataset`` alone decides the shapes.
"""
from __future__ import annotations

from collections.abc import Callable

from pydtnn_lite.backend import Backend
from pydtnn_lite.errors import UserError
from pydtnn_lite.models.alexnet import alexnet
from pydtnn_lite.models.blocks import is_imagenet_sized
from pydtnn_lite.models.densenet import densenet121
from pydtnn_lite.models.lenet import lenet
from pydtnn_lite.models.mlp import mlp
from pydtnn_lite.models.resnet import resnet18, resnet50
from pydtnn_lite.models.vgg import vgg11, vgg16
from pydtnn_lite.network import Network

MODELS: dict[str, Callable[[tuple, int], Network]] = {
    "vgg11": vgg11, "vgg16": vgg16, "alexnet": alexnet, "resnet18": resnet18,
    "resnet50": resnet50, "densenet121": densenet121, "lenet": lenet, "mlp": mlp,
}


class UnknownModelError(UserError, ValueError):
    """A model name that is not in the registry."""


def model_names() -> list[str]:
    """Every registered model name, in registry order."""
    return list(MODELS)


def create_model(name: str, input_shape: tuple, num_classes: int) -> Network:
    """An unbuilt network of model ``name`` for inputs of ``input_shape`` (H, W, C)."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None
    return builder(tuple(input_shape), num_classes)


def build_model(name: str, input_shape: tuple, num_classes: int, backend: Backend, seed: int = 0,
                images: str = "the") -> Network:
    """Model ``name`` built on ``backend`` for inputs of ``input_shape``; a :class:`UserError`
    where the name is unknown, or where the network does not fit the images (``images``
    names them in the message: a window larger than a map it reaches)."""
    network = create_model(name, input_shape, num_classes)
    try:
        return network.build(backend, seed)
    except ValueError as error:
        raise UserError(f"{name} does not fit {images} {tuple(input_shape)} images: {error}") from None


__all__ = ["MODELS", "UnknownModelError", "build_model", "create_model", "model_names", "is_imagenet_sized"]
