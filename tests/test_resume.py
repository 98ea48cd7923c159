"""Run ids, resuming the same run, and what a resume refuses: other flags, a finished run, damaged files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pydtnn_lite.run_config import RunConfig
from pydtnn_lite.run_outputs import run_directory
from pydtnn_lite.run_record import new_run_id
from pydtnn_lite.train import build_parser

from mpi import assert_one_line_error, train_cli

QUICK = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0", "--steps-per-epoch", "4")


def history_of(run_dir) -> tuple[str, list[dict]]:
    """The one run directory under ``run_dir`` and its history records."""
    (directory,) = run_dir.iterdir()
    return directory.name, [json.loads(line) for line in (directory / "history.jsonl").read_text().splitlines()]


def checkpoint_meta(path) -> dict:
    with np.load(path) as archive:
        return json.loads(str(archive["meta/json"]))


def test_runs_started_in_the_same_second_get_their_own_directories():
    config = RunConfig.from_arguments(build_parser().parse_args([]), 1, 0)
    ids = {new_run_id() for _ in range(20)}
    assert len(ids) == 20 and len({run_directory(config, run_id) for run_id in ids}) == 20


def test_a_resumed_run_continues_its_directory_and_its_epoch(tmp_path):
    # Reference: two epochs in one go.
    reference = train_cli(1, *QUICK, "--epochs", "2", "--run-dir", str(tmp_path / "whole"))
    assert reference.returncode == 0, reference.stderr
    _, whole = history_of(tmp_path / "whole")
    # The same run cut after step 6 (mid-epoch 2), then resumed.
    ckpt = tmp_path / "ckpt"
    cut = train_cli(1, *QUICK, "--epochs", "2", "--run-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(ckpt),
                    "--checkpoint-every", "2", "--inject-failure", "0:6")
    assert cut.returncode != 0
    meta = checkpoint_meta(ckpt / "checkpoint.npz")
    assert meta["flags"]["--seed"] == 0 and meta["flags"]["--lr"] == 0.003 and meta["run_id"]
    resumed = train_cli(1, *QUICK, "--epochs", "2", "--run-dir", str(tmp_path / "runs"), "--checkpoint-dir",
                        str(ckpt), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    name, records = history_of(tmp_path / "runs")
    assert name == f"lenet-digits-{meta['run_id']}"
    assert [r["epoch"] for r in records] == [1, 2] and {r["run_id"] for r in records} == {meta["run_id"]}
    # The resumed epoch's loss is the mean over all of its steps, as in the run never cut.
    assert records[1]["loss"] == pytest.approx(whole[1]["loss"], rel=1e-12)
    assert records[1]["accuracy"] == pytest.approx(whole[1]["accuracy"], rel=1e-12)


@pytest.fixture(scope="module")
def finished_checkpoint(tmp_path_factory):
    """A checkpoint directory of a two-epoch run that finished."""
    directory = tmp_path_factory.mktemp("finished")
    result = train_cli(1, *QUICK, "--epochs", "2", "--run-dir", str(directory / "runs"), "--checkpoint-dir",
                       str(directory / "ckpt"))
    assert result.returncode == 0, result.stderr
    return directory / "ckpt"


@pytest.mark.parametrize("flags, message", [
    (("--epochs", "2"), "already finished at epoch 2 (step 8) and --epochs is 2: raise --epochs"),
    (("--epochs", "3", "--seed", "5", "--lr", "0.01"),
     "written with --lr 0.003, --seed 0; this run has --lr 0.01, --seed 5: resume with the checkpoint's values, "
     "or add --resume-override lr,seed"),
    (("--epochs", "3", "--random-flip", "--resume-override", "seed"), "--random-flip False"),
    (("--epochs", "3", "--optimizer", "adam"), "--optimizer sgd"),
    (("--epochs", "3", "--resume-override", "epochs"), "--resume-override takes training flags"),
])
def test_a_resume_is_refused_in_one_line(tmp_path, finished_checkpoint, flags, message):
    result = train_cli(1, *QUICK, "--run-dir", str(tmp_path), "--resume", str(finished_checkpoint), *flags)
    assert_one_line_error(result, message)


def test_an_override_lets_a_resume_change_a_training_flag(tmp_path, finished_checkpoint):
    result = train_cli(1, *QUICK, "--epochs", "3", "--lr", "0.01", "--resume-override", "lr", "--run-dir",
                       str(tmp_path), "--resume", str(finished_checkpoint))
    assert result.returncode == 0, result.stderr
    assert "resumed at step 8 (epoch 3)" in result.stdout


def damaged_files(directory, source) -> dict:
    """A truncated checkpoint, one without its metadata, an empty file, a text file and a missing one."""
    good = (source / "checkpoint.npz").read_bytes()
    (directory / "truncated.npz").write_bytes(good[:len(good) // 2])
    with np.load(source / "checkpoint.npz") as archive:
        np.savez(directory / "bare.npz", **{k: archive[k] for k in archive.files if not k.startswith("meta/")})
    (directory / "empty.npz").write_bytes(b"")
    (directory / "text.npz").write_text("weights\n")
    return {"truncated": directory / "truncated.npz", "bare": directory / "bare.npz",
            "empty": directory / "empty.npz", "not a zip": directory / "text.npz", "missing": directory / "none.npz"}


@pytest.mark.parametrize("kind, flag, message", [
    ("truncated", "--resume", "is damaged or not an .npz file"),
    ("empty", "--resume", "is damaged or not an .npz file"),
    ("bare", "--resume", "lacks its metadata"),
    ("truncated", "--load-weights", "--load-weights"),
    ("not a zip", "--load-weights", "is damaged or not an .npz file (no zip archive in it)"),
    ("missing", "--load-weights", "no such file: check the path"),
])
def test_a_damaged_checkpoint_or_weights_file_gives_one_line(tmp_path, finished_checkpoint, kind, flag, message):
    path = damaged_files(tmp_path, finished_checkpoint)[kind]
    result = train_cli(2, *QUICK, "--epochs", "3", "--run-dir", str(tmp_path), flag, str(path))
    assert_one_line_error(result, message)
    assert str(path) in result.stdout
