"""File-based data sets: tiny CIFAR-10, MNIST and .npz shard files written here, read back; the bundled digits."""
from __future__ import annotations

import gzip
import os
import shutil
import sys
import zipfile

import numpy as np
import pytest

from pydtnn_lite.data import (
    Cifar10Dataset,
    DataError,
    MnistDataset,
    NpzShardDataset,
    cifar,
    digits,
    mnist,
    npz_shards,
    open_dataset,
)


def pixels_of(images: np.ndarray, mean, std) -> np.ndarray:
    """Undo the normalisation: back to the uint8 values in the file."""
    return np.rint((images * np.asarray(std, np.float32) + np.asarray(mean, np.float32)) * 255).astype(int)


# ------------------------------------------------------------------------ CIFAR-10
TRAIN_COUNTS = [2, 1, 1, 2, 1]  # 7 records over the five batch files


def write_cifar(directory, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random train (7) and test (3) records in the binary layout; returns both, in order."""
    rng = np.random.default_rng(seed)
    splits = []
    for files, counts in ((cifar.FILES["train"], TRAIN_COUNTS), (cifar.FILES["test"], [3])):
        records = rng.integers(0, 256, size=(sum(counts), cifar.RECORD), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, size=len(records))
        for file, chunk in zip(files, np.split(records, np.cumsum(counts)[:-1]), strict=True):
            chunk.tofile(os.path.join(directory, file))
        splits.append(records)
    return splits[0], splits[1]


def test_cifar_reads_records_channels_last(tmp_path):
    train, test = write_cifar(tmp_path)
    data = Cifar10Dataset(tmp_path, "train")
    assert (len(data), data.input_shape, data.num_classes) == (7, (32, 32, 3), 10)
    images, labels = data.load(np.arange(7))
    assert images.dtype == np.float32 and labels.dtype == np.int64 and images.shape == (7, 32, 32, 3)
    np.testing.assert_array_equal(labels, train[:, 0])
    values = pixels_of(images, cifar.MEAN, cifar.STD)
    # Pixel (row r, col c, channel ch) is byte 1 + ch*1024 + r*32 + c of its record.
    for i, r, c, ch in [(0, 0, 1, 0), (2, 5, 31, 2), (6, 31, 0, 1), (4, 17, 3, 2)]:
        assert values[i, r, c, ch] == train[i, 1 + ch * 1024 + r * 32 + c]
    expected = np.stack([train[:, 1 + ch * 1024: 1 + (ch + 1) * 1024].reshape(7, 32, 32)
                         for ch in range(3)], axis=-1)
    np.testing.assert_array_equal(values, expected)
    assert abs(float(images.mean())) < 1.5  # roughly standardised, not raw bytes

    test_images, test_labels = Cifar10Dataset(tmp_path, "test").load(np.arange(3))
    np.testing.assert_array_equal(test_labels, test[:, 0])
    np.testing.assert_array_equal(pixels_of(test_images, cifar.MEAN, cifar.STD)[1, 2, 3],
                                  test[1, [1 + 2 * 32 + 3 + ch * 1024 for ch in range(3)]])


def test_cifar_subset_matches_full_load_and_maps_files(tmp_path):
    write_cifar(tmp_path)
    data = open_dataset("cifar10", "train", str(tmp_path))
    assert all(isinstance(records, np.memmap) for records in data.maps)
    full_images, full_labels = data.load(np.arange(7))
    subset = np.array([6, 0, 3, 3, 2])  # unsorted, repeated, spanning files
    images, labels = data.load(subset)
    np.testing.assert_array_equal(images, full_images[subset])
    np.testing.assert_array_equal(labels, full_labels[subset])
    assert data.load(np.array([], dtype=np.int64))[0].shape == (0, 32, 32, 3)
    with pytest.raises(IndexError):
        data.load(np.array([7]))


def test_cifar_accepts_the_archive_folder(tmp_path):
    nested = tmp_path / "cifar-10-batches-bin"
    nested.mkdir()
    write_cifar(nested)
    assert len(Cifar10Dataset(tmp_path, "train")) == 7


def test_cifar_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="pass --data-dir"):
        open_dataset("cifar10", "train")
    with pytest.raises(DataError, match="nowhere"):
        Cifar10Dataset(tmp_path / "nowhere", "train")

    write_cifar(tmp_path)
    os.remove(tmp_path / "data_batch_3.bin")
    with pytest.raises(DataError, match=r"data_batch_3\.bin.*data_batch_1\.bin.*CIFAR-10 binary version"):
        Cifar10Dataset(tmp_path, "train")

    write_cifar(tmp_path)
    with open(tmp_path / "data_batch_2.bin", "ab") as file:
        file.write(b"\0")
    with pytest.raises(DataError, match=r"data_batch_2\.bin holds 3074 bytes"):
        Cifar10Dataset(tmp_path, "train")

    train, _ = write_cifar(tmp_path)
    record = np.fromfile(tmp_path / "data_batch_4.bin", dtype=np.uint8).reshape(2, cifar.RECORD)
    record[1, 0] = 10
    record.tofile(tmp_path / "data_batch_4.bin")
    data = Cifar10Dataset(tmp_path, "train")
    data.load(np.arange(5))  # rows before the bad one load
    with pytest.raises(DataError, match=r"data_batch_4\.bin: record 1 has label 10"):
        data.load(np.array([0, 5]))


# ------------------------------------------------------------------------ MNIST
def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return (magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
            + array.astype(np.uint8).tobytes())


def write_mnist(directory, gzipped: bool, split: str = "train", count: int = 5,
                labels_count: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count if labels_count is None else labels_count, dtype=np.uint8)
    opener = gzip.open if gzipped else open
    suffix = ".gz" if gzipped else ""
    images_stem, labels_stem = mnist.FILES[split]
    with opener(os.path.join(directory, images_stem + suffix), "wb") as file:
        file.write(idx_bytes(images, mnist.IMAGES_MAGIC))
    with opener(os.path.join(directory, labels_stem + suffix), "wb") as file:
        file.write(idx_bytes(labels, mnist.LABELS_MAGIC))
    return images, labels


@pytest.mark.parametrize("gzipped", [False, True])
def test_mnist_reads_idx_files(tmp_path, gzipped):
    images_written, labels_written = write_mnist(tmp_path, gzipped)
    data = open_dataset("mnist", "train", str(tmp_path))
    assert (len(data), data.input_shape, data.num_classes) == (5, (28, 28, 1), 10)
    assert isinstance(data.images, np.memmap) and isinstance(data.labels, np.memmap)
    images, labels = data.load(np.arange(5))
    assert images.dtype == np.float32 and labels.dtype == np.int64 and images.shape == (5, 28, 28, 1)
    np.testing.assert_array_equal(labels, labels_written)
    np.testing.assert_array_equal(pixels_of(images, mnist.MEAN, mnist.STD)[..., 0], images_written)
    subset = np.array([4, 1, 1])
    sub_images, sub_labels = data.load(subset)
    np.testing.assert_array_equal(sub_images, images[subset])
    np.testing.assert_array_equal(sub_labels, labels[subset])


def test_mnist_gz_is_decompressed_once_beside_it(tmp_path):
    write_mnist(tmp_path, gzipped=True)
    MnistDataset(tmp_path, "train")
    cache = tmp_path / "train-images-idx3-ubyte"
    assert cache.is_file() and not any(p.name.startswith(".partial") for p in tmp_path.iterdir())
    stamp = cache.stat().st_mtime_ns
    data = MnistDataset(tmp_path, "train")
    assert cache.stat().st_mtime_ns == stamp and data.images.filename == str(cache.resolve())


def test_mnist_gz_in_read_only_directory_goes_to_temp(tmp_path, monkeypatch):
    source, scratch = tmp_path / "ro", tmp_path / "scratch"
    source.mkdir(), scratch.mkdir()
    written, _ = write_mnist(source, gzipped=True)
    # Tests may run as root, where chmod does not stop writes: pretend instead.
    monkeypatch.setattr(mnist.os, "access", lambda path, mode: False)
    monkeypatch.setattr(mnist.tempfile, "tempdir", str(scratch))
    data = MnistDataset(source, "train")
    assert sorted(p.name for p in source.iterdir()) == ["train-images-idx3-ubyte.gz",
                                                        "train-labels-idx1-ubyte.gz"]
    assert len(list(scratch.iterdir())) == 2 and os.path.dirname(data.images.filename) == str(scratch)
    np.testing.assert_array_equal(pixels_of(data.load(np.arange(5))[0], mnist.MEAN, mnist.STD)[..., 0],
                                  written)


def test_mnist_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte \(or .*train-images-idx3-ubyte\.gz\)"):
        MnistDataset(tmp_path, "train")

    write_mnist(tmp_path, gzipped=False)
    shutil.copy(tmp_path / "train-labels-idx1-ubyte", tmp_path / "train-images-idx3-ubyte")
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte is not an IDX image file"):
        MnistDataset(tmp_path, "train")

    write_mnist(tmp_path, gzipped=False)
    with open(tmp_path / "train-images-idx3-ubyte", "r+b") as file:
        file.truncate(16 + 5 * 784 - 1)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte holds 3935 bytes"):
        MnistDataset(tmp_path, "train")

    write_mnist(tmp_path, gzipped=False, labels_count=4)
    with pytest.raises(DataError, match=r"holds 5 images but .*train-labels-idx1-ubyte holds 4 labels"):
        MnistDataset(tmp_path, "train")

    write_mnist(tmp_path, gzipped=False, split="test")
    with open(tmp_path / "t10k-labels-idx1-ubyte", "r+b") as file:
        file.seek(8)
        file.write(b"\x0a")
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte has label 10"):
        MnistDataset(tmp_path, "test")


def test_mnist_bad_gz_leaves_no_cache(tmp_path):
    write_mnist(tmp_path, gzipped=True)
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-20])  # cut inside the stream
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz"):
        MnistDataset(tmp_path, "train")
    # A complete stream whose header disagrees with its length.
    with gzip.open(gz, "wb") as file:
        file.write(idx_bytes(np.zeros((6, 28, 28), np.uint8), mnist.IMAGES_MAGIC)[:-1])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz holds"):
        MnistDataset(tmp_path, "train")
    assert not (tmp_path / "train-images-idx3-ubyte").exists()
    assert not any(p.name.startswith(".partial") for p in tmp_path.iterdir())


# ------------------------------------------------------------------------ .npz shards
def write_shards(directory, seed: int = 0, **extra) -> tuple[np.ndarray, np.ndarray]:
    """train-00000.npz (3 samples, stored) and train-00001.npz (4, compressed)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(7, 5, 6, 3), dtype=np.uint8)
    y = np.array([0, 3, 1, 2, 3, 0, 1])
    np.savez(os.path.join(directory, "train-00000.npz"), x=x[:3], y=y[:3], **extra)
    np.savez_compressed(os.path.join(directory, "train-00001.npz"), x=x[3:], y=y[3:], **extra)
    return x, y


