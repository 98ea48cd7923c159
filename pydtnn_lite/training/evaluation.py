"""How much of the test split each epoch's evaluation covers.

An epoch cut short by --steps-per-epoch is evaluated on the same share of the test split
as it trained on of the training split, unless --eval-steps says otherwise: a short run
would otherwise spend most of its time evaluating.
"""
from __future__ import annotations

import math


def evaluation_batches(test_samples: int, batch: int) -> int:
    """Batches of ``batch`` samples that cover ``test_samples`` (the last one may be short)."""
    return max(1, math.ceil(test_samples / batch))


def evaluation_steps(eval_steps: int | None, steps_per_epoch: int, full_epoch_steps: int, test_samples: int,
                     batch: int) -> int:
    """Evaluation batches after each epoch: ``eval_steps`` when given (capped at the whole split), else
    the share of the test split that ``steps_per_epoch`` of ``full_epoch_steps`` training steps is."""
    whole = evaluation_batches(test_samples, batch)
    if eval_steps is not None:
        return min(eval_steps, whole)
    return min(whole, math.ceil(whole * steps_per_epoch / full_epoch_steps))


def describe_evaluation(steps: int, test_samples: int, batch: int) -> str:
    """The start line's words for an evaluation of ``steps`` batches."""
    whole = evaluation_batches(test_samples, batch)
    if steps == 0:
        return "no evaluation"
    if steps >= whole:
        return f"evaluation on the whole test split ({test_samples} samples) after each epoch"
    return (f"evaluation on {steps} of {whole} test batches ({min(steps * batch, test_samples)} of "
            f"{test_samples} samples) after each epoch")
