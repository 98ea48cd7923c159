"""Where a gradient bucket's reduction runs on one node: in its tests, or in the blocking reductions after it.

    mpiexec -n 2 python benchmarks/bucket_progress.py [--mb 1 4 16] [--kernels 12] [--gemm 256] [--repeats 15]

MPICH moves a non-blocking reduction's data only inside MPI calls, and any call advances
every collective outstanding on the communicator. Overlapped backward tests the buckets
after each kernel; a network with batch norm also makes a small blocking Allreduce (its
statistics) in every batch-norm layer's backward, and that call, ordered behind the
buckets, completes their work. This measures both patterns on every rank at once, each
repeat after a barrier:

- tests only: a bucket of each --mb posted, then --kernels one-thread GEMMs of --gemm
  cubed with a test after each, then a wait; the seconds in the post, the tests and the
  wait;
- with batch-norm reductions: the same with a blocking Allreduce of 64 float64 values after
  every kernel; the seconds in the post, the tests and the wait, and in the small
  reductions;

against, in the same run, a blocking Allreduce of the bucket alone and the small Allreduce
alone (between kernels, no bucket outstanding), the four interleaved in an order that
rotates every repeat. Rank 0 prints the medians over the ranks' medians and each figure
over the bucket's blocking Allreduce. ``calibrate`` records the second pattern against the
first (``pydtnn_lite/perfmodel/measuring/bucket_progress.py``, the same calls), and the
performance model leaves that share of a bucket in its own calls on one node.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from pydtnn_lite.comm.gradients import MIB
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.bucket_progress import STATISTICS_VALUES, Kernel, blocking, gemm_kernel, overlapped
from pydtnn_lite.runtime import set_blas_threads
from pydtnn_lite.textable import format_table

from common import Timings, interleave


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, nargs="+", default=[1.0, 4.0, 16.0], help="bucket sizes, MiB")
    parser.add_argument("--kernels", type=int, default=12, help="kernels between the post and the wait")
    parser.add_argument("--gemm", type=int, default=256, help="each kernel: a GEMM of this size cubed")
    parser.add_argument("--repeats", type=int, default=15)
    return parser.parse_args()


def patterns(comm: MPICommunicator, bucket: np.ndarray, kernel: Kernel, kernels: int,
             repeats: int) -> dict[str, list[float]]:
    """Seconds of each pattern over ``repeats`` interleaved rounds, a barrier before each call:
    the bucket's blocking Allreduce ("alone"), the small one ("small"), the bucket beside
    the kernels with tests only ("tests") and with the small reductions ("bn tests", "bn
    small"); collective."""
    values = np.ones(STATISTICS_VALUES)

    def with_statistics() -> Timings:
        in_bucket, in_statistics = overlapped(comm, bucket, kernel, kernels, True)
        return {"bn tests": in_bucket, "bn small": in_statistics}

    return interleave([lambda: {"alone": blocking(comm, bucket, kernel)},
                       lambda: {"small": blocking(comm, values, kernel)},
                       lambda: {"tests": overlapped(comm, bucket, kernel, kernels, False)[0]},
                       with_statistics], repeats, before=comm.barrier)


def main() -> int:
    args = parse_args()
    comm = MPICommunicator()
    if comm.size < 2:
        print("bucket_progress: needs at least 2 ranks: mpiexec -n 2 python benchmarks/bucket_progress.py",
              file=sys.stderr)
        return 2
    set_blas_threads(1)
    kernel = gemm_kernel(args.gemm)
    rows = []
    for mb in args.mb:
        bucket = np.random.default_rng(comm.rank).standard_normal(int(mb * MIB) // 4).astype(np.float32)
        samples = patterns(comm, bucket, kernel, args.kernels, args.repeats)
        medians = comm.gather_object({name: statistics.median(seconds) for name, seconds in samples.items()})
        if medians is not None:
            figure = {name: statistics.median(rank[name] for rank in medians) for name in samples}
            alone = figure["alone"]
            rows.append([f"{mb:g}", f"{alone * 1e3:.3f}",
                         *(f"{figure[name] * 1e3:.3f} ({figure[name] / alone:.2f}x)"
                           for name in ("tests", "bn tests", "bn small")),
                         f"{args.kernels * figure['small'] * 1e3:.3f}"])
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.kernels} kernels (GEMM {args.gemm}^3, one thread) between a bucket's post "
              f"and its wait; medians of {args.repeats} repeats, over the ranks; x: over the blocking Allreduce")
        print(format_table(["MiB", "blocking ms", "tests only: in the bucket's calls",
                            "with BN reductions: in the bucket's calls", "in the BN reductions",
                            "BN reductions alone"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