def test_npz_reads_shards(tmp_path):
    x, y = write_shards(tmp_path)
    np.savez(tmp_path / "test-00000.npz", x=x[:2], y=y[:2])
    data = open_dataset("npz", "train", str(tmp_path))
    assert (len(data), data.input_shape, data.num_classes) == (7, (5, 6, 3), 4)
    assert isinstance(data._images(0), np.memmap)  # the stored shard is read in place
    images, labels = data.load(np.arange(7))
    assert images.dtype == np.float32 and labels.dtype == np.int64
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_array_equal(pixels_of(images, npz_shards.MEAN, npz_shards.STD), x)
    subset = np.array([5, 2, 3, 0, 5])  # both shards, unsorted, repeated
    sub_images, sub_labels = data.load(subset)
    np.testing.assert_array_equal(sub_images, images[subset])
    np.testing.assert_array_equal(sub_labels, y[subset])
    assert len(NpzShardDataset(tmp_path, "test")) == 2


def test_npz_classes_and_cache(tmp_path, monkeypatch):
    write_shards(tmp_path, classes=np.array(10))
    data = NpzShardDataset(tmp_path, "train")
    assert data.num_classes == 10
    monkeypatch.setattr(npz_shards, "CACHED_SHARDS", 1)
    data.load(np.array([0, 4]))
    assert list(data._cache) == [1]


