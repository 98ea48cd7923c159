"""Training-data augmentation: random crop of the zero-padded image and random horizontal flip.

Each sample's choice (row and column offset of the crop, flip or not) is a hash of
(seed, epoch, the sample's index in the data set) and nothing else, so the rank that
loads a sample, the number of ranks and the split of the batch do not change it: P ranks
train on exactly the images one process trains on, and a resumed run redraws the same
choices as the uninterrupted one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pydtnn_lite.data.base import DataError, Dataset
from pydtnn_lite.data.hashing import WORD_MASK, mix


def _sample_hashes(indices: np.ndarray, seed: int, epoch: int, words: int) -> np.ndarray:
    """``words`` independent uint64 hashes of (seed, epoch, index) per sample: shape (words, n)."""
    # A one-element array, not a NumPy scalar: scalars warn when the multiplications wrap.
    key = mix(mix(np.array([seed & WORD_MASK], dtype=np.uint64)) ^ np.uint64(epoch & WORD_MASK))
    per_sample = mix(key ^ np.asarray(indices, dtype=np.int64).astype(np.uint64))
    return mix(per_sample[None, :] ^ np.arange(words, dtype=np.uint64)[:, None])


@dataclass(frozen=True)
class Augmentation:
    """Random crop after ``crop_padding`` pixels of zero padding (0: none) and random horizontal flip.

    Images are NHWC float32 on the host, already normalised to about zero mean, so the
    zero padding is the mean colour. ``Augmentation()`` changes nothing.
    """

    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise DataError(f"--random-crop must be at least 0, got {self.crop_padding}")

    @property
    def active(self) -> bool:
        """Whether ``apply`` changes anything."""
        return self.crop_padding > 0 or self.flip

    def describe(self) -> str:
        """One phrase for the start-up lines, e.g. 'random crop (4 px zero padding), random horizontal flip'."""
        parts = [f"random crop ({self.crop_padding} px zero padding)"] if self.crop_padding else []
        parts += ["random horizontal flip"] if self.flip else []
        return ", ".join(parts) or "none"

    def check(self, data: Dataset) -> None:
        """Raise DataError if ``data``'s samples cannot take this augmentation."""
        if not self.active:
            return
        if len(data.input_shape) != 3:
            raise DataError(f"random crop and flip need (H, W, C) images, but {data.name} has samples of shape "
                            f"{tuple(data.input_shape)}: drop --random-crop and --random-flip")
        side = min(data.input_shape[:2])
        if self.crop_padding > side:
            raise DataError(f"--random-crop {self.crop_padding} pads more than the side of the "
                            f"{data.input_shape[0]}x{data.input_shape[1]} images of {data.name}: use at most {side}")

    def choices(self, indices: np.ndarray, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample of the data-set ``indices``: crop row and column offsets into the padded
        image (each in 0 .. 2 * crop_padding; crop_padding means centred) and whether to flip."""
        # Separate hash words, so the offsets and the flip are independent of each other.
        row_words, column_words, flip_words = _sample_hashes(indices, seed, epoch, 3)
        span = np.uint64(2 * self.crop_padding + 1)
        rows, columns = (row_words % span).astype(np.intp), (column_words % span).astype(np.intp)
        flips = (flip_words >> np.uint64(63)).astype(bool) & self.flip
        return rows, columns, flips

    def apply(self, images: np.ndarray, indices: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        """Augmented copy of ``images`` (n, H, W, C), whose rows are the data set's samples ``indices``.

        Returns ``images`` itself when there is nothing to do.
        """
        if not self.active:
            return images
        height, width = images.shape[1:3]
        pad = self.crop_padding
        rows, columns, flips = self.choices(indices, seed, epoch)
        padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        out = np.empty_like(images)
        # One slice copy per sample: faster than one fancy-indexing gather of every pixel
        # (docs/data.md, 'Augmentation').
        for i, (row, column, flip) in enumerate(zip(rows, columns, flips, strict=True)):
            window = padded[i, row:row + height, column:column + width]
            out[i] = window[:, ::-1] if flip else window
        return out
