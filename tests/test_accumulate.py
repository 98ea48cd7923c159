"""Gradient accumulation: K micro-batches per update train the same weights as one batch K times larger."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import Augmentation, open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.training import TrainerSettings, build_trainer

from mpi import train_cli


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
