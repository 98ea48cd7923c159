"""Checkpoints: weights, optimizer state and the step counter, written atomically by rank 0.

Every random choice of training (shuffles, dropout masks, augmentation) is seeded by
(seed, epoch, step, sample), so the global step is the whole RNG state: a run resumed
from step s draws exactly what an uninterrupted run draws after step s.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from typing import Any

import numpy as np

from pydtnn_lite.errors import TrainingError, UserError
from pydtnn_lite.network import Network
from pydtnn_lite.optim import Optimizer

CHECKPOINT_NAME = "checkpoint.npz"
TEMPORARY_PREFIX = ".checkpoint-"


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, CHECKPOINT_NAME)


def check_finite_weights(network: Network, global_step: int, directory: str) -> dict[str, np.ndarray]:
    """``network``'s state on the host; TrainingError if a value is not finite (nothing is checkpointed)."""
    weights = network.state_dict()
    broken = [name for name, value in weights.items() if not np.isfinite(value).all()]
    if broken:
        raise TrainingError(f"the weights of {', '.join(broken[:3])}{' ...' if len(broken) > 3 else ''} are not "
                            f"finite at step {global_step}: not checkpointed, the last checkpoint in {directory} "
                            "is kept; lower --lr (or add --warmup-epochs)")
    return weights


def file_mode() -> int:
    """The mode a new file gets under this process's umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save_checkpoint(directory: str, network: Network, optimizer: Optimizer, global_step: int,
                    meta: dict[str, Any]) -> str:
    """Write ``directory/checkpoint.npz`` via a temporary file and a rename, so a crash never
    leaves a torn file where the last good checkpoint was. Raises TrainingError, writing
    nothing, if a weight is not finite."""
    os.makedirs(directory, exist_ok=True)
    weights = check_finite_weights(network, global_step, directory)
    arrays = {f"param/{k}": v for k, v in weights.items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta/global_step"] = np.array(global_step)
    arrays["meta/json"] = np.array(json.dumps(meta))
    target = checkpoint_path(directory)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX, suffix=".npz")
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


def read_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """Every array of the .npz file ``path``; UserError naming ``what`` and the file when it is
    missing or damaged."""
    if not os.path.isfile(path):
        raise UserError(f"{what} {path}: no such file: check the path")
    if not zipfile.is_zipfile(path):  # NumPy would read it as a pickle and suggest loading it unsafely
        raise UserError(f"{what} {path} is damaged or not an .npz file (no zip archive in it): use another copy")
    try:
        with np.load(path) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        reason = str(error) or type(error).__name__
        raise UserError(f"{what} {path} is damaged or not an .npz file ({reason}): use another copy") from None


def remove_stale_temporaries(directory: str) -> list[str]:
    """Delete the temporary files of checkpoint writes that never finished (a killed run's) in
    ``directory``; only safe while this run holds the directory's lock. Returns their names."""
    stale = [name for name in os.listdir(directory) if name.startswith(TEMPORARY_PREFIX) and name.endswith(".npz")]
    for name in stale:
        os.unlink(os.path.join(directory, name))
    return stale


def read_checkpoint(path: str) -> tuple[dict[str, np.ndarray], int, dict[str, Any]]:
    """The arrays, global step and metadata of the checkpoint at ``path`` (a file, or a directory
    holding one); UserError when it is missing or damaged."""
    if os.path.isdir(path):
        path = checkpoint_path(path)
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train with --checkpoint-dir first, or drop --resume")
    contents = read_npz(path, "checkpoint")
    try:
        meta = json.loads(str(contents["meta/json"]))
        global_step = int(contents["meta/global_step"])
    except (KeyError, ValueError) as error:
        raise UserError(f"checkpoint {path} lacks its metadata ({error}): it was not written by "
                        "--checkpoint-dir; resume from another one") from None
    return contents, global_step, meta


def restore_checkpoint(path: str, contents: dict[str, np.ndarray], network: Network, optimizer: Optimizer) -> None:
    """Put the weights and optimizer state of the checkpoint ``contents`` (read from ``path``) in place."""
    try:
        network.load_state_dict({k[6:]: v for k, v in contents.items() if k.startswith("param/")})
    except ValueError as error:
        raise UserError(f"checkpoint {path} is for another model ({error}); use the same --model") from None
    try:
        optimizer.load_state_dict({k[6:]: v for k, v in contents.items() if k.startswith("optim/")})
    except (KeyError, ValueError) as error:
        raise UserError(f"checkpoint {path} holds another optimizer's state (no {error}): resume with the "
                        "--optimizer and --momentum it was written with") from None


def load_checkpoint(path: str, network: Network, optimizer: Optimizer) -> tuple[int, dict[str, Any]]:
    """Restore weights and optimizer state from ``path``; return (global step, metadata)."""
    contents, global_step, meta = read_checkpoint(path)
    restore_checkpoint(path, contents, network, optimizer)
    return global_step, meta