def test_npz_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match=r"no shards .*train-\*\.npz"):
        NpzShardDataset(tmp_path, "train")

    x, y = write_shards(tmp_path)
    np.savez(tmp_path / "train-00002.npz", x=x[:2])
    with pytest.raises(DataError, match=r"train-00002\.npz has no array y"):
        NpzShardDataset(tmp_path, "train")

    np.savez(tmp_path / "train-00002.npz", x=x[:2], y=y[:3])
    with pytest.raises(DataError, match=r"train-00002\.npz holds 2 images but 3 labels"):
        NpzShardDataset(tmp_path, "train")

    np.savez(tmp_path / "train-00002.npz", x=x[:2, :4], y=y[:2])
    with pytest.raises(DataError, match=r"train-00002\.npz holds images of shape \(4, 6, 3\)"):
        NpzShardDataset(tmp_path, "train")

    (tmp_path / "train-00002.npz").write_bytes(b"not a zip at all")
    with pytest.raises(DataError, match=r"train-00002\.npz is not a readable \.npz"):
        NpzShardDataset(tmp_path, "train")

    with zipfile.ZipFile(tmp_path / "train-00002.npz", "w") as archive:
        archive.writestr("x.npy", b"garbage")
        archive.writestr("y.npy", b"garbage")
    with pytest.raises(DataError, match=r"train-00002\.npz is not a readable \.npz"):
        NpzShardDataset(tmp_path, "train")

    np.savez(tmp_path / "train-00002.npz", x=x[:2], y=y[:2], classes=np.array(3))
    with pytest.raises(DataError, match=r"train-00000\.npz has label 3 but classes is 3"):
        NpzShardDataset(tmp_path, "train")


