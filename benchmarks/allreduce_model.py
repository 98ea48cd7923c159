"""The calibrated Allreduce model against fresh measurements (out of sample).

    mpiexec -n 2 python benchmarks/allreduce_model.py [--calibration calibration/dev-2core.json] [--repeats 9]

Times a bare in-place mpi4py Allreduce of float32 buffers from 1 KiB to 256 MiB (every
fourth power of two, offset from the calibration's sizes where it can be) and prints
the model's prediction, fitted to the calibration file's own samples, with its error.
"""
from __future__ import annotations

import argparse

import numpy as np
from common import median_seconds
from mpi4py import MPI

from pydtnn_lite.perfmodel.machines import calibrated_machine
from pydtnn_lite.runtime import keep_freed_memory

SIZES = [3 << k for k in range(9, 27, 2)]  # 1.5 KiB .. 192 MiB: between the calibration's powers of two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", default="calibration/dev-2core.json")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer and the calibration do: MPICH's large reductions run 2x faster with it
    world = MPI.COMM_WORLD
    model = calibrated_machine(args.calibration).allreduce
    rows = []
    for nbytes in SIZES:
        buffer = np.ones(nbytes // 4, dtype=np.float32)

        def reduce() -> None:
            world.Barrier()
            world.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        measured = median_seconds(reduce, args.repeats)
        rows.append((nbytes, measured, model.seconds(nbytes, world.Get_size())))
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks; model {model.algorithm} with thresholds "
              f"{[int(t) for t in model.thresholds]} bytes, fitted to {args.calibration}")
        print(f"{'bytes':>12}{'measured us':>14}{'predicted us':>14}{'error':>9}")
        for nbytes, measured, predicted in rows:
            print(f"{nbytes:>12}{measured * 1e6:>14.1f}{predicted * 1e6:>14.1f}{(predicted / measured - 1):>+9.1%}")


if __name__ == "__main__":
    main()
