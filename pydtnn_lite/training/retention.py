"""Which checkpoints stay on disk: the last K, and the best by validation accuracy.

``checkpoint.npz`` is always the newest (what --resume reads). With --keep-checkpoints K
above 1, each checkpoint also stays as ``checkpoint-step<N>.npz`` until K newer ones
exist. After an epoch's validation, a checkpoint whose accuracy beats every earlier one
becomes ``checkpoint-best.npz`` too. The extra names are hard links to the written file
(copies where the file system has no links), so keeping them costs no time.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil

import numpy as np

STEP_PATTERN = re.compile(r"checkpoint-step(\d+)\.npz$")
BEST_NAME = "checkpoint-best.npz"


def step_checkpoint_name(global_step: int) -> str:
    return f"checkpoint-step{global_step:08d}.npz"


def link_or_copy(source: str, target: str) -> None:
    """Make ``target`` name the contents of ``source`` (replacing it atomically)."""
    temporary = target + ".tmp"
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
        os.chmod(temporary, 0o644)
    os.replace(temporary, target)


def best_accuracy(directory: str) -> float | None:
    """The validation accuracy ``checkpoint-best.npz`` was kept for (None when there is none)."""
    path = os.path.join(directory, BEST_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path) as archive:
            return json.loads(str(archive["meta/json"])).get("validation_accuracy")
    except (OSError, ValueError, KeyError):
        return None


def retain(directory: str, written: str, global_step: int, keep: int, validation_accuracy: float | None) -> None:
    """Keep the checkpoint just ``written`` under its extra names, and delete what falls outside the last ``keep``."""
    if keep > 1:
        link_or_copy(written, os.path.join(directory, step_checkpoint_name(global_step)))
        steps = sorted(glob.glob(os.path.join(directory, "checkpoint-step*.npz")),
                       key=lambda path: int(STEP_PATTERN.search(path).group(1)))  # type: ignore[union-attr]
        for old in steps[:-keep]:
            os.unlink(old)
    if validation_accuracy is not None:
        best = best_accuracy(directory)
        if best is None or validation_accuracy > best:
            link_or_copy(written, os.path.join(directory, BEST_NAME))
