"""The trainer's command line: bad input, resume, failures, summaries (spawned jobs)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from pydtnn_lite.backend import gpu_available, make_backend
from pydtnn_lite.data import open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, Adam, LearningRateSchedule
from pydtnn_lite.training import TrainerSettings, build_trainer

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
    (("--batch-size", "0"), "argument --batch-size: must be an integer at least 1, got '0'"),
    (("--lr", "nan"), "argument --lr: must be a finite number above 0"),
    (("--partition", "nan,1"), "argument --partition: must be"),
    (("--collective-timeout", "-5"), "argument --collective-timeout: must be a finite number from 0"),
    (("--batch-size", "5000"), "the global batch of 5000 is more than the 1437 training samples of digits"),
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
    result = train_cli(2, *QUICK, "--steps-per-epoch", "3", "--epochs", "4", "--lr", "1e4", "--resume-override", "lr",
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
    # Each rank's augmentation draws continue where they stopped.
    (2, ("--random-crop", "2", "--random-flip"), "random crop (2 px zero padding), random horizontal flip"),
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


def train_in_process(start, optimizer: str = "adam", weight_decay: float = 0.05, dtype: str = "float64"):
    """The weights that 3 steps of QUICK's job with ``--lr 0.01`` give, set up in Python: weights from the
    file ``start`` (None: the seed's), the given optimizer, weight decay and dtype."""
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend("cpu", dtype), seed=0)
    if start is not None:
        network.load(str(start))
    chosen = Adam(network, weight_decay=weight_decay) if optimizer == "adam" else SGD(network, 0.9, False,
                                                                                      weight_decay)
    trainer = build_trainer(network, data, TrainerSettings(16, steps_per_epoch=3), optimizer=chosen,
                            schedule=LearningRateSchedule(0.01))
    trainer.train_epoch(0)
    return network.state_dict()


def test_loaded_weights_optimizer_weight_decay_dtype_and_device_reach_the_training(tmp_path):
    """--load-weights starts the run from the file, --optimizer adam --weight-decay 0.05 update with them, and
    --dtype float64 computes in float64: the weights are those of the same choices made in Python, and each
    choice changes them. --device auto is the CPU where CuPy sees no GPU."""
    start = tmp_path / "start.npz"
    create_model("lenet", (8, 8, 1), 10).build(make_backend("cpu", "float64"), seed=7).save(str(start))
    result = train_cli(1, *QUICK, "--steps-per-epoch", "3", "--lr", "0.01", "--optimizer", "adam",
                       "--weight-decay", "0.05", "--dtype", "float64", "--device", "auto", "--load-weights",
                       str(start), "--save-weights", str(tmp_path / "trained.npz"), "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    if not gpu_available():
        assert "device cpu" in result.stdout
    trained = load(tmp_path / "trained.npz")
    assert all(array.dtype == np.float64 for array in trained.values())

    def same(expected):
        return expected.keys() == trained.keys() and all(
            np.allclose(trained[name], expected[name], rtol=1e-9, atol=1e-12) for name in expected)

    assert same(train_in_process(start))
    for other in (train_in_process(None), train_in_process(start, optimizer="sgd"),
                  train_in_process(start, weight_decay=0.0), train_in_process(start, dtype="float32")):
        assert not same(other)


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
