"""Checkpoints kept on disk: the last K and the best by validation accuracy, readable by the group;
--evaluate-only on the weights of a checkpoint or a weight file."""
from __future__ import annotations

import json
import os
import re
import stat

import numpy as np
import pytest

from pydtnn_lite.training.retention import BEST_NAME, retain

from mpi import assert_one_line_error, train_cli

QUICK = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16")


def fake_checkpoint(directory, step: int, accuracy: float | None) -> str:
    path = os.path.join(directory, "checkpoint.npz")
    np.savez(path, **{"meta/global_step": np.array(step),
                      "meta/json": np.array(json.dumps({"validation_accuracy": accuracy}))})
    return path


def step_of(path) -> int:
    with np.load(path) as archive:
        return int(archive["meta/global_step"])


def test_the_last_k_and_the_best_stay(tmp_path):
    for step, accuracy in [(1, 0.5), (2, 0.7), (3, 0.6), (4, None), (5, 0.65)]:
        os.replace(fake_checkpoint(tmp_path, step, accuracy), tmp_path / "written.npz")
        retain(str(tmp_path), str(tmp_path / "written.npz"), step, 3, accuracy)
    kept = sorted(name for name in os.listdir(tmp_path) if name.startswith("checkpoint-"))
    assert kept == [BEST_NAME, "checkpoint-step00000003.npz", "checkpoint-step00000004.npz",
                    "checkpoint-step00000005.npz"]
    assert step_of(tmp_path / BEST_NAME) == 2


def test_a_job_keeps_its_checkpoints_readable_and_evaluates_them_alone(tmp_path):
    ckpt, runs = tmp_path / "ckpt", tmp_path / "runs"
    umask = os.umask(0o022)
    try:
        result = train_cli(2, *QUICK, "--epochs", "4", "--steps-per-epoch", "2", "--eval-steps", "2",
                           "--keep-checkpoints", "2", "--checkpoint-dir", str(ckpt), "--run-dir", str(runs))
    finally:
        os.umask(umask)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(ckpt)) == [BEST_NAME, "checkpoint-step00000006.npz", "checkpoint-step00000008.npz",
                                        "checkpoint.npz"]
    assert all(stat.S_IMODE(os.stat(ckpt / name).st_mode) == 0o644 for name in os.listdir(ckpt))
    (history,) = runs.glob("*/history.jsonl")
    epochs = [json.loads(line) for line in history.read_text().splitlines()]
    accuracies = [epoch["validation_accuracy"] for epoch in epochs]
    best_step = epochs[accuracies.index(max(accuracies))]["step"]
    assert step_of(ckpt / BEST_NAME) == best_step

    evaluated = train_cli(2, *QUICK, "--eval-steps", "2", "--evaluate-only", "--resume", "--checkpoint-dir",
                          str(ckpt), "--run-dir", str(runs))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    found = re.search(r"evaluation of checkpoint \S+ \(step 8\) on 32 test samples: loss ([\d.]+), "
                      r"accuracy ([\d.]+)%", evaluated.stdout)
    assert found, evaluated.stdout
    assert float(found.group(2)) == pytest.approx(100 * accuracies[-1], abs=0.01)
    assert "epoch" not in evaluated.stdout  # nothing trained
    assert sorted(os.listdir(ckpt)) == [BEST_NAME, "checkpoint-step00000006.npz", "checkpoint-step00000008.npz",
                                        "checkpoint.npz"]


@pytest.mark.parametrize("flags,message", [
    (("--evaluate-only",), "add --load-weights FILE or --resume"),
    (("--evaluate-only", "--resume", "auto", "--checkpoint-dir", "none"), "there is no checkpoint in none"),
    (("--evaluate-only", "--load-weights", "w.npz", "--eval-steps", "0"), "drop --eval-steps 0"),
    (("--resume", "auto"), "--resume auto needs --checkpoint-dir"),
])
def test_evaluate_only_and_resume_auto_refuse_what_they_cannot_do(tmp_path, flags, message):
    assert_one_line_error(train_cli(2, *QUICK, "--run-dir", str(tmp_path), *flags, cwd=str(tmp_path)), message)
