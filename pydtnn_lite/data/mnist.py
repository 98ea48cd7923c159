"""MNIST from its IDX files, plain or gzipped, read in place through memory maps.

An IDX file is a big-endian header (a magic number whose last byte is the number of
dimensions, then one 32-bit size per dimension) followed by the raw uint8 array. A
gzipped file cannot be read at an offset, so it is decompressed once, streaming, to a
plain file beside it (or in the temp directory when that is read-only) and mapped from there.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import zlib

import numpy as np

from pydtnn_lite.data.base import DataError, Dataset, check_data_directory

IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
CLASSES = 10
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Standard statistics of the training set, on the 0..1 scale.
MEAN, STD = np.float32(0.1307), np.float32(0.3081)
HINT = "download the MNIST IDX files (plain or .gz) into the data directory"


def _idx_header(path: str, magic: int, kind: str, shown: str) -> tuple[tuple[int, ...], int]:
    """Dimensions and data offset of IDX file ``path``, checked against its size;
    errors name ``shown``, the file the user gave."""
    ndim = magic & 0xFF
    with open(path, "rb") as file:
        header = file.read(4 * (1 + ndim))
    if len(header) < 4 or int.from_bytes(header[:4], "big") != magic:
        raise DataError(f"{shown} is not an IDX {kind} file (bad magic number): {HINT}")
    if len(header) < 4 * (1 + ndim):
        raise DataError(f"{shown} is truncated inside its header: {HINT}")
    dims = tuple(int(d) for d in np.frombuffer(header, dtype=">u4", offset=4))
    expected = len(header) + int(np.prod(dims))
    size = os.path.getsize(path)
    if size != expected:
        raise DataError(f"{shown} holds {size} bytes but its header {dims} needs {expected}: "
                        f"the file is truncated or corrupt; {HINT}")
    return dims, len(header)


def _cache_path(gz_path: str) -> str:
    """Where the decompressed copy of ``gz_path`` lives: beside it when that directory is
    writable, else in the temp directory under a name tied to the source's path, size and
    modification time, so that a changed source is decompressed afresh."""
    beside = gz_path[: -len(".gz")]
    if os.access(os.path.dirname(beside) or ".", os.W_OK):
        return beside
    stat = os.stat(gz_path)
    key = hashlib.sha1(f"{os.path.abspath(gz_path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return os.path.join(tempfile.gettempdir(),
                        f"pydtnn_lite-{key.hexdigest()[:16]}-{os.path.basename(beside)}")


def _decompress(gz_path: str, magic: int, kind: str) -> str:
    """Decompress ``gz_path`` to its cache file (unless already there) and return that path.

    The copy is written to a temporary name, checked, then renamed into place, so ranks
    decompressing at once never see a partial file and a bad copy is never left behind.
    """
    target = _cache_path(gz_path)
    if os.path.exists(target):
        return target
    handle, partial = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".partial-")
    try:
        with os.fdopen(handle, "wb") as out, gzip.open(gz_path, "rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
        _idx_header(partial, magic, kind, shown=gz_path)
        os.replace(partial, target)
    except (OSError, EOFError, zlib.error) as error:
        os.unlink(partial)
        raise DataError(f"cannot decompress {gz_path} to {target} ({error}): re-download the file "
                        f"or free space in {os.path.dirname(target)}") from None
    except DataError:
        os.unlink(partial)
        raise
    return target


def _open_idx(directory: str, stem: str, magic: int, kind: str) -> tuple[np.memmap, str]:
    """Memory map of the array in IDX file ``stem`` (plain, else gzipped) and its path."""
    plain = os.path.join(directory, stem)
    path = plain if os.path.isfile(plain) else plain + ".gz"
    if not os.path.isfile(path):
        raise DataError(f"missing MNIST file {plain} (or {plain}.gz): {HINT}")
    readable = _decompress(path, magic, kind) if path.endswith(".gz") else path
    dims, offset = _idx_header(readable, magic, kind, shown=path)
    return np.memmap(readable, dtype=np.uint8, mode="r", offset=offset, shape=dims), path


class MnistDataset(Dataset):
    """One split of MNIST (or an IDX-format look-alike) from the files in ``data_dir``."""

    name = "mnist"
    num_classes = CLASSES

    def __init__(self, data_dir: str | os.PathLike, split: str = "train") -> None:
        directory = check_data_directory(data_dir, split, FILES, "MNIST", HINT)
        images_stem, labels_stem = FILES[split]
        self.images, images_path = _open_idx(directory, images_stem, IMAGES_MAGIC, "image")
        self.labels, labels_path = _open_idx(directory, labels_stem, LABELS_MAGIC, "label")
        if len(self.images) != len(self.labels):
            raise DataError(f"{images_path} holds {len(self.images)} images but {labels_path} "
                            f"holds {len(self.labels)} labels: the files do not belong together; {HINT}")
        # The label file is small (one byte a sample), so it is checked whole here.
        if len(self.labels) and int(self.labels.max()) >= CLASSES:
            raise DataError(f"{labels_path} has label {int(self.labels.max())}, MNIST labels are 0..9: "
                            f"{HINT}")
        self.input_shape = tuple(self.images.shape[1:]) + (1,)

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        self.check_indices(indices)
        pixels = self.images[indices][..., None]  # fancy indexing copies just these images
        return (pixels / np.float32(255) - MEAN) / STD, self.labels[indices].astype(np.int64)
