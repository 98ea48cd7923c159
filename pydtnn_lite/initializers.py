"""Weight initializers. They draw on the host with NumPy so every device starts identical."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np


def he_normal(rng: np.random.Generator, shape: tuple, fan_in: int, fan_out: int) -> np.ndarray:
    """He et al. (2015): N(0, 2 / fan_in), for layers followed by ReLU."""
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)


def glorot_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, fan_out: int) -> np.ndarray:
    """Glorot and Bengio (2010): U(-l, l) with l = sqrt(6 / (fan_in + fan_out))."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape)


def small_normal(rng: np.random.Generator, shape: tuple, fan_in: int, fan_out: int) -> np.ndarray:
    """N(0, 0.01^2), torchvision's choice for VGG's classifier: logits start near 0 however
    much the max pools have grown the features."""
    return rng.normal(0.0, 0.01, size=shape)


INITIALIZERS: dict[str, Callable[..., np.ndarray]] = {"he": he_normal, "glorot": glorot_uniform,
                                                      "small": small_normal}


def get_initializer(name: str) -> Callable[..., np.ndarray]:
    """Look an initializer up by name ('he', 'glorot' or 'small')."""
    try:
        return INITIALIZERS[name]
    except KeyError:
        raise ValueError(f"unknown initializer {name!r}: choose one of {', '.join(INITIALIZERS)}") from None
