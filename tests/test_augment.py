"""Random crop and flip: the images they make, per-sample choices that ignore the batch split, the CLI."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn_lite.data import Augmentation, DataError, Dataset, open_dataset

from helpers import digits_trainer
from mpi import assert_one_line_error, assert_same_weights, train_cli, train_small

RNG = np.random.default_rng(0)
IMAGES = RNG.standard_normal((64, 6, 5, 3)).astype(np.float32)  # not square, so swapped axes show
INDICES = RNG.permutation(10_000)[:64]
BOTH = Augmentation(crop_padding=2, flip=True)


def naive_crop(image: np.ndarray, pad: int, row: int, column: int, flip: bool) -> np.ndarray:
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
    window = padded[row:row + image.shape[0], column:column + image.shape[1]]
    return window[:, ::-1] if flip else window


@pytest.mark.parametrize("augmentation", [BOTH, Augmentation(crop_padding=3)])
def test_each_sample_equals_a_naive_crop_and_flip(augmentation):
    out = augmentation.apply(IMAGES, INDICES, seed=3, epoch=1)
    assert out.shape == IMAGES.shape and out.dtype == np.float32
    rows, columns, flips = augmentation.choices(INDICES, seed=3, epoch=1)
    assert flips.any() == augmentation.flip
    for i in range(len(IMAGES)):
        expected = naive_crop(IMAGES[i], augmentation.crop_padding, rows[i], columns[i], flips[i])
        np.testing.assert_array_equal(out[i], expected, err_msg=f"sample {i}")


def test_flip_alone_mirrors_the_columns_of_about_half_the_samples():
    flip = Augmentation(flip=True)
    out = flip.apply(IMAGES, INDICES, seed=0, epoch=0)
    flips = flip.choices(INDICES, seed=0, epoch=0)[2]
    assert 16 < flips.sum() < 48
    np.testing.assert_array_equal(out[flips], IMAGES[flips][:, :, ::-1])
    np.testing.assert_array_equal(out[~flips], IMAGES[~flips])


def test_choices_follow_the_sample_not_its_row_or_the_split_of_the_batch():
    whole = BOTH.apply(IMAGES, INDICES, seed=3, epoch=1)
    halves = [BOTH.apply(IMAGES[rows], INDICES[rows], seed=3, epoch=1) for rows in (slice(0, 21), slice(21, None))]
    np.testing.assert_array_equal(np.concatenate(halves), whole)
    reversed_rows = BOTH.apply(IMAGES[::-1], INDICES[::-1], seed=3, epoch=1)
    np.testing.assert_array_equal(reversed_rows, whole[::-1])


@pytest.mark.parametrize("seed,epoch", [(3, 2), (4, 1)])
def test_choices_change_with_the_epoch_and_the_seed(seed, epoch):
    first = BOTH.choices(INDICES, seed=3, epoch=1)
    other = BOTH.choices(INDICES, seed=seed, epoch=epoch)
    for mine, theirs in zip(first, other, strict=True):
        assert (mine != theirs).mean() > 0.3  # 0.8 for the offsets, 0.5 for the flips when independent


def test_nothing_asked_returns_the_images_unchanged():
    assert Augmentation().apply(IMAGES, INDICES, seed=3, epoch=1) is IMAGES
    assert Augmentation().describe() == "none"


def test_every_offset_and_both_flip_states_occur_evenly():
    pad, n = 4, 18_000
    rows, columns, flips = Augmentation(pad, flip=True).choices(np.arange(n), seed=0, epoch=5)
    for offsets in (rows, columns):
        counts = np.bincount(offsets)
        assert len(counts) == 2 * pad + 1
        np.testing.assert_allclose(counts, n / (2 * pad + 1), rtol=0.1)  # about 5 standard deviations
    assert abs(flips.mean() - 0.5) < 0.02
    assert abs(np.corrcoef(rows, columns)[0, 1]) < 0.04


class Shaped(Dataset):
    name = "shaped"

    def __init__(self, input_shape: tuple) -> None:
        self.input_shape = input_shape


@pytest.mark.parametrize("augmentation,shape,message", [
    (BOTH, (64,), "drop --random-crop and --random-flip"),
    (Augmentation(flip=True), (8, 8), "drop --random-crop and --random-flip"),
    (Augmentation(crop_padding=6), (6, 5, 3), "use at most 5"),
])
def test_data_that_cannot_take_the_augmentation_is_refused(augmentation, shape, message):
    with pytest.raises(DataError, match=message):
        augmentation.check(Shaped(shape))
    Augmentation().check(Shaped(shape))  # without augmentation any shape is fine


def test_the_trainer_augments_training_batches_only():
    plain, augmented = digits_trainer("lenet", 0.02), digits_trainer("lenet", 0.02, augmentation=BOTH)
    batch, augmented_batch = plain.load_step(epoch=1, step=3), augmented.load_step(epoch=1, step=3)
    expected = BOTH.apply(batch.images, plain.sampler.batch(1, 3), seed=0, epoch=1)
    np.testing.assert_array_equal(augmented_batch.images, expected)
    np.testing.assert_array_equal(augmented_batch.labels, batch.labels)
    test = open_dataset("digits", "test")
    first, second = (trainer.evaluate(test, 64, max_steps=2) for trainer in (plain, augmented))
    assert (first.loss, first.accuracy) == (second.loss, second.accuracy)


def test_two_ranks_train_what_one_rank_trains(tmp_path):
    flags = ("--random-crop", "4", "--random-flip")
    single = train_small(tmp_path, 1, *flags)
    assert_same_weights(single, train_small(tmp_path, 2, *flags))
    # Guard: the augmentation must change the training, or the comparison proves nothing.
    plain = train_small(tmp_path, 1)
    assert any(not np.allclose(plain[name], single[name]) for name in single)


@pytest.mark.parametrize("flags,message", [
    (("--random-crop", "-1"), "argument --random-crop: must be an integer from 0 to 1024, got '-1'"),
    (("--random-crop", "9", "--random-flip"), "use at most 8"),
])
def test_bad_padding_gives_one_line_error(tmp_path, flags, message):
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--run-dir", str(tmp_path), *flags)
    assert_one_line_error(result, message)
