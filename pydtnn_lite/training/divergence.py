"""Divergence caught before the weights explode: a non-finite loss or gradient, or a loss far
above its recent median, stops training before the step's update is applied."""
from __future__ import annotations

import math
import statistics
from collections import deque

from pydtnn_lite.errors import TrainingError

WINDOW = 50  # recent steps whose median loss is the reference
WARMUP = 5  # steps seen before the median is trusted
FACTOR = 100.0  # a loss this many times the median has diverged...
CHANCE_MULTIPLE = 10.0  # ...when it is also this many times the loss of guessing (ln of the classes)


class DivergenceGuard:
    """Watches each step's global loss and gradient; raises TrainingError when training has diverged.

    Every rank sees the same global figures, so every rank raises at the same step.
    """

    def __init__(self, num_classes: int) -> None:
        self.losses: deque[float] = deque(maxlen=WINDOW)
        self.floor = CHANCE_MULTIPLE * math.log(max(num_classes, 2))

    def check(self, global_step: int, loss: float, gradient_sum: float) -> None:
        """Raise TrainingError if step ``global_step``'s mean ``loss`` or the sum of its reduced
        gradients says training diverged; otherwise remember the loss."""
        advice = ("lower --lr (or add --warmup-epochs), and check the input data for NaN or inf; "
                  "no checkpoint holds the diverged weights")
        if not math.isfinite(loss):
            raise TrainingError(f"the loss became {loss} at step {global_step}: {advice}")
        if not math.isfinite(gradient_sum):
            raise TrainingError(f"the gradients became {gradient_sum} at step {global_step} (loss {loss:.4g}): "
                                f"{advice}")
        if len(self.losses) >= WARMUP:
            median = statistics.median(self.losses)
            if loss > FACTOR * median and loss > self.floor:
                raise TrainingError(f"training diverged at step {global_step}: loss {loss:.4g} against a median "
                                    f"of {median:.4g} over the last {len(self.losses)} steps; {advice}")
        self.losses.append(loss)
