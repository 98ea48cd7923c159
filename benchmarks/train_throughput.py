"""Single-process training throughput against the machine's GEMM peak, measured in the same run.

    python benchmarks/train_throughput.py [--model vgg11] [--batch-size 64] [--threads 2] [--steps 10]

Prints the float32 GEMM peak (median of square matmuls), the training step time (median),
images/s, and the fraction of the GEMM peak the whole step reaches:
(FLOPs of the step's FP and BP kernels, from the layers' analytic counts) / step time / peak.
"""
from __future__ import annotations

import numpy as np

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.runtime import set_blas_threads

from common import make_trainer, median_seconds, model_parser


def gemm_peak(size: int, repeats: int) -> float:
    """Best sustained float32 FLOP/s of ``size``^3 matmuls (median of ``repeats``)."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    return 2.0 * size ** 3 / median_seconds(lambda: a @ b, repeats)


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    set_blas_threads(args.threads)
    peak = gemm_peak(2048, 7)
    trainer = make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator())
    network = trainer.network
    batch = trainer.load_step(0, 0)
    step_time = median_seconds(lambda: trainer.train_step(batch), args.steps, args.warmup)
    flops = args.batch_size * (network.flops_per_sample("FP") + network.flops_per_sample("BP"))
    achieved = flops / step_time
    print(f"machine float32 GEMM peak ({args.threads} BLAS threads, 2048^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"{args.model} batch {args.batch_size}: step {step_time * 1e3:.1f} ms (median of {args.steps}), "
          f"{args.batch_size / step_time:.1f} img/s")
    print(f"step FLOPs {flops / 1e9:.2f} G -> {achieved / 1e9:.1f} GFLOP/s = {achieved / peak:.1%} of the GEMM peak")


if __name__ == "__main__":
    main()
