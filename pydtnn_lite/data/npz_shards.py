"""Image sets too big for one file (ImageNet-style), as numbered .npz shards.

A split is the files ``<split>-*.npz`` in name order, each holding ``x``, uint8 images
(n, H, W, C), ``y``, integer labels (n,), and optionally ``classes``, a scalar class
count. Opening reads only each shard's array headers and its labels; images are read
when asked for. In an uncompressed shard (``numpy.savez``) the image array is stored
as-is inside the zip, so it is memory-mapped in place; a compressed one
(``numpy.savez_compressed``) must be inflated whole, so the last few are kept, but
shuffled batches touch many shards: prefer ``numpy.savez`` for large sets.
"""
from __future__ import annotations

import glob
import os
import struct
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO

import numpy as np
from numpy.lib import format as npy

from pydtnn_lite.data.base import DataError, Dataset

CACHED_SHARDS = 2  # enough for a batch that straddles two shards
# ImageNet statistics, on the 0..1 scale.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# Any failure of a damaged zip or .npy member surfaces as one of these.
READ_ERRORS = (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error)
LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, fixed fields, name and extra lengths
HINT = "rewrite it with numpy.savez(path, x=uint8 images (n,H,W,3), y=labels (n,))"


@dataclass
class _Shard:
    """Where one shard's images are and what they look like."""

    path: str
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int | None  # byte offset of the raw images in the file; None when compressed


