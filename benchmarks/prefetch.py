"""The time a training step waits for its batch, read inside the step and read ahead on a thread.

    python benchmarks/prefetch.py [--model lenet] [--batch-size 64] [--threads 2] [--steps 20] [--rounds 3]

Writes a synthetic CIFAR-10 set in the binary layout (5 training files of 10,000 records,
50,000 in all, and a test file) to a temporary directory and trains on it with random crop
and flip, as a CIFAR-10 run reads from disk, once with ``--prefetch 0`` (each batch read,
decoded and augmented inside its step) and once with ``--prefetch 2``. It prints per
variant the median over rounds of the mean step time and of the median visible data time
of a step (from the step's start until its batch is on the device; the first step of an
epoch, whose batch nothing read ahead, is the mean's outlier and the median's not), and
their ratios to the in-step variant measured in the same run.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.data import Augmentation, open_dataset
from pydtnn_lite.data.cifar import FILES, RECORD
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.runtime import keep_freed_memory, set_blas_threads
from pydtnn_lite.training import Trainer, TrainerSettings, build_trainer

from common import interleave, model_parser

DEPTHS = {"in the step (--prefetch 0)": 0, "read ahead (--prefetch 2)": 2}


def write_cifar10(directory: str, records_per_file: int = 10_000, seed: int = 0) -> None:
    """Random CIFAR-10 binary batch files: a label byte 0..9, then 3,072 pixel bytes, per record."""
    rng = np.random.default_rng(seed)
    for file in FILES["train"] + FILES["test"]:
        records = rng.integers(0, 256, size=(records_per_file, RECORD), dtype=np.uint8)
        records[:, 0] %= 10
        records.tofile(os.path.join(directory, file))


def waiting_for_batches(trainer: Trainer) -> list[float]:
    """Make ``trainer`` note how long each step waits for its batch; returns the list it appends to."""
    waits: list[float] = []

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            started = time.perf_counter()
            batch = method(*args)
            waits.append(time.perf_counter() - started)
            return batch
        return call

    trainer.load_step = timed(trainer.load_step)  # type: ignore[method-assign]
    trainer.prefetched_step = timed(trainer.prefetched_step)  # type: ignore[method-assign]
    return waits


def main() -> None:
    parser = model_parser(__doc__)
    parser.set_defaults(model="lenet")
    parser.add_argument("--steps", type=int, default=20, help="training steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records-per-file", type=int, default=10_000,
                        help="records in each of the 5 training files and the test file (CIFAR-10's: 10,000)")
    args = parser.parse_args()
    keep_freed_memory()
    set_blas_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="cifar10-binary-") as directory:
        write_cifar10(directory, args.records_per_file)
        data = open_dataset("cifar10", "train", directory)
        print(f"{args.model}, batch {args.batch_size}, {args.threads} BLAS threads; {len(data):,} CIFAR-10 binary "
              f"records in {directory}, random crop 4 and flip; {args.steps} steps per round, {args.rounds} rounds")

        def variant(name: str, depth: int) -> Callable[[], dict[str, float]]:
            network = create_model(args.model, data.input_shape, data.num_classes).build(make_backend(), seed=0)
            settings = TrainerSettings(args.batch_size, steps_per_epoch=args.steps,
                                       augmentation=Augmentation(4, True), prefetch=depth)
            trainer = build_trainer(network, data, settings, optimizer=SGD(network),
                                    schedule=LearningRateSchedule(0.001))
            waits = waiting_for_batches(trainer)
            epochs = iter(range(10**6))

            def run() -> dict[str, float]:
                waits.clear()
                result = trainer.train_epoch(next(epochs))
                return {f"{name} step": result.seconds / args.steps, f"{name} data": statistics.median(waits)}
            return run

        samples = interleave([variant(name, depth) for name, depth in DEPTHS.items()], args.rounds)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    baseline = next(iter(DEPTHS))
    for name in DEPTHS:
        step, data_wait = medians[f"{name} step"], medians[f"{name} data"]
        print(f"{name}: step {step * 1e3:.1f} ms ({step / medians[f'{baseline} step']:.2f}x), visible data time "
              f"{data_wait * 1e3:.2f} ms per step ({data_wait / medians[f'{baseline} data']:.3f}x), "
              f"{100 * data_wait / step:.1f} % of the step")


if __name__ == "__main__":
    main()
