"""Adam, used to fit the performance model's regression MLPs."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.network import Network
from pydtnn_lite.optim.base import Optimizer


class Adam(Optimizer):
    """Kingma and Ba (2015) with bias correction and optional L2 weight decay."""

    state_names = ("first_moment", "second_moment")
    kernel = "adam_update"
    flops_per_element = 10
    arrays_touched = 7

    def __init__(self, network: Network, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(network)
        self.beta1, self.beta2, self.eps, self.weight_decay = beta1, beta2, eps, weight_decay

    def update_segment(self, params: Any, grads: Any, state: dict[str, Any], lr: float) -> None:
        kernels.adam_update(params, grads, state["first_moment"], state["second_moment"], lr,
                            self.beta1, self.beta2, self.eps, self.steps, self.weight_decay)
