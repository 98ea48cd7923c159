"""Losses: softmax fused with cross-entropy (every model of the zoo) and mean squared error (regression)."""
from __future__ import annotations

from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.costs import KernelCost, Stage
from pydtnn_lite.layers.base import StepContext


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
        return [KernelCost(Stage.FP, "softmax_cross_entropy", 5 * n, 2 * n * itemsize, (batch, classes)),
                KernelCost(Stage.BP, "softmax_cross_entropy_grad", 2 * n, 2 * n * itemsize, (batch, classes))]


class MeanSquaredError:
    """Mean over the GLOBAL batch of each sample's mean squared error over its outputs.

    The regression loss of the performance model's MLPs. Same conventions as
    :class:`SoftmaxCrossEntropy`: ``forward`` returns this rank's *sum* of per-sample
    losses and ``backward`` divides by the global batch size, so a SUM Allreduce of the
    ranks' gradients is the gradient of the full-batch mean.
    """

    kind = "mse"

    def forward(self, predictions: Any, targets: Any, ctx: StepContext) -> Any:
        """Return the sum of per-sample losses on this rank; ``targets`` has the shape of ``predictions``."""
        self.diff, losses = kernels.squared_error(predictions, targets)
        self.scale = 1.0 / ctx.global_batch
        return losses.sum()

    def backward(self) -> Any:
        grad = kernels.squared_error_grad(self.diff, self.scale)
        self.diff = None
        return grad
