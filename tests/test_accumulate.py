"""Gradient accumulation: K micro-batches per update train the same weights as one batch K times
larger, and a traced step of them is what the performance model predicts."""
from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import Augmentation, open_dataset
from pydtnn_lite.layers.base import gradient_sum_cost
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine
from pydtnn_lite.perfmodel.modelling.trace_validation import validation_of
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.step_costs import micro_batch_costs
from pydtnn_lite.tracing import load_trace
from pydtnn_lite.training import TrainerSettings, build_trainer

from mpi import REPO, train_cli

REFERENCE_CALIBRATION = os.path.join(REPO, "calibration", "dev-2core.json")


def trained(batch: int, accumulate: int, prefetch: int = 0, steps: int | None = None):
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend("cpu", "float64"), seed=0)
    settings = TrainerSettings(batch, seed=1, steps_per_epoch=steps, augmentation=Augmentation(1, True),
                               prefetch=prefetch, accumulate=accumulate)
    trainer = build_trainer(network, data, settings, optimizer=SGD(network, momentum=0.9),
                            schedule=LearningRateSchedule(0.05, warmup_epochs=0.5))
    result = trainer.train_epoch(0)
    return network.flat_params, trainer, result


@pytest.fixture(scope="module")
def large_batch():
    return trained(48, 1)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_accumulating_k_batches_equals_a_k_times_larger_batch(large_batch, prefetch):
    # A whole epoch, whose last step is short: its micro-batches are cut the same way.
    large, large_trainer, large_result = large_batch
    accumulated, trainer, result = trained(16, 3, prefetch)
    assert trainer.steps_per_epoch == large_trainer.steps_per_epoch
    assert len(trainer.data) % 48  # the last step is short
    np.testing.assert_allclose(accumulated, large, rtol=1e-9, atol=1e-12)
    assert (result.loss, result.accuracy, result.samples) == pytest.approx(
        (large_result.loss, large_result.accuracy, large_result.samples))


def test_accumulation_differs_from_k_separate_updates():
    accumulated = trained(16, 3, steps=3)[0]
    separate = trained(16, 1, steps=9)[0]
    assert not np.allclose(accumulated, separate)


def test_a_two_rank_job_accumulating_equals_one_with_the_larger_batch(tmp_path):
    weights, outputs = {}, {}
    for name, flags in {"accumulated": ("--batch-size", "8", "--accumulate", "3"),
                        "large": ("--batch-size", "24")}.items():
        out = tmp_path / f"{name}.npz"
        result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--steps-per-epoch", "4", "--eval-steps", "0",
                           "--dtype", "float64", "--random-flip", "--run-dir", str(tmp_path),
                           "--save-weights", str(out), *flags)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = result.stdout
        with np.load(out) as archive:
            weights[name] = {key: archive[key] for key in archive.files}
    assert "global batch 8 x 3 accumulated = 24 per update" in outputs["accumulated"]
    for key, value in weights["large"].items():
        np.testing.assert_allclose(weights["accumulated"][key], value, rtol=1e-9, atol=1e-12, err_msg=key)


def test_a_traced_step_of_micro_batches_pairs_every_call_with_its_cost_and_its_prediction(tmp_path):
    trace = tmp_path / "trace"
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "8", "--accumulate", "3",
                       "--steps-per-epoch", "4", "--eval-steps", "0", "--run-dir", str(tmp_path), "--trace", str(trace))
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = load_trace(str(trace))
    records, steps, meta = loaded
    assert meta["accumulate"] == 3 and {s.samples for s in steps} == {12}  # 3 micro-batches of 4 rows a rank
    computed = [r for r in records if r.phase == "train" and r.stage in ("FP", "BP", "WU")]
    assert all(math.isfinite(r.flops) and math.isfinite(r.bytes) for r in computed)
    # The first micro-batch's gradients copied, the later two added: 2 and 3 passes over them a step.
    data = open_dataset("digits")
    network = create_model("lenet", data.input_shape, data.num_classes).build(make_backend("cpu", "float32"), seed=0)
    summed = [(r.step, r.kernel, r.bytes) for r in computed
              if r.kernel in ("start_gradient_sum", "accumulate_gradients") and r.rank == 0]
    gradient = network.param_count * 4
    assert sorted(summed) == sorted((s.step, kernel, b) for s in steps if s.rank == 0 for kernel, b in (
        ("start_gradient_sum", 2 * gradient), ("accumulate_gradients", 3 * gradient),
        ("accumulate_gradients", 3 * gradient)))
    # Three forwards and backwards and one update a step: every call has its own prediction.
    calls = Counter((r.rank, r.step) for r in computed)
    validation = validation_of(str(trace), loaded, calibrated_machine(REFERENCE_CALIBRATION))
    predicted = [k for k in validation.kernels if k.stage in ("FP", "BP", "WU")]
    assert set(calls.values()) == {len(predicted)}
    assert Counter(k.kernel for k in predicted)["sgd_update"] == Counter(
        r.kernel for r in computed if (r.rank, r.step) == min(calls))["sgd_update"]


def test_a_calibration_predicts_the_sum_from_its_add_of_two_gradients_as_long():
    machine = calibrated_machine(REFERENCE_CALIBRATION)
    network, _ = build_workload("vgg11", "cifar10")
    add = machine.kernel_seconds("add", gradient_sum_cost(network.param_count, 4))
    for index, kernel, share in ((0, "start_gradient_sum", 2 / 3), (1, "accumulate_gradients", 1.0)):
        # A copy moves two thirds of an add's bytes.
        cost = next(cost for _, cost in micro_batch_costs(network, 8, 2, index) if cost.kernel == kernel)
        assert machine.kernel_seconds(cost.kernel, cost) == pytest.approx(share * add)
    assert machine.calibration.unmodelled(["start_gradient_sum", "accumulate_gradients"]) == []