# ------------------------------------------------------------------------ digits
def test_digits_are_scikit_learn_s_split_and_standardised_by_the_training_pixels():
    from sklearn.datasets import load_digits

    bundled = load_digits()
    order = np.random.default_rng(0).permutation(len(bundled.target))
    train, test = open_dataset("digits", "train"), open_dataset("digits", "test")
    assert (len(train), len(test)) == (1437, 360)
    pixels = bundled.images.astype(np.float32)[..., None]
    mean, std = pixels[order[:1437]].mean(), pixels[order[:1437]].std()
    for split, rows in ((train, order[:1437]), (test, order[1437:])):
        images, labels = split.load(np.arange(len(split)))
        np.testing.assert_array_equal(labels, bundled.target[rows])
        np.testing.assert_allclose(images, (pixels[rows] - mean) / std, rtol=1e-6)


def test_digits_come_from_scikit_learn_where_its_file_is_not_found(monkeypatch):
    from_file = open_dataset("digits").load(np.arange(50))
    monkeypatch.setattr(digits, "bundled_digits_file", lambda: None)
    from_import = open_dataset("digits").load(np.arange(50))
    for read, imported in zip(from_file, from_import, strict=True):
        np.testing.assert_array_equal(read, imported)


def test_digits_without_scikit_learn_ask_for_it(monkeypatch):
    monkeypatch.setattr(digits, "bundled_digits_file", lambda: None)
    for name in ("sklearn", "sklearn.datasets"):
        monkeypatch.setitem(sys.modules, name, None)  # the import fails, imported before or not
    with pytest.raises(DataError, match=r"pip install scikit-learn"):
        open_dataset("digits")
