"""Damaged trace files, mismatched data splits and diverging training: one line naming the file (and
line) or the step, never a traceback or a silent wrong figure."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pydtnn_lite import trace, validate
from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import DataError, NpzShardDataset, check_test_matches_train, open_dataset
from pydtnn_lite.errors import TrainingError, UserError
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD
from pydtnn_lite.runtime import environment_blas_threads
from pydtnn_lite.tracing import Tracer
from pydtnn_lite.training import TrainerSettings, build_trainer, save_checkpoint
from pydtnn_lite.training.divergence import WARMUP, DivergenceGuard

from mpi import MPIEXEC, assert_one_line_error, train_cli


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory):
    """A trace directory of three lenet steps on digits (one skipped)."""
    directory = tmp_path_factory.mktemp("trace")
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend(), seed=0)
    trainer = build_trainer(network, data, TrainerSettings(8, steps_per_epoch=3))
    tracer = Tracer(trainer, skip_steps=1).attach()
    trainer.train_epoch(0)
    tracer.detach()
    tracer.save(str(directory), {"model": "lenet", "dataset": "digits", "global_batch": 8, "ranks": 1})
    return directory


def cut_events(directory) -> None:
    text = (directory / "events.csv").read_text()
    (directory / "events.csv").write_text(text[:len(text) // 2])


def header_only(name: str):
    def damage(directory) -> None:
        (directory / name).write_text((directory / name).read_text().splitlines()[0] + "\n")
    return damage


def append_bytes(data: bytes):
    def damage(directory) -> None:
        with open(directory / "events.csv", "ab") as stream:
            stream.write(data)
    return damage


def rewrite_meta(change):
    def damage(directory) -> None:
        meta = json.loads((directory / "meta.json").read_text())
        (directory / "meta.json").write_text(json.dumps(change(meta)))
    return damage


def another_header(directory) -> None:
    text = (directory / "steps.csv").read_text()
    (directory / "steps.csv").write_text("rank,step,seconds\n" + text.split("\n", 1)[1])


def cut_meta(directory) -> None:
    (directory / "meta.json").write_text((directory / "meta.json").read_text()[:30])


DAMAGES = {
    "cut events": (cut_events, r"events.csv line \d+: \d+ fields instead of 14"),
    "header-only events": (header_only("events.csv"), "events.csv holds no kernel of a training step"),
    "header-only steps": (header_only("steps.csv"), "steps.csv holds no traced training step"),
    "another version's steps": (another_header, "steps.csv line 1: not a StepRecord file of this version .*: "
                                                  "trace the run again"),
    "NUL bytes": (append_bytes(b"\0\0\0\0"), r"events.csv line \d+:"),
    "not UTF-8": (append_bytes(b"\xff\xfe\n"), r"events.csv line \d+: not UTF-8"),
    "cut meta": (cut_meta, r"meta.json line \d+: not JSON"),
    "meta without model": (rewrite_meta(lambda m: {k: v for k, v in m.items() if k != "model"}),
                           "meta.json lacks model"),
    "meta a list": (rewrite_meta(lambda m: [m]), "meta.json: not a JSON object"),
}


@pytest.mark.parametrize("command", ["summarize", "validate"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_trace_is_named_in_one_line(tmp_path, good_trace, capsys, command, damage):
    directory = tmp_path / "trace"
    shutil.copytree(good_trace, directory)
    make_damage, message = DAMAGES[damage]
    make_damage(directory)
    if command == "summarize":
        status = trace.main(["summarize", str(directory)])
    else:
        status = validate.main([str(directory), "--preset", "ampere"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and str(directory) in err
    assert __import__("re").search(message, err), err


def test_validate_refuses_a_meta_json_naming_another_model(tmp_path, good_trace, capsys):
    directory = tmp_path / "trace"
    shutil.copytree(good_trace, directory)
    rewrite_meta(lambda meta: dict(meta, model="mlp"))(directory)
    assert validate.main([str(directory), "--preset", "ampere"]) == 2
    err = capsys.readouterr().err
    assert "names model mlp, but" in err and "layer 0 is conv1 there, flatten1 in mlp" in err


def test_the_undamaged_trace_validates(good_trace, capsys):
    assert validate.main([str(good_trace), "--preset", "ampere", "--out", str(good_trace / "v"), "--json"]) == 0


# ---------------------------------------------------------------- train and test splits
def write_split(directory, split: str, labels, side: int = 5) -> None:
    images = np.zeros((len(labels), side, side, 3), dtype=np.uint8)
    np.savez(os.path.join(directory, f"{split}-00000.npz"), x=images, y=np.array(labels))


@pytest.mark.parametrize("test_labels, test_side, message", [
    ([0, 7], 5, "the test split has label 7 but the training split has 4 classes"),
    ([0, 1], 6, r"the test split's images are \(6, 6, 3\) but the training split's are \(5, 5, 3\)"),
])
def test_a_test_split_that_does_not_match_training_is_refused_when_opened(tmp_path, test_labels, test_side, message):
    write_split(tmp_path, "train", [0, 1, 2, 3])
    write_split(tmp_path, "test", test_labels, test_side)
    with pytest.raises(DataError, match=message):
        check_test_matches_train(NpzShardDataset(tmp_path, "train"), NpzShardDataset(tmp_path, "test"))


def test_the_trainer_refuses_mismatched_splits_before_training(tmp_path):
    write_split(tmp_path, "train", [0, 1, 2, 3] * 4, side=8)
    write_split(tmp_path, "test", [0, 9], side=8)
    result = train_cli(2, "--model", "mlp", "--dataset", "npz", "--data-dir", str(tmp_path), "--batch-size", "4",
                       "--run-dir", str(tmp_path / "runs"))
    assert_one_line_error(result, "the test split has label 9 but the training split has 4 classes")
    assert "epoch 1" not in result.stdout


# ---------------------------------------------------------------- divergence
def test_divergence_is_caught_from_the_loss_s_median_and_from_the_gradients():
    guard = DivergenceGuard(num_classes=10)
    for step in range(WARMUP):
        guard.check(step, 2.3, 0.5)
    guard.check(WARMUP, 20.0, 0.5)  # a spike below ten times the loss of guessing: noise, not divergence
    with pytest.raises(TrainingError, match=r"training diverged at step 7: loss 2300 against a median of 2\.3 "):
        guard.check(7, 2300.0, 0.5)
    with pytest.raises(TrainingError, match="the gradients became nan at step 8"):
        guard.check(8, 2.3, float("nan"))
    with pytest.raises(TrainingError, match="the loss became inf at step 9"):
        guard.check(9, float("inf"), 0.5)


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend(), seed=0)
    optimizer = SGD(network)
    save_checkpoint(str(tmp_path), network, optimizer, 1, {})
    before = (tmp_path / "checkpoint.npz").read_bytes()
    network.flat_params[3] = np.inf
    with pytest.raises(TrainingError, match="not finite at step 2: not checkpointed"):
        save_checkpoint(str(tmp_path), network, optimizer, 2, {})
    assert (tmp_path / "checkpoint.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz"]


def test_exploding_training_stops_in_one_line_on_every_rank(tmp_path):
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0",
                       "--steps-per-epoch", "20", "--lr", "1e4", "--momentum", "0", "--run-dir", str(tmp_path),
                       "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1")
    assert result.returncode == 3, result.stderr[-2000:]
    errors = [line for line in result.stdout.splitlines() if "error:" in line]
    assert len(errors) == 1 and "lower --lr" in errors[0] and result.stderr == ""
    with np.load(tmp_path / "ckpt" / "checkpoint.npz") as archive:
        assert all(np.isfinite(archive[name]).all() for name in archive.files if name.startswith("param/"))


# ---------------------------------------------------------------- environment and MPMD launches
def test_blas_threads_follow_the_environment(monkeypatch):
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)
    assert environment_blas_threads() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3,1")
    assert environment_blas_threads() == (3, "OMP_NUM_THREADS")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert environment_blas_threads() == (1, "OPENBLAS_NUM_THREADS")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "0")
    with pytest.raises(UserError, match="OPENBLAS_NUM_THREADS=0 is not a positive number of threads"):
        environment_blas_threads()


def test_the_start_line_shows_the_blas_threads_the_environment_set(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    result = train_cli(1, "--model", "lenet", "--dataset", "digits", "--batch-size", "8", "--eval-steps", "0",
                       "--steps-per-epoch", "1", "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "1 BLAS threads per rank (from OMP_NUM_THREADS)" in result.stdout


def test_mpmd_ranks_that_disagree_are_named(tmp_path):
    common = [sys.executable, "-m", "pydtnn_lite.train", "--no-progress", "--model", "lenet", "--dataset", "digits",
              "--eval-steps", "0", "--steps-per-epoch", "2", "--run-dir", str(tmp_path)]
    result = subprocess.run([MPIEXEC, "-n", "1", *common, "--batch-size", "16", "--device", "cpu", ":",
                             "-n", "2", *common, "--batch-size", "32", "--device", "cpu"],
                            capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "--batch-size 16 on rank 0 but 32 on rank 1 (ranks that differ from rank 0: 1, 2)")


def test_a_report_read_by_head_ends_without_a_traceback():
    # A megabyte outgrows the pipe's buffer, so the write meets the pipe head has closed.
    script = "from pydtnn_lite.cli import print_output; print_output('x' * 1_000_000)"
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} | head -c 5"
    finished = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert finished.stdout == "xxxxx"
    assert "Traceback" not in finished.stderr and "BrokenPipe" not in finished.stderr, finished.stderr
