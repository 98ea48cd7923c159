"""Time of random crop and flip for one batch, at CIFAR and ImageNet sizes.

    python benchmarks/augmentation.py [--batch-size 64] [--repeats 20]

Best of ``--repeats`` calls of ``Augmentation(crop_padding, flip=True).apply`` on a batch of
zeros (the time does not depend on the pixels), after one untimed call.
"""
from __future__ import annotations

import argparse
import timeit
from functools import partial

import numpy as np

from pydtnn_lite.data import Augmentation

SIZES = {"CIFAR 32x32x3, pad 4": ((32, 32, 3), 4), "ImageNet 224x224x3, pad 4": ((224, 224, 3), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    indices = np.arange(args.batch_size)
    for name, (shape, pad) in SIZES.items():
        images = np.zeros((args.batch_size, *shape), dtype=np.float32)
        augment = Augmentation(crop_padding=pad, flip=True)
        augment.apply(images, indices, seed=0, epoch=0)
        seconds = min(timeit.repeat(partial(augment.apply, images, indices, seed=0, epoch=0), number=1,
                                    repeat=args.repeats))
        print(f"{name}: {seconds * 1e3:.2f} ms per batch of {args.batch_size} (best of {args.repeats})")


if __name__ == "__main__":
    main()
