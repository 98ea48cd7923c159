"""Adam, used to fit the performance model's regression MLPs."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.network import Network
from pydtnn_lite.optim.base import Optimizer

EPSILON_FORMS = ("torch", "kingma")


class Adam(Optimizer):
    """Kingma and Ba (2015) with bias correction and optional L2 weight decay.

    ``epsilon_form`` says where ``eps`` joins: ``"torch"`` (the default, as torch.optim.Adam)
    adds it to the square root of the bias-corrected second moment; ``"kingma"`` (the
    paper's efficient form, as Keras) adds it before the bias correction, where it acts
    1 / sqrt(1 - beta2^t) times larger: 31.6x at the first step with beta2 = 0.999.
    """

    state_names = ("first_moment", "second_moment")
    kernel = "adam_update"
    flops_per_element = 10
    arrays_touched = 7
    state_arrays_touched = 4

    def __init__(self, network: Network, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, epsilon_form: str = "torch") -> None:
        super().__init__(network)
        if epsilon_form not in EPSILON_FORMS:
            raise ValueError(f"epsilon_form must be one of {', '.join(EPSILON_FORMS)}, got {epsilon_form!r}")
        self.beta1, self.beta2, self.eps, self.weight_decay = beta1, beta2, eps, weight_decay
        self.epsilon_form = epsilon_form

    def update_segment(self, params: Any, grads: Any, state: dict[str, Any], lr: float) -> None:
        # The kernel adds its epsilon to sqrt(v) before the bias correction; torch's epsilon,
        # added after it, is the same update with epsilon * sqrt(1 - beta2^t) there.
        eps = self.eps * (1.0 - self.beta2 ** self.steps) ** 0.5 if self.epsilon_form == "torch" else self.eps
        kernels.adam_update(params, grads, state["first_moment"], state["second_moment"], lr,
                            self.beta1, self.beta2, eps, self.steps, self.weight_decay)
