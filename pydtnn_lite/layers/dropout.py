"""Inverted dropout with an independent mask per sample."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.layers.base import Layer, StepContext


class Dropout(Layer):
    """Zero each activation with probability ``rate`` in training and scale the rest by 1/(1-rate).

    The mask of sample i at step t depends only on (run seed, layer seed, layer, t, i): it is drawn for the
    whole global batch and each rank keeps its own rows, so any split of a batch over ranks
    trains exactly as one process does, and a resumed run draws the masks it would have.
    """

    kind = "dropout"

    def __init__(self, rate: float = 0.5, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
        self.rate, self.seed = rate, seed
        self.mask = None

    def forward(self, x: Any, ctx: StepContext) -> Any:
        if not ctx.training or self.rate == 0.0:
            self.mask = None
            return x
        self.mask = kernels.dropout_mask(x, (ctx.seed, self.seed, self.index, ctx.step), ctx.global_batch,
                                         ctx.sample_offset, self.rate)
        return kernels.dropout_apply(x, self.mask)

    def backward(self, grad_out: Any) -> Any:
        if self.mask is None:
            return grad_out
        grad_in = kernels.dropout_apply(grad_out, self.mask)
        self.mask = None
        return grad_in

    def costs(self, batch: int) -> list[KernelCost]:
        n = self.elements(batch)
        dims = (n,)
        return [KernelCost(Stage.FP, "dropout_mask", 2 * n, 2 * n * self.itemsize, dims),
                KernelCost(Stage.FP, "dropout_apply", n, 3 * n * self.itemsize, dims),
                KernelCost(Stage.BP, "dropout_apply", n, 3 * n * self.itemsize, dims)]

    def describe(self) -> str:
        return f"rate {self.rate}"
