"""Learning-rate schedule: linear warm-up, then step decay or cosine decay."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LearningRateSchedule:
    """``base_lr`` ramped up linearly over ``warmup_epochs``, then multiplied by ``decay_factor``
    at each epoch listed in ``decay_epochs``; or, with ``cosine_epochs`` set, lowered after
    the warm-up along half a cosine to ``min_lr`` at the end of epoch ``cosine_epochs``."""

    base_lr: float
    warmup_epochs: float = 0.0
    decay_epochs: tuple[int, ...] = field(default_factory=tuple)
    decay_factor: float = 0.1
    cosine_epochs: float | None = None
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.base_lr <= 0:
            raise ValueError(f"the learning rate must be positive, got {self.base_lr}: pass --lr > 0")

    def __call__(self, step: int, steps_per_epoch: int) -> float:
        """Learning rate of global step ``step`` (from 0) for epochs of ``steps_per_epoch`` steps."""
        epoch = step // steps_per_epoch
        warmup_steps = self.warmup_epochs * steps_per_epoch
        if self.cosine_epochs is not None:
            decay_steps = max(self.cosine_epochs * steps_per_epoch - warmup_steps, 1.0)
            progress = min(max(step - warmup_steps, 0.0) / decay_steps, 1.0)
            lr = self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            lr = self.base_lr * self.decay_factor ** sum(1 for boundary in self.decay_epochs if epoch >= boundary)
        if step < warmup_steps:
            lr *= (step + 1) / warmup_steps  # the first step already moves, at lr / warmup_steps
        return lr
