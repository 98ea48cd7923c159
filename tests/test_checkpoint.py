"""Checkpoint files: what a save leaves in the directory, after a good write and after a failed one."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pydtnn_lite.training.checkpoint as checkpoints
from pydtnn_lite.backend import make_backend
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import Adam
from pydtnn_lite.training import load_checkpoint, save_checkpoint


def lenet():
    network = create_model("lenet", (8, 8, 1), 10).build(make_backend(), seed=0)
    return network, Adam(network)


def test_saves_leave_only_the_checkpoint_file(tmp_path):
    """Each save replaces checkpoint.npz through a temporary file, which never stays behind."""
    network, optimizer = lenet()
    for step in (3, 6):
        save_checkpoint(str(tmp_path), network, optimizer, step, {"model": "lenet"})
        assert os.listdir(tmp_path) == ["checkpoint.npz"]
    assert load_checkpoint(str(tmp_path), *lenet())[0] == 6


def test_a_failed_save_keeps_the_last_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A write that fails half-way (disk full) changes nothing on disk."""
    network, optimizer = lenet()
    save_checkpoint(str(tmp_path), network, optimizer, 3, {"model": "lenet"})
    before = (tmp_path / "checkpoint.npz").read_bytes()

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.os, "fsync", disk_full)
    network.flat_params[:] = 0.0
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(str(tmp_path), network, optimizer, 6, {"model": "lenet"})
    assert os.listdir(tmp_path) == ["checkpoint.npz"]
    assert (tmp_path / "checkpoint.npz").read_bytes() == before
    restored, restored_optimizer = lenet()
    assert load_checkpoint(str(tmp_path), restored, restored_optimizer)[0] == 3
    assert np.any(restored.flat_params != 0)
