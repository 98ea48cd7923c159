"""CIFAR-10, binary version: fixed-size records read in place through memory maps.

Each batch file is a run of 3,073-byte records: one label byte, then 1,024 red,
1,024 green and 1,024 blue bytes, each plane a row-major 32x32 image. Because records
have a fixed size, sample i is a slice at a known offset, so a rank reads only its rows.
"""
from __future__ import annotations

import os

import numpy as np

from pydtnn_lite.data.base import DataError, Dataset, check_data_directory

SIDE, CHANNELS, CLASSES = 32, 3, 10
RECORD = 1 + SIDE * SIDE * CHANNELS
FILES = {
    "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
    "test": ["test_batch.bin"],
}
# Standard per-channel statistics of the training set, on the 0..1 scale.
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)
ARCHIVE_HINT = ('download the "CIFAR-10 binary version" archive (cifar-10-binary.tar.gz) '
                "and extract it there")


class Cifar10Dataset(Dataset):
    """One split of CIFAR-10 from the binary batch files in ``data_dir`` (or its
    ``cifar-10-batches-bin`` subdirectory, as the archive extracts).

    Label bytes are checked as rows are loaded: checking them all up front would page
    in every file, which is what reading in place avoids.
    """

    name = "cifar10"
    input_shape = (SIDE, SIDE, CHANNELS)
    num_classes = CLASSES

    def __init__(self, data_dir: str | os.PathLike, split: str = "train") -> None:
        directory = check_data_directory(data_dir, split, FILES, "CIFAR-10", ARCHIVE_HINT)
        # The archive extracts into cifar-10-batches-bin/; accept its parent as well.
        nested = os.path.join(directory, "cifar-10-batches-bin")
        if not os.path.exists(os.path.join(directory, FILES[split][0])) and os.path.isdir(nested):
            directory = nested
        self.paths = [os.path.join(directory, file) for file in FILES[split]]
        self.maps = [self._open(path, split) for path in self.paths]
        # offsets[k] is the global index of the first record in file k.
        self.offsets = np.cumsum([0] + [len(records) for records in self.maps])

    @staticmethod
    def _open(path: str, split: str) -> np.memmap:
        if not os.path.isfile(path):
            raise DataError(f"missing CIFAR-10 file {path}: the {split} split needs "
                            f"{', '.join(FILES[split])}; {ARCHIVE_HINT}")
        size = os.path.getsize(path)
        if size == 0 or size % RECORD:
            raise DataError(f"{path} holds {size} bytes, not a whole number of {RECORD}-byte "
                            f"CIFAR-10 records: the file is truncated or not from the binary "
                            f"version; {ARCHIVE_HINT}")
        return np.memmap(path, dtype=np.uint8, mode="r", shape=(size // RECORD, RECORD))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        images = np.empty((len(indices),) + self.input_shape, dtype=np.float32)
        labels = np.empty(len(indices), dtype=np.int64)
        files = np.searchsorted(self.offsets, indices, side="right") - 1
        for k in np.unique(files):
            rows = np.flatnonzero(files == k)
            local = indices[rows] - self.offsets[k]
            records = self.maps[k][local]  # fancy indexing copies just these records
            bad = np.flatnonzero(records[:, 0] >= CLASSES)
            if len(bad):
                raise DataError(f"{self.paths[k]}: record {local[bad[0]]} has label "
                                f"{records[bad[0], 0]}, CIFAR-10 labels are 0..9: the file is "
                                f"corrupt or not CIFAR-10 (CIFAR-100 records have 2 label bytes); "
                                f"{ARCHIVE_HINT}")
            labels[rows] = records[:, 0]
            # Planes (C, H, W) in the file; the trainer wants channels last.
            pixels = records[:, 1:].reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1)
            images[rows] = (pixels / np.float32(255) - MEAN) / STD
        return images, labels
