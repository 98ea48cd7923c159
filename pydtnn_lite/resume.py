"""Resuming a run from its checkpoint: the same run (id, directory, epoch figures) with the same
training flags, or a clear refusal."""
from __future__ import annotations

import os
from dataclasses import dataclass

from pydtnn_lite.errors import UserError
from pydtnn_lite.optim import Optimizer
from pydtnn_lite.run_config import RunConfig
from pydtnn_lite.run_record import check_resumed_flags
from pydtnn_lite.training import Trainer
from pydtnn_lite.training.checkpoint import checkpoint_path, read_checkpoint, restore_checkpoint

# What checkpoints written before the flags were recorded hold of them.
LEGACY_FLAGS = {"model": "--model", "dataset": "--dataset", "global_batch": "--batch-size"}


@dataclass(frozen=True)
class Resumed:
    """What a resumed run continues: its run id (None from checkpoints that predate run ids)."""

    run_id: str | None
    path: str


def resume(config: RunConfig, trainer: Trainer, optimizer: Optimizer) -> Resumed:
    """Load --resume's checkpoint into ``trainer``'s network and ``optimizer``, after checking that it
    was written with this run's training flags and that the run has steps left; UserError if not."""
    path = config.resume or ""
    path = checkpoint_path(path) if os.path.isdir(path) else path
    contents, global_step, meta = read_checkpoint(path)
    recorded = meta.get("flags") or {flag: meta[key] for key, flag in LEGACY_FLAGS.items() if key in meta}
    check_resumed_flags(path, recorded, config)
    restore_checkpoint(path, contents, trainer.network, optimizer)
    total_steps = config.epochs * trainer.steps_per_epoch
    if global_step >= total_steps:
        finished = -(-global_step // trainer.steps_per_epoch)
        raise UserError(f"nothing to train: the run in {path} already finished at epoch {finished} (step "
                        f"{global_step}) and --epochs is {config.epochs}: raise --epochs to train it longer")
    trainer.global_step = global_step
    if global_step % trainer.steps_per_epoch and len(meta.get("epoch_sums", ())) == 3:
        trainer.epoch_sums = [float(value) for value in meta["epoch_sums"]]
    return Resumed(meta.get("run_id"), path)
