"""What identifies a run: its run id, and the flags that define its training, as recorded in its
checkpoints and compared on resume and between the ranks of a job."""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydtnn_lite.comm import Communicator
from pydtnn_lite.errors import UserError

if TYPE_CHECKING:  # run_config reads the flag names of this module
    from pydtnn_lite.run_config import RunConfig

# The flags that define what a run trains: a resumed run must have the checkpoint's.
TRAINING_FLAGS: dict[str, Callable[[RunConfig], Any]] = {
    "--model": lambda c: c.model,
    "--dataset": lambda c: c.dataset,
    "--batch-size": lambda c: c.global_batch,
    "--steps-per-epoch": lambda c: c.steps_per_epoch,
    "--optimizer": lambda c: c.optimizer,
    "--lr": lambda c: c.schedule.base_lr,
    "--momentum": lambda c: c.momentum,
    "--nesterov": lambda c: c.nesterov,
    "--weight-decay": lambda c: c.weight_decay,
    "--warmup-epochs": lambda c: c.schedule.warmup_epochs,
    "--lr-decay-epochs": lambda c: list(c.schedule.decay_epochs),
    "--lr-decay-factor": lambda c: c.schedule.decay_factor,
    "--seed": lambda c: c.seed,
    "--random-crop": lambda c: c.augmentation.crop_padding,
    "--random-flip": lambda c: c.augmentation.flip,
    "--partition": lambda c: None if c.share_weights is None else list(c.share_weights),
    "--dtype": lambda c: c.dtype,
}
# The other flags every rank of a job must share (a rank with another --epochs would wait forever).
# Per-rank flags (--device, --data-dir, --blas-threads, output paths, --no-progress) may differ.
JOB_FLAGS: dict[str, Callable[[RunConfig], Any]] = {
    **TRAINING_FLAGS,
    "--epochs": lambda c: c.epochs,
    "--eval-steps": lambda c: c.eval_steps,
    "--comm": lambda c: c.comm,
    "--balance": lambda c: c.balance,
    "--balance-warmup": lambda c: c.balance_warmup,
    "--balance-every": lambda c: c.balance_every,
    "--bucket-mb": lambda c: c.bucket_mb,
    "--no-overlap": lambda c: not c.overlap,
    "--collective-timeout": lambda c: c.collective_timeout,
    "--checkpoint-every": lambda c: c.checkpoint_every,
    "--resume": lambda c: c.resume is not None,
    "--trace": lambda c: c.trace is not None,
    "--trace-skip": lambda c: c.trace_skip,
    "--trace-steps": lambda c: c.trace_steps,
    "--inject-failure": lambda c: c.faults.failure,
    "--inject-stall": lambda c: c.faults.stall,
    "--inject-delay": lambda c: c.faults.delay,
}


def new_run_id() -> str:
    """A run id: the start time to the second, then random hex, so runs started in the same second differ."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def flag_values(config: RunConfig, chosen: Mapping[str, Callable[[RunConfig], Any]] = TRAINING_FLAGS) -> dict:
    """The ``chosen`` flags' values in ``config``, as JSON would hold them."""
    return {flag: value(config) for flag, value in chosen.items()}


def differing_flags(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The flags of ``recorded`` whose value ``current`` does not have."""
    return [flag for flag, value in recorded.items() if flag in current and _listed(current[flag]) != _listed(value)]


def _listed(value: Any) -> Any:
    """A value as it compares after a JSON round trip (tuples become lists)."""
    return [_listed(v) for v in value] if isinstance(value, list | tuple) else value


def check_resumed_flags(path: str, recorded: Mapping[str, Any], config: RunConfig) -> None:
    """Refuse to resume the checkpoint at ``path``, written with the flags ``recorded``, with other
    values of them, unless --resume-override names each one that differs."""
    current = flag_values(config)
    differing = [flag for flag in differing_flags(recorded, current) if flag not in config.resume_overrides]
    if differing:
        then = ", ".join(f"{flag} {_shown(recorded[flag])}" for flag in differing)
        now = ", ".join(f"{flag} {_shown(current[flag])}" for flag in differing)
        raise UserError(f"checkpoint {path} was written with {then}; this run has {now}: resume with the "
                        f"checkpoint's values, or add --resume-override {','.join(f[2:] for f in differing)} "
                        "to continue with the new ones")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "(none)"
    return "(default)" if value is None else str(value)


def check_ranks_agree(configurations: list[dict]) -> None:
    """Refuse a job whose ranks were given different values of a flag they must share (MPMD
    launches); ``configurations[r]`` is rank r's :data:`JOB_FLAGS` values. Names the ranks."""
    reference = configurations[0]
    for rank, values in enumerate(configurations[1:], start=1):
        differing = differing_flags(values, reference)
        if differing:
            others = [r for r, v in enumerate(configurations) if differing_flags(v, reference)]
            details = ", ".join(f"{flag} {_shown(reference[flag])} on rank 0 but {_shown(values[flag])} on rank "
                                f"{rank}" for flag in differing)
            raise UserError(f"the ranks of this job disagree: {details} (ranks that differ from rank 0: "
                            f"{', '.join(map(str, others))}): give every rank the same value")


def agree_on_job(comm: Communicator, config: RunConfig) -> str:
    """One collective round: check that every rank has the same :data:`JOB_FLAGS` (UserError on
    every rank, naming the ranks that differ) and return rank 0's new run id."""
    gathered = comm.allgather_object((flag_values(config, JOB_FLAGS), new_run_id()))
    check_ranks_agree([values for values, _ in gathered])
    return gathered[0][1]
