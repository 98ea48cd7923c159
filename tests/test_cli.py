"""The trainer's command line: bad input, resume, failures, summaries (spawned jobs)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from mpi import assert_one_line_error, train_cli

QUICK = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0")


def load(path):
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


@pytest.mark.parametrize("flags,message", [
    (("--model", "vgg99"), "unknown model 'vgg99'"),
    (("--dataset", "imagenet22k"), "unknown data set 'imagenet22k'"),
    (("--dataset", "cifar10"), "pass --data-dir"),
    (("--dataset", "cifar10", "--data-dir", "/nonexistent"), "/nonexistent"),
    (("--batch-size", "1"), "smaller than the 2 ranks"),
    (("--batch-size", "0"), "smaller than the 2 ranks"),
    (("--model", "vgg11", "--dataset", "digits"), "does not fit digits"),
    (("--resume",), "--resume without a path needs --checkpoint-dir"),
    (("--validate", "calibration.json"), "add --trace DIR"),
    (("--validate", "/nonexistent.json", "--trace", "traces"), "cannot read calibration file /nonexistent.json"),
    (("--run-dir", "/proc/forbidden"), "cannot write to --run-dir"),
])
def test_bad_input_gives_one_line_error_on_every_rank(tmp_path, flags, message):
    started = time.monotonic()
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--run-dir", str(tmp_path), *flags,
                       cwd=str(tmp_path))
    assert time.monotonic() - started < 60
    assert_one_line_error(result, message)


def test_nan_loss_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    result = train_cli(2, *QUICK, "--steps-per-epoch", "3", "--epochs", "2", "--checkpoint-dir", str(ckpt),
                       "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    before = load(ckpt / "checkpoint.npz")
    result = train_cli(2, *QUICK, "--steps-per-epoch", "3", "--epochs", "4", "--lr", "1e30",
                       "--checkpoint-dir", str(ckpt), "--resume", "--run-dir", str(tmp_path))
    assert result.returncode == 3
    assert "the loss became" in result.stdout and "lower --lr" in result.stdout
    after = load(ckpt / "checkpoint.npz")
    assert all(np.array_equal(before[k], after[k]) for k in before if k != "meta/json")


def test_a_failing_rank_ends_the_whole_job_quickly(tmp_path):
    started = time.monotonic()
    result = train_cli(2, *QUICK, "--steps-per-epoch", "50", "--inject-failure", "1:2", "--run-dir", str(tmp_path))
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    assert "rank 1 of 2 failed" in result.stderr


@pytest.mark.parametrize("model", ["lenet", "resnet18"])
def test_a_stalled_rank_is_named_by_the_collective_timeout(tmp_path, model):
    # The others wait for rank 2 first in a gradient bucket (lenet) or a batch-norm reduction (resnet18).
    started = time.monotonic()
    result = train_cli(3, *QUICK, "--model", model, "--steps-per-epoch", "50", "--inject-stall", "2:2",
                       "--collective-timeout", "2", "--run-dir", str(tmp_path))
    assert result.returncode != 0
    assert time.monotonic() - started < 40
    assert "waited more than 2 s in collective" in result.stderr
    assert "rank(s) 2 never arrived" in result.stderr


@pytest.mark.parametrize("ranks,flags,augmentation", [
    (1, (), "none"),
    (2, (), "none"),
    (1, ("--random-crop", "2", "--random-flip"), "random crop (2 px zero padding), random horizontal flip"),
    # Batch-norm running statistics and Adam's moments and step count travel in the checkpoint.
    (2, ("--model", "resnet18", "--optimizer", "adam", "--lr", "0.001"), "none"),
])
def test_resumed_run_equals_uninterrupted_run(tmp_path, ranks, flags, augmentation):
    common = (*QUICK, *flags, "--steps-per-epoch", "4", "--run-dir", str(tmp_path), "--checkpoint-every", "3")
    full = train_cli(ranks, *common, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "a"),
                     "--save-weights", str(tmp_path / "full.npz"))
    assert full.returncode == 0, full.stderr[-2000:]
    assert f"augmentation: {augmentation};" in full.stdout
    first = train_cli(ranks, *common, "--epochs", "1", "--checkpoint-dir", str(tmp_path / "b"))
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = train_cli(ranks, *common, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "b"), "--resume",
                        "--save-weights", str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed at step 3" in resumed.stdout
    expected, actual = load(tmp_path / "full.npz"), load(tmp_path / "resumed.npz")
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_history_and_closing_line(tmp_path):
    result = train_cli(1, *QUICK, "--steps-per-epoch", "5", "--epochs", "2", "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done: 160 samples" in result.stdout and "img/s" in result.stdout
    (run,) = os.listdir(tmp_path)
    lines = (tmp_path / run / "history.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"epoch": 2' in lines[1]


def test_summary_lists_layers_and_flops():
    result = train_cli(1, "--model", "vgg11", "--summary")
    assert result.returncode == 0, result.stderr
    assert "conv8" in result.stdout and "total parameters 9,225,610" in result.stdout
    assert "forward 0.306 GFLOP/sample" in result.stdout
