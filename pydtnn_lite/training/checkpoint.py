"""Checkpoints: weights, optimizer state and the step counter, written atomically by rank 0.

Every random choice of training (shuffles, dropout masks, augmentation) is seeded by
(seed, epoch, step, sample), so the global step is the whole RNG state: a run resumed
from step s draws exactly what an uninterrupted run draws after step s.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from pydtnn_lite.errors import UserError
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer

CHECKPOINT_NAME = "checkpoint.npz"


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, CHECKPOINT_NAME)


def file_mode() -> int:
    """The mode a new file gets under this process's umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save_checkpoint(directory: str, network: Network, optimizer: Optimizer, global_step: int,
                    meta: dict[str, Any]) -> str:
    """Write ``directory/checkpoint.npz`` via a temporary file and a rename, so a crash never
    leaves a torn file where the last good checkpoint was."""
    os.makedirs(directory, exist_ok=True)
    arrays = {f"param/{k}": v for k, v in network.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta/global_step"] = np.array(global_step)
    arrays["meta/json"] = np.array(json.dumps(meta))
    target = checkpoint_path(directory)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".checkpoint-", suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, allow_pickle=False, **arrays)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, file_mode())  # mkstemp's 0600 would hide it from the group
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return target


def load_checkpoint(path: str, network: Network, optimizer: Optimizer) -> tuple[int, dict[str, Any]]:
    """Restore weights and optimizer state from ``path``; return (global step, metadata)."""
    if os.path.isdir(path):
        path = checkpoint_path(path)
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train with --checkpoint-dir first, or drop --resume")
    try:
        with np.load(path) as archive:
            contents = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError) as error:
        raise UserError(f"checkpoint {path} is unreadable ({error}): resume from another one") from None
    meta = json.loads(str(contents["meta/json"]))
    try:
        network.load_state_dict({k[6:]: v for k, v in contents.items() if k.startswith("param/")})
    except ValueError as error:
        raise UserError(f"checkpoint {path} is for another model ({error}); use the same --model") from None
    try:
        optimizer.load_state_dict({k[6:]: v for k, v in contents.items() if k.startswith("optim/")})
    except (KeyError, ValueError) as error:
        raise UserError(f"checkpoint {path} holds another optimizer's state (no {error}): resume with the "
                        "--optimizer and --momentum it was written with") from None
    return int(contents["meta/global_step"]), meta
