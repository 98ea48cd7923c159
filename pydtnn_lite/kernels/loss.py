"""Loss kernels: softmax fused with cross-entropy (stable for any logit magnitude), and squared error."""
from __future__ import annotations

from typing import Any

from pydtnn_lite.backend import array_module


def softmax_cross_entropy(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Return (probabilities, per-sample loss) for ``logits`` (N, K) and integer ``labels`` (N,).

    Subtracting the row maximum keeps exp() from overflowing; the loss uses the
    log-sum-exp form so a confident wrong answer gives a large finite loss, not inf.
    """
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    probs = exp / sum_exp
    rows = xp.arange(logits.shape[0])
    losses = xp.log(sum_exp[:, 0]) - shifted[rows, labels]
    return probs, losses


def softmax_cross_entropy_grad(probs: Any, labels: Any, scale: float) -> Any:
    """d(sum of losses * scale)/d(logits) = (probs - onehot(labels)) * scale."""
    xp = array_module(probs)
    grad = probs.copy()
    grad[xp.arange(probs.shape[0]), labels] -= 1.0
    grad *= scale
    return grad


def squared_error(predictions: Any, targets: Any) -> tuple[Any, Any]:
    """Return (predictions - targets, per-sample loss) for (N, K) arrays; the loss of a
    sample is the mean over its K outputs of the squared difference."""
    diff = predictions - targets
    return diff, (diff * diff).mean(axis=1)


def squared_error_grad(diff: Any, scale: float) -> Any:
    """d(sum of per-sample losses * scale)/d(predictions) = 2 * diff / K * scale."""
    return diff * (2.0 * scale / diff.shape[1])
