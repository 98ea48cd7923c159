"""Softmax fused with cross-entropy: the training loss of every model in the zoo."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.layers.base import KernelCost, StepContext


class SoftmaxCrossEntropy:
    """Mean cross-entropy over the GLOBAL batch.

    ``forward`` returns this rank's *sum* of per-sample losses; ``backward`` returns the
    logits gradient divided by the global batch size, so that adding the gradients of all
    ranks (a plain SUM Allreduce) gives the gradient of the full-batch mean loss, however
    unevenly the samples are shared.
    """

    kind = "softmax_xent"

    def forward(self, logits: Any, labels: Any, ctx: StepContext) -> tuple[Any, Any]:
        """Return (sum of per-sample losses, number of correct predictions) on this rank."""
        self.probs, losses = kernels.softmax_cross_entropy(logits, labels)
        self.labels = labels
        self.scale = 1.0 / ctx.global_batch
        correct = (self.probs.argmax(axis=1) == labels).sum()
        return losses.sum(), correct

    def backward(self) -> Any:
        grad = kernels.softmax_cross_entropy_grad(self.probs, self.labels, self.scale)
        self.probs = self.labels = None
        return grad

    @staticmethod
    def costs(batch: int, classes: int, itemsize: int) -> list[KernelCost]:
        n = batch * classes
        return [KernelCost("FP", "softmax_cross_entropy", 5 * n, 2 * n * itemsize, (batch, classes)),
                KernelCost("BP", "softmax_cross_entropy_grad", 2 * n, 2 * n * itemsize, (batch, classes))]
