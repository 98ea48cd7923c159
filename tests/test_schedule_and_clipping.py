"""Cosine decay with warm-up, and gradient clipping by the global norm of the summed gradient."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule, clip_by_global_norm
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine
from pydtnn_lite.perfmodel.modelling.trace_validation import validation_of
from pydtnn_lite.tracing import load_trace
from pydtnn_lite.training import TrainerSettings, build_trainer

from mpi import REPO, assert_one_line_error, train_cli

REFERENCE_CALIBRATION = os.path.join(REPO, "calibration", "dev-2core.json")


def test_cosine_decay_warms_up_then_follows_half_a_cosine_to_the_floor():
    schedule = LearningRateSchedule(0.1, warmup_epochs=1, cosine_epochs=5, min_lr=0.001)
    lrs = [schedule(step, 10) for step in range(60)]
    assert lrs[:10] == pytest.approx([0.1 * (step + 1) / 10 for step in range(10)])
    # After the warm-up: 40 steps from 0.1 down to 0.001, halfway at the mean of the two.
    assert lrs[10] == pytest.approx(0.1)
    assert lrs[30] == pytest.approx(0.001 + 0.099 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[50:] == pytest.approx([0.001] * 10)


def test_clipping_scales_a_long_gradient_to_the_limit_and_leaves_a_short_one():
    gradient = np.array([3.0, 4.0])
    assert clip_by_global_norm(gradient, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(gradient, [0.6, 0.8])
    assert clip_by_global_norm(gradient, 2.0) == pytest.approx(1.0)
    np.testing.assert_allclose(gradient, [0.6, 0.8])


def test_a_traced_clipped_step_shows_the_norm_and_the_scaling_and_its_prediction_has_them(tmp_path):
    trace = tmp_path / "trace"
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "3",
                       "--eval-steps", "0", "--clip-grad-norm", "1e6", "--run-dir", str(tmp_path),
                       "--trace", str(trace))
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = load_trace(str(trace))
    records, steps, meta = loaded
    assert meta["clip_grad_norm"] == 1e6
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend("cpu", "float32"), seed=0)
    gradient = network.param_count * 4
    # Never longer than 1e6, each step's gradient is still read for its norm, then scaled (by 1).
    clipping = sorted((r.rank, r.step, r.kernel, r.bytes) for r in records
                      if r.kernel in ("gradient_norm", "scale_gradient") and r.stage == "WU" and r.layer == -1)
    assert clipping == sorted((s.rank, s.step, kernel, nbytes) for s in steps
                              for kernel, nbytes in (("gradient_norm", gradient), ("scale_gradient", 2 * gradient)))
    validation = validation_of(str(trace), loaded, calibrated_machine(REFERENCE_CALIBRATION))
    assert {k.kernel for k in validation.kernels if k.layer == -1 and k.stage == "WU"} == {
        "gradient_norm", "scale_gradient"}


def test_a_clipped_step_moves_the_weights_by_lr_times_the_limit():
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend("cpu", "float64"), seed=0)
    trainer = build_trainer(network, data, TrainerSettings(32, steps_per_epoch=1, clip_grad_norm=0.01),
                            optimizer=SGD(network, momentum=0.0), schedule=LearningRateSchedule(0.5))
    before = network.flat_params.copy()
    trainer.train_epoch(0)
    assert trainer.gradient_norm > 0.01
    assert np.linalg.norm(network.flat_params - before) == pytest.approx(0.5 * 0.01)


def test_two_ranks_clip_the_summed_gradient_as_one_process_does(tmp_path):
    weights = []
    for ranks in (1, 2):
        out = tmp_path / f"{ranks}.npz"
        result = train_cli(ranks, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--dtype",
                           "float64", "--steps-per-epoch", "3", "--eval-steps", "0", "--clip-grad-norm", "0.05",
                           "--lr-schedule", "cosine", "--warmup-epochs", "0.5", "--run-dir", str(tmp_path),
                           "--save-weights", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        with np.load(out) as archive:
            weights.append({key: archive[key] for key in archive.files})
    for key, value in weights[0].items():
        np.testing.assert_allclose(weights[1][key], value, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("flags,message", [
    (("--lr-schedule", "cosine", "--lr-decay-epochs", "2"), "give one of them"),
    (("--lr-schedule", "cosine", "--min-lr", "1"), "--min-lr must be at least 0 and below --lr"),
    (("--clip-grad-norm", "0"), "--clip-grad-norm: must be a finite number above 0"),
])
def test_bad_schedule_and_clipping_flags_give_one_line(tmp_path, flags, message):
    assert_one_line_error(train_cli(2, "--model", "lenet", "--dataset", "digits", "--run-dir", str(tmp_path), *flags),
                          message)
