"""Synthetic images with a learnable signal, generated on demand from their index.

Each class has a fixed random template (seeded by ``seed``, shared by the splits); sample i
of a split is its class template plus noise, drawn from a generator seeded by
(seed, split, i). Nothing is stored, any rank can make
any sample, and the same index always gives the same image, so it behaves like a data
set on disk of any size.
"""
from __future__ import annotations

import numpy as np

from pydtnn_lite.data.base import Dataset

SIGNAL = 0.5  # template amplitude against unit noise: learnable, but not in one step


class SyntheticDataset(Dataset):
    """``size`` samples of ``input_shape`` in ``num_classes`` classes."""

    def __init__(self, size: int, input_shape: tuple = (32, 32, 3), num_classes: int = 10,
                 seed: int = 0, split: int = 0, name: str = "synthetic") -> None:
        self.size, self.input_shape, self.num_classes = size, tuple(input_shape), num_classes
        self.seed, self.split, self.name = seed, split, name
        # Templates are smooth (blocks of 4x4 pixels) so that convolutions pick them up.
        rng = np.random.default_rng([seed, 0x7E4])
        h, w, c = self.input_shape
        # Stored coarse (1/16 of the pixels) and expanded per sample: 1000 ImageNet-sized
        # templates would otherwise take 600 MB.
        self.coarse_templates = rng.normal(size=(num_classes, -(-h // 4), -(-w // 4), c)).astype(np.float32) * SIGNAL

    def __len__(self) -> int:
        return self.size

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        images = np.empty((len(indices),) + self.input_shape, dtype=np.float32)
        labels = np.empty(len(indices), dtype=np.int64)
        for row, index in enumerate(indices):
            rng = np.random.default_rng([self.seed, self.split, int(index)])
            labels[row] = rng.integers(self.num_classes)
            images[row] = rng.standard_normal(self.input_shape, dtype=np.float32)
            images[row] += self.template(labels[row])
        return images, labels

    def template(self, label: int) -> np.ndarray:
        """The full-resolution template of class ``label``."""
        h, w, _ = self.input_shape
        coarse = self.coarse_templates[label]
        return np.repeat(np.repeat(coarse, 4, axis=0), 4, axis=1)[:h, :w, :]
