"""What a data set is to the trainer: random access to labelled images by index."""
from __future__ import annotations

import os
from collections.abc import Container

import numpy as np

from pydtnn_lite.errors import UserError


class DataError(UserError, ValueError):
    """Missing, unreadable or inconsistent data; the message says which file and what to do."""


def check_data_directory(data_dir: str | os.PathLike, split: str, splits: Container[str], what: str,
                         hint: str) -> str:
    """Validate ``split`` (one of ``splits``) and that ``data_dir`` is a directory; return its path."""
    if split not in splits:
        raise DataError(f"unknown split {split!r}: use 'train' or 'test'")
    directory = os.fspath(data_dir)
    if not os.path.isdir(directory):
        raise DataError(f"{what} directory {directory} does not exist: {hint}")
    return directory


class Dataset:
    """A labelled image set with random access, so each rank reads only the rows it trains on.

    ``load(indices)`` returns float32 images (n, H, W, C), normalised to roughly zero mean
    and unit variance, and int64 labels (n,). Subclasses set ``name``, ``input_shape`` and
    ``num_classes`` and implement ``__len__`` and ``load``.
    """

    name = "dataset"
    input_shape: tuple = ()
    num_classes = 0

    def __len__(self) -> int:
        raise NotImplementedError

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def check_indices(self, indices: np.ndarray) -> None:
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"{self.name}: index out of range 0..{len(self) - 1}")


def check_test_matches_train(train: Dataset, test: Dataset) -> None:
    """Refuse a test split whose images have another shape than the training split's, or whose
    labels reach beyond the training split's classes: found when the data sets are opened, not
    after an epoch of training."""
    if tuple(test.input_shape) != tuple(train.input_shape):
        raise DataError(f"{train.name}: the test split's images are {tuple(test.input_shape)} but the training "
                        f"split's are {tuple(train.input_shape)}: give both splits images of one size")
    labels = getattr(test, "labels", None)
    highest = int(np.max(labels)) if labels is not None and len(labels) else test.num_classes - 1
    if highest >= train.num_classes:
        raise DataError(f"{train.name}: the test split has label {highest} but the training split has "
                        f"{train.num_classes} classes (labels 0 to {train.num_classes - 1}): give both splits the "
                        "same classes (e.g. a 'classes' entry in every shard)")
