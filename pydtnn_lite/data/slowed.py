"""A data set that loads slowly: emulates a slower rank in tests and benchmarks of load balancing."""
from __future__ import annotations

import time

import numpy as np

from pydtnn_lite.data.base import Dataset


class SlowedDataset(Dataset):
    """``data`` with ``seconds_per_sample`` of extra work for every sample it loads."""

    def __init__(self, data: Dataset, seconds_per_sample: float) -> None:
        self.data, self.seconds_per_sample = data, seconds_per_sample
        self.name, self.input_shape, self.num_classes = data.name, data.input_shape, data.num_classes

    def __len__(self) -> int:
        return len(self.data)

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(self.seconds_per_sample * len(indices))
        return self.data.load(indices)
