"""Loading a batch of the embedded synthetic sets, against one NumPy generator per sample.

    python benchmarks/synthetic_data.py [--batch-size 128] [--rounds 5]

Times ``SyntheticDataset.load`` at CIFAR and ImageNet sizes and, interleaved with it in the
same run, the way the set drew its samples before: a ``numpy.random.default_rng`` seeded
per sample drawing standard normal noise, plus the class template. Prints the median of
``--rounds`` loads of each and their speed against the generators'.
"""
from __future__ import annotations

import argparse
import statistics
from functools import partial

import numpy as np

from pydtnn_lite.data import GENERATED_SHAPES, SyntheticDataset

from common import interleave, timed


def per_sample_generators(data: SyntheticDataset, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The baseline: one generator per sample, seeded by (seed, split, index)."""
    images = np.empty((len(indices),) + data.input_shape, dtype=np.float32)
    labels = np.empty(len(indices), dtype=np.int64)
    for row, index in enumerate(indices):
        rng = np.random.default_rng([data.seed, data.split, int(index)])
        labels[row] = rng.integers(data.num_classes)
        images[row] = rng.standard_normal(data.input_shape, dtype=np.float32) + data.template(labels[row])
    return images, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    indices = np.arange(args.batch_size)
    for name in ("synthetic", "synthetic-imagenet"):
        shape, classes = GENERATED_SHAPES[name]
        data = SyntheticDataset(10_000, shape, classes, name=name)
        variants = {"compiled loop": partial(data.load, indices),
                    "generator per sample": partial(per_sample_generators, data, indices)}
        times = interleave([lambda v=v, f=f: {v: timed(f)} for v, f in variants.items()], args.rounds)
        base = statistics.median(times["generator per sample"])
        for variant in variants:
            seconds = statistics.median(times[variant])
            print(f"{name} {shape}, {args.batch_size} samples, {variant}: {seconds * 1e3:.2f} ms "
                  f"({base / seconds:.2f}x the generators' speed)")


if __name__ == "__main__":
    main()
