"""The embedded synthetic data set: every sample a function of its index, class template plus unit noise."""
from __future__ import annotations

import numpy as np

from pydtnn_lite.data import SyntheticDataset


def test_a_sample_depends_only_on_its_index():
    data = SyntheticDataset(1000, (12, 10, 3), 7, seed=3)
    batch_images, batch_labels = data.load(np.array([5, 999, 0, 5]))
    alone_images, alone_labels = SyntheticDataset(1000, (12, 10, 3), 7, seed=3).load(np.array([999]))
    assert np.array_equal(batch_images[1], alone_images[0]) and batch_labels[1] == alone_labels[0]
    assert np.array_equal(batch_images[0], batch_images[3])
    assert not np.array_equal(batch_images[0], batch_images[2])


def test_splits_and_seeds_draw_other_samples_from_shared_templates():
    train, test = (SyntheticDataset(100, (8, 8, 2), 4, seed=1, split=split) for split in (0, 1))
    other_seed = SyntheticDataset(100, (8, 8, 2), 4, seed=2)
    indices = np.arange(20)
    assert not np.array_equal(train.load(indices)[0], test.load(indices)[0])
    assert not np.array_equal(train.load(indices)[0], other_seed.load(indices)[0])
    assert np.array_equal(train.template(3), test.template(3))


def test_samples_are_their_class_template_plus_zero_mean_unit_noise():
    data = SyntheticDataset(10_000, (9, 11, 3), 10, seed=0)
    images, labels = data.load(np.arange(2000))
    noise = images - np.stack([data.template(label) for label in labels])
    assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1) < 0.01
    # Neighbouring pixels and channels are independent draws.
    assert abs(np.corrcoef(noise[..., :-1, :].ravel(), noise[..., 1:, :].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(noise[..., 0].ravel(), noise[..., 1].ravel())[0, 1]) < 0.02
    counts = np.bincount(labels, minlength=10)
    assert counts.min() > 150 and counts.max() < 250  # classes drawn evenly