def _array_header(stream: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, order and dtype of the .npy array in ``stream``, leaving it at the first data byte."""
    version = npy.read_magic(stream)
    if version == (1, 0):
        return npy.read_array_header_1_0(stream)
    if version == (2, 0):
        return npy.read_array_header_2_0(stream)
    raise ValueError(f"unsupported .npy format version {version}")


def _stored_offset(path: str, info: zipfile.ZipInfo, header_size: int) -> int:
    """File offset of an uncompressed member's array data: past the zip local header
    (whose extra field may differ from the central directory's) and the .npy header."""
    with open(path, "rb") as file:
        file.seek(info.header_offset)
        signature, name_size, extra_size = LOCAL_HEADER.unpack(file.read(LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for {info.filename}")
    return info.header_offset + LOCAL_HEADER.size + name_size + extra_size + header_size


def _read_shard(path: str) -> tuple[_Shard, np.ndarray, int | None]:
    """The shard's image layout, its labels and its ``classes`` count (None if absent)."""
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        missing = [key for key in ("x", "y") if f"{key}.npy" not in names]
        if missing:
            raise DataError(f"shard {path} has no array {' or '.join(missing)}: {HINT}")
        with archive.open("x.npy") as stream:
            shape, fortran_order, dtype = _array_header(stream)
            header_size = stream.tell()
        # Three channels, as the ImageNet statistics below are per RGB channel.
        if dtype != np.uint8 or len(shape) != 4 or shape[3] != len(MEAN):
            raise DataError(f"shard {path}: x is {dtype} {shape}, expected uint8 (n, H, W, 3): {HINT}")
        info = archive.getinfo("x.npy")
        offset = (_stored_offset(path, info, header_size)
                  if info.compress_type == zipfile.ZIP_STORED else None)
        with archive.open("y.npy") as stream:
            labels = npy.read_array(stream, allow_pickle=False)
        classes: int | None = None
        if "classes.npy" in names:
            with archive.open("classes.npy") as stream:
                stored = npy.read_array(stream, allow_pickle=False)
            if stored.size != 1 or not np.issubdtype(stored.dtype, np.integer):
                raise DataError(f"shard {path}: classes must be one integer, got {stored!r}: {HINT}")
            classes = int(stored.reshape(()))
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"shard {path}: y is {labels.dtype} {labels.shape}, expected integers (n,): {HINT}")
    if len(labels) != shape[0]:
        raise DataError(f"shard {path} holds {shape[0]} images but {len(labels)} labels: {HINT}")
    if len(labels) and labels.min() < 0:
        raise DataError(f"shard {path} has negative label {labels.min()}: {HINT}")
    return _Shard(path, tuple(shape), fortran_order, offset), labels.astype(np.int64), classes


class NpzShardDataset(Dataset):
    """One split of a sharded image set in ``data_dir``; pixels scaled to 0..1 and
    standardised with the ImageNet statistics.

    The class count is ``classes`` where a shard stores it, else one more than the largest
    label, so store ``classes`` when a split may lack the last class.
    """

    name = "npz"

    def __init__(self, data_dir: str | os.PathLike, split: str = "train") -> None:
        directory = os.fspath(data_dir)
        if not os.path.isdir(directory):
            raise DataError(f"shard directory {directory} does not exist: pass the directory "
                            f"holding {split}-*.npz")
        paths = sorted(glob.glob(os.path.join(glob.escape(directory), f"{split}-*.npz")))
        if not paths:
            raise DataError(f"no shards {os.path.join(directory, f'{split}-*.npz')}: write the "
                            f"{split} split as {split}-00000.npz, {split}-00001.npz, ... there")
        self.shards: list[_Shard] = []
        labels, counts = [], set()
        for path in paths:
            try:
                shard, shard_labels, classes = _read_shard(path)
            except DataError:
                raise
            except READ_ERRORS as error:
                raise DataError(f"shard {path} is not a readable .npz file ({error}): {HINT}") from None
            if self.shards and shard.shape[1:] != self.shards[0].shape[1:]:
                raise DataError(f"shard {path} holds images of shape {shard.shape[1:]} but "
                                f"{self.shards[0].path} holds {self.shards[0].shape[1:]}: "
                                f"all shards of a split must agree")
            if classes is not None:
                counts.add(classes)
            self.shards.append(shard)
            labels.append(shard_labels)
        # Labels are one integer a sample, small beside the images: keep them all.
        self.labels = np.concatenate(labels)
        if not len(self.labels):
            raise DataError(f"the shards {directory}/{split}-*.npz hold no samples: {HINT}")
        if len(counts) > 1:
            raise DataError(f"the shards {directory}/{split}-*.npz disagree on classes "
                            f"({sorted(counts)}): store one count in all of them")
        # offsets[k] is the global index of the first sample in shard k.
        self.offsets = np.cumsum([0] + [shard.shape[0] for shard in self.shards])
        self.num_classes = counts.pop() if counts else int(self.labels.max()) + 1
        if self.labels.max() >= self.num_classes:
            worst = int(self.labels.argmax())
            where = self.shards[int(np.searchsorted(self.offsets, worst, side="right")) - 1].path
            raise DataError(f"shard {where} has label {self.labels[worst]} but classes is "
                            f"{self.num_classes}: {HINT}")
        self.input_shape = self.shards[0].shape[1:]
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.labels)

    def _images(self, k: int) -> np.ndarray:
        """All images of shard ``k``: a memory map, or the inflated array of a compressed shard."""
        if k in self._cache:
            self._cache.move_to_end(k)
            return self._cache[k]
        shard = self.shards[k]
        try:
            if shard.data_offset is not None:
                images = np.memmap(shard.path, dtype=np.uint8, mode="r", offset=shard.data_offset,
                                   shape=shard.shape, order="F" if shard.fortran_order else "C")
            else:
                with np.load(shard.path) as archive:
                    images = archive["x"]
        except READ_ERRORS as error:
            raise DataError(f"shard {shard.path} is not a readable .npz file ({error}): {HINT}") from None
        self._cache[k] = images
        if len(self._cache) > CACHED_SHARDS:
            self._cache.popitem(last=False)
        return images

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        images = np.empty((len(indices),) + self.input_shape, dtype=np.float32)
        shards = np.searchsorted(self.offsets, indices, side="right") - 1
        for k in np.unique(shards):
            rows = np.flatnonzero(shards == k)
            pixels = self._images(int(k))[indices[rows] - self.offsets[k]]
            images[rows] = (pixels / np.float32(255) - MEAN) / STD
        return images, self.labels[indices]
