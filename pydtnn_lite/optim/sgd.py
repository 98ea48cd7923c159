"""Stochastic gradient descent with momentum, Nesterov momentum and weight decay."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.network import Network
from pydtnn_lite.optim.base import Optimizer


class SGD(Optimizer):
    """PyTorch's SGD: ``v = m v + g + wd p``; ``p -= lr v`` (Nesterov: ``p -= lr (g + wd p + m v)``)."""

    kernel = "sgd_update"
    flops_per_element = 4
    arrays_touched = 5
    state_arrays_touched = 2

    def __init__(self, network: Network, momentum: float = 0.9, nesterov: bool = False,
                 weight_decay: float = 0.0) -> None:
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs --momentum > 0")
        self.state_names = ("velocity",) if momentum else ()
        super().__init__(network)
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay

    def update_segment(self, params: Any, grads: Any, state: dict[str, Any], lr: float) -> None:
        kernels.sgd_update(params, grads, state.get("velocity"), lr, self.momentum,
                           self.weight_decay, self.nesterov)
