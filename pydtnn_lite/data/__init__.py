"""Data sets by name, each opened for one split ('train' or 'test')."""
from __future__ import annotations

from collections.abc import Callable

from pydtnn_lite.data.augment import Augmentation
from pydtnn_lite.data.base import DataError, Dataset
from pydtnn_lite.data.cifar import Cifar10Dataset
from pydtnn_lite.data.digits import DigitsDataset
from pydtnn_lite.data.mnist import MnistDataset
from pydtnn_lite.data.npz_shards import NpzShardDataset
from pydtnn_lite.data.sampler import EpochSampler, local_rows, partition
from pydtnn_lite.data.slowed import SlowedDataset
from pydtnn_lite.data.synthetic import SyntheticDataset

SYNTHETIC_SIZES = {"train": 50_000, "test": 10_000}


def _synthetic(split: str, data_dir: str | None, seed: int) -> Dataset:
    return SyntheticDataset(SYNTHETIC_SIZES[split], (32, 32, 3), 10, seed=seed, split=int(split == "test"),
                            name="synthetic")


def _synthetic_imagenet(split: str, data_dir: str | None, seed: int) -> Dataset:
    return SyntheticDataset(SYNTHETIC_SIZES[split], (224, 224, 3), 1000, seed=seed, split=int(split == "test"),
                            name="synthetic-imagenet")


def _digits(split: str, data_dir: str | None, seed: int) -> Dataset:
    return DigitsDataset(split)


def _cifar10(split: str, data_dir: str | None, seed: int) -> Dataset:
    return Cifar10Dataset(data_dir, split)


def _mnist(split: str, data_dir: str | None, seed: int) -> Dataset:
    return MnistDataset(data_dir, split)


def _npz(split: str, data_dir: str | None, seed: int) -> Dataset:
    return NpzShardDataset(data_dir, split)


DATASETS: dict[str, Callable[[str, str | None, int], Dataset]] = {
    "synthetic": _synthetic,
    "synthetic-imagenet": _synthetic_imagenet,
    "digits": _digits,
    "cifar10": _cifar10,
    "mnist": _mnist,
    "npz": _npz,
}
NEEDS_DATA_DIR: set[str] = {"cifar10", "mnist", "npz"}


def dataset_names() -> list[str]:
    return list(DATASETS)


def open_dataset(name: str, split: str = "train", data_dir: str | None = None, seed: int = 0) -> Dataset:
    """Open data set ``name`` for ``split``; file-based sets read from ``data_dir``."""
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}: choose one of {', '.join(DATASETS)}")
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r}: use 'train' or 'test'")
    if name in NEEDS_DATA_DIR and not data_dir:
        raise DataError(f"the {name} data set is read from files: pass --data-dir DIR")
    return DATASETS[name](split, data_dir, seed)


__all__ = ["Augmentation", "DataError", "Dataset", "EpochSampler", "partition", "local_rows", "open_dataset",
           "dataset_names", "SlowedDataset", "SyntheticDataset", "DigitsDataset", "Cifar10Dataset", "MnistDataset",
           "NpzShardDataset"]
