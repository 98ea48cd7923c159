"""Single-process training throughput against the machine's GEMM peak, measured in the same run.

    python benchmarks/train_throughput.py [--model vgg11] [--batch-size 64] [--threads 2] [--steps 10]

Prints the float32 GEMM peak (median of square matmuls), the training step time (median),
images/s, and the fraction of the GEMM peak the whole step reaches:
(FLOPs of the step's FP and BP kernels, from the layers' analytic counts) / step time / peak.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.data import open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.runtime import set_blas_threads
from pydtnn_lite.training import Trainer


def gemm_peak(size: int, repeats: int) -> float:
    """Best sustained float32 FLOP/s of ``size``^3 matmuls (median of ``repeats``)."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    return 2.0 * size ** 3 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    set_blas_threads(args.threads)
    peak = gemm_peak(2048, 7)
    data = open_dataset(args.dataset)
    network = create_model(args.model, data.input_shape, data.num_classes).build(make_backend(), seed=0)
    comm = SerialCommunicator()
    trainer = Trainer(network, SGD(network), LearningRateSchedule(0.001), comm,
                      make_gradient_synchronizer(network, comm, 4.0, overlap=True), data, args.batch_size)
    images, labels, batch, _ = trainer.load_step(0, 0)
    times = []
    for step in range(args.warmup + args.steps):
        result = trainer.train_step(images, labels, batch, 0)
        if step >= args.warmup:
            times.append(result.seconds)
    step_time = statistics.median(times)
    flops = args.batch_size * (network.flops_per_sample("FP") + network.flops_per_sample("BP"))
    achieved = flops / step_time
    print(f"machine float32 GEMM peak ({args.threads} BLAS threads, 2048^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"{args.model} batch {args.batch_size}: step {step_time * 1e3:.1f} ms (median of {args.steps}), "
          f"{args.batch_size / step_time:.1f} img/s")
    print(f"step FLOPs {flops / 1e9:.2f} G -> {achieved / 1e9:.1f} GFLOP/s = {achieved / peak:.1%} of the GEMM peak")


if __name__ == "__main__":
    main()
