"""Data sets by name, each opened for one split ('train' or 'test')."""
from __future__ import annotations

from collections.abc import Callable

from pydtnn_lite.data.augment import Augmentation
from pydtnn_lite.data.base import DataError, Dataset, check_test_matches_train
from pydtnn_lite.data.cifar import Cifar10Dataset
from pydtnn_lite.data.digits import DigitsDataset
from pydtnn_lite.data.mnist import MnistDataset
from pydtnn_lite.data.npz_shards import NpzShardDataset
from pydtnn_lite.data.sampler import EpochSampler, local_rows, partition
from pydtnn_lite.data.slowed import SlowedDataset
from pydtnn_lite.data.synthetic import SyntheticDataset

SYNTHETIC_SIZES = {"train": 50_000, "test": 10_000}
GENERATED_SHAPES = {  # name: (input shape, classes) of the sets made or bundled here
    "synthetic": ((32, 32, 3), 10),
    "synthetic-imagenet": ((224, 224, 3), 1000),
    "digits": (DigitsDataset.input_shape, DigitsDataset.num_classes),
}


def _synthetic_set(name: str) -> Callable[[str, int], Dataset]:
    shape, classes = GENERATED_SHAPES[name]
    return lambda split, seed: SyntheticDataset(SYNTHETIC_SIZES[split], shape, classes, seed=seed,
                                                split=int(split == "test"), name=name)


def _digits(split: str, seed: int) -> Dataset:
    return DigitsDataset(split)


GENERATED: dict[str, Callable[[str, int], Dataset]] = {  # (split, seed): made or bundled, no files needed
    "synthetic": _synthetic_set("synthetic"),
    "synthetic-imagenet": _synthetic_set("synthetic-imagenet"),
    "digits": _digits,
}
FROM_FILES: dict[str, Callable[[str, str], Dataset]] = {  # (data_dir, split): read from --data-dir
    "cifar10": Cifar10Dataset,
    "mnist": MnistDataset,
    "npz": NpzShardDataset,
}


def dataset_names() -> list[str]:
    """Every data set name: the generated ones, then those read from files."""
    return [*GENERATED, *FROM_FILES]


def open_dataset(name: str, split: str = "train", data_dir: str | None = None, seed: int = 0) -> Dataset:
    """Open data set ``name`` for ``split``; file-based sets read from ``data_dir``."""
    if name not in GENERATED and name not in FROM_FILES:
        raise DataError(f"unknown data set {name!r}: choose one of {', '.join(dataset_names())}")
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r}: use 'train' or 'test'")
    if name in GENERATED:
        return GENERATED[name](split, seed)
    if not data_dir:
        raise DataError(f"the {name} data set is read from files: pass --data-dir DIR")
    return FROM_FILES[name](data_dir, split)


__all__ = ["Augmentation", "DataError", "Dataset", "check_test_matches_train",
           "EpochSampler", "partition", "local_rows", "open_dataset", "GENERATED_SHAPES",
           "dataset_names", "SlowedDataset", "SyntheticDataset", "DigitsDataset", "Cifar10Dataset", "MnistDataset",
           "NpzShardDataset"]
