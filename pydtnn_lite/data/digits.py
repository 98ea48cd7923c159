"""scikit-learn's bundled handwritten digits (8x8, 10 classes): real data that needs no download."""
from __future__ import annotations

import numpy as np

from pydtnn_lite.data.base import DataError, Dataset

TEST_FRACTION = 0.2
SPLIT_SEED = 0


class DigitsDataset(Dataset):
    """The 1,797 digits, split 80/20 into train and test by a fixed shuffle; pixels standardised."""

    name = "digits"
    input_shape = (8, 8, 1)
    num_classes = 10

    def __init__(self, split: str = "train") -> None:
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise DataError("the digits data set needs scikit-learn: pip install scikit-learn "
                            "(or the package's 'test' extra)") from None
        digits = load_digits()
        order = np.random.default_rng(SPLIT_SEED).permutation(len(digits.target))
        cut = int(len(order) * (1 - TEST_FRACTION))
        chosen = order[:cut] if split == "train" else order[cut:]
        images = digits.images.astype(np.float32)[..., None]
        # Statistics of the training split normalise both splits.
        train = images[order[:cut]]
        self.images = (images[chosen] - train.mean()) / train.std()
        self.labels = digits.target[chosen].astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        return self.images[indices], self.labels[indices]
