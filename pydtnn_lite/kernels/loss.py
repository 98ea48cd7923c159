"""Softmax fused with cross-entropy, written to be stable for any logit magnitude."""
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
