"""Evaluation scaled with the run: a short epoch is evaluated on the same share of the test split, the start
line says how much, and the closing throughput counts training alone, and again without the run's first step."""
from __future__ import annotations

import re

import pytest

from pydtnn_lite.train import FirstStep
from pydtnn_lite.training.evaluation import describe_evaluation, evaluation_steps
from pydtnn_lite.training.trainer import StepResult

from mpi import train_cli


def test_a_short_epoch_is_evaluated_on_its_share_of_the_test_split():
    # 10 of 100 training steps: a tenth of the 40 test batches, rounded up.
    assert evaluation_steps(None, 10, 100, 1000, 25) == 4
    assert evaluation_steps(None, 1, 100, 1000, 25) == 1
    assert evaluation_steps(None, 100, 100, 1000, 25) == 40  # whole epochs: the whole split
    assert evaluation_steps(7, 10, 100, 1000, 25) == 7  # --eval-steps wins
    assert evaluation_steps(500, 10, 100, 1000, 25) == 40


def test_the_start_line_says_what_the_evaluation_covers():
    assert describe_evaluation(4, 1000, 25) == ("evaluation on 4 of 40 test batches (100 of 1000 samples) "
                                                "after each epoch")
    assert describe_evaluation(40, 1000, 25) == "evaluation on the whole test split (1000 samples) after each epoch"
    assert describe_evaluation(0, 1000, 25) == "no evaluation"


def test_a_short_run_evaluates_its_share_and_reports_training_throughput(tmp_path):
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "10",
                       "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    # digits: 1,437 training samples (90 steps of 16) and 360 test samples (23 batches).
    assert "evaluation on 3 of 23 test batches (48 of 360 samples) after each epoch" in result.stdout
    done = re.search(r"done: 160 samples in ([\d.]+) s of training = ([\d.]+) img/s on 2 rank\(s\), ([\d.]+) img/s "
                     r"after the first step \(([\d.]+) s with evaluation and checkpoints\)", result.stdout)
    assert done, result.stdout
    training, rate, after_first, whole = map(float, done.groups())
    assert training <= whole
    assert after_first > 0 and rate > 0


def test_the_throughput_after_the_first_step_leaves_out_its_samples_and_seconds():
    first = FirstStep()
    first.after_step(1, StepResult(2.3, 0.1, 16, 4.0))  # a fresh install compiling its kernels
    first.after_step(2, StepResult(2.2, 0.1, 16, 0.5))
    assert (first.samples, first.seconds) == (16, 4.0)
    assert first.rate_after(160, 10.0) == pytest.approx(144 / 6.0)
    assert first.rate_after(16, 4.0) is None  # the run trained only its first step
