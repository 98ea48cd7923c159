"""Optimizer update kernels, applied in place to one parameter array at a time."""
from __future__ import annotations

from typing import Any


def sgd_update(param: Any, grad: Any, velocity: Any, lr: float, momentum: float,
               weight_decay: float, nesterov: bool) -> None:
    """SGD with momentum, as PyTorch defines it: v = m v + (g + wd p); p -= lr (g' + m v or v)."""
    if weight_decay:
        grad = grad + weight_decay * param
    if momentum:
        velocity *= momentum
        velocity += grad
        step = grad + momentum * velocity if nesterov else velocity
    else:
        step = grad
    param -= lr * step


def adam_update(param: Any, grad: Any, first: Any, second: Any, lr: float, beta1: float,
                beta2: float, eps: float, step: int, weight_decay: float) -> None:
    """Adam (Kingma and Ba) with bias correction; ``step`` counts from 1."""
    if weight_decay:
        grad = grad + weight_decay * param
    first *= beta1
    first += (1.0 - beta1) * grad
    second *= beta2
    second += (1.0 - beta2) * grad * grad
    param -= adam_step_size(lr, beta1, beta2, step) * first / ((second ** 0.5) + eps)


def start_gradient_sum(total: Any, gradients: Any) -> None:
    """Start ``total``, the running sum of a step's micro-batch gradients (``--accumulate``),
    with a copy of the first micro-batch's ``gradients``."""
    total[...] = gradients


def accumulate_gradients(total: Any, gradients: Any) -> None:
    """Add a later micro-batch's ``gradients`` to the running sum ``total``, in place."""
    total += gradients


def gradient_norm(gradient: Any) -> float:
    """The L2 norm of the flat ``gradient``."""
    return float((gradient * gradient).sum()) ** 0.5


def scale_gradient(gradient: Any, factor: float) -> None:
    """``gradient *= factor``, in place."""
    gradient *= factor


def adam_step_size(lr: float, beta1: float, beta2: float, step: int) -> float:
    """The learning rate with both of Adam's bias corrections folded in."""
    return lr * (1.0 - beta2 ** step) ** 0.5 / (1.0 - beta1 ** step)
