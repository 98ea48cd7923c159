"""scikit-learn's bundled handwritten digits (8x8, 10 classes): real data that needs no download."""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from pydtnn_lite.data.base import DataError, Dataset

TEST_FRACTION = 0.2
SPLIT_SEED = 0
MISSING = ("the digits data set needs scikit-learn: pip install scikit-learn "
           "(or the package's 'test' extra)")


def bundled_digits_file() -> str | None:
    """The path of the file scikit-learn's ``load_digits`` reads, found without importing
    scikit-learn; None where scikit-learn is missing or keeps it elsewhere."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    paths = [os.path.join(folder, "datasets", "data", "digits.csv.gz") for folder in folders]
    return next((path for path in paths if os.path.isfile(path)), None)


def read_bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images (8, 8) and labels of scikit-learn's ``load_digits``.

    Read from its file where it can be found: importing scikit-learn (SciPy with it)
    takes about a second, a third of a small job's start on every rank.
    """
    path = bundled_digits_file()
    if path is not None:
        rows = np.loadtxt(path, delimiter=",")  # 64 pixels (0-16) and the label per row
        return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(MISSING) from None
    digits = load_digits()
    return digits.images, digits.target.astype(np.int64)


class DigitsDataset(Dataset):
    """The 1,797 digits, split 80/20 into train and test by a fixed shuffle; pixels standardised."""

    name = "digits"
    input_shape = (8, 8, 1)
    num_classes = 10

    def __init__(self, split: str = "train") -> None:
        pixels, labels = read_bundled_digits()
        order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
        cut = int(len(order) * (1 - TEST_FRACTION))
        chosen = order[:cut] if split == "train" else order[cut:]
        images = pixels.astype(np.float32)[..., None]
        # Statistics of the training split normalise both splits.
        train = images[order[:cut]]
        self.images = (images[chosen] - train.mean()) / train.std()
        self.labels = labels[chosen]

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        return self.images[indices], self.labels[indices]
