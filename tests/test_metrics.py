"""Per-step metrics: metrics.csv in the run directory, TensorBoard event files with --tensorboard."""
from __future__ import annotations

import csv
import glob
import struct

import pytest

from pydtnn_lite.errors import UserError
from pydtnn_lite.training.metrics import COLUMNS, StepMetrics, tensorboard_writer

from mpi import train_cli


def rows_of(path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """The scalar summaries of the TensorBoard event files in ``directory``, by tag."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    found: dict[str, list[tuple[int, float]]] = {}
    for path in glob.glob(str(directory / "events.out.tfevents.*")):
        data = open(path, "rb").read()
        at = 0
        while at < len(data):  # TFRecord: length, its CRC, the record, its CRC
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 16 + length
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_every_step_s_figures_go_to_metrics_csv_and_a_resumed_run_appends(tmp_path):
    from pydtnn_lite.training import StepResult

    metrics = StepMetrics(str(tmp_path), run_id="run-a")
    metrics.step(1, 1, StepResult(2.5, 0.25, 64, 0.5), 0.1)
    metrics.close()
    metrics = StepMetrics(str(tmp_path), run_id="run-a")
    metrics.step(2, 1, StepResult(2.0, 0.5, 64, 0.25), 0.05)
    metrics.close()
    rows = rows_of(tmp_path / "metrics.csv")
    assert list(rows[0]) == list(COLUMNS)
    assert [(r["run_id"], r["step"], r["loss"], r["learning_rate"], r["images_per_second"]) for r in rows] == [
        ("run-a", "1", "2.5", "0.1", "128"), ("run-a", "2", "2", "0.05", "256")]


def test_a_job_writes_one_metrics_row_per_step_and_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboardX")
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "3",
                       "--epochs", "2", "--eval-steps", "1", "--lr", "0.01", "--lr-decay-epochs", "1",
                       "--run-dir", str(tmp_path), "--tensorboard")
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = [p.parent for p in tmp_path.glob("*/metrics.csv")]
    rows = rows_of(run_dir / "metrics.csv")
    assert [(int(r["step"]), int(r["epoch"])) for r in rows] == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    assert {r["run_id"] for r in rows} == {run_dir.name.split("-", 2)[2]}  # <model>-<dataset>-<run id>
    assert [float(r["learning_rate"]) for r in rows] == pytest.approx([0.01] * 3 + [0.001] * 3)
    assert all(float(r["images_per_second"]) > 0 and float(r["step_seconds"]) > 0 for r in rows)
    events = scalars(run_dir)
    assert [step for step, _ in events["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [value for _, value in events["train/loss"]] == pytest.approx([float(r["loss"]) for r in rows], rel=1e-4)
    assert [step for step, _ in events["validation/accuracy"]] == [3, 6]


def test_tensorboard_without_its_library_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(UserError, match=r"pip install 'pydtnn_lite\[tensorboard\]'"):
        tensorboard_writer("unused")
