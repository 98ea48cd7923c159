"""Allreduce of device arrays through each --comm strategy, against a bare mpi4py Allreduce of host arrays.

    mpiexec -n P python benchmarks/device_allreduce.py [--device gpu,cpu,cpu] [--strategies mpi gpu-side nccl]
        [--mib 1 4 16 64 256] [--repeats 10]

Every rank builds its backend from ``--device`` (one entry for all ranks, or one per rank)
and, for each strategy that can run on that placement, the communicator the trainer builds
for it: host staging for GPU ranks under ``mpi``, NCCL, the two-level ``gpu-side``. One rank
gets them too (the trainer keeps plain MPI there), so the NCCL path's own cost shows. For
each size it times in-place float32 Allreduces of device buffers, until the device has
finished, interleaved with a bare mpi4py ``Allreduce`` of a NumPy buffer of the same bytes:
medians of ``--repeats`` rounds, a barrier before each call, the slowest rank counted.

Rank 0 prints each time, algbw = bytes / time and busbw = algbw * 2(P-1)/P (the nccl-tests
convention; 0 on one rank, where nothing moves between ranks), and the time as a multiple
of the bare MPI Allreduce. Each communicator's sum is checked (every rank adds its rank + 1);
a wrong sum ends the job with exit 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from pydtnn_lite.backend import Backend, make_backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.nodes import node_name
from pydtnn_lite.comm.strategy import build_communicator, check_strategy, gather_placement
from pydtnn_lite.errors import UserError
from pydtnn_lite.run_config import device_of_rank
from pydtnn_lite.textable import format_table

from common import measure, timed

BARE = "bare mpi4py (host)"


def time_allreduces(communicators: dict[str, Communicator], backend: Backend, world: MPICommunicator,
                    elements: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each communicator's in-place Allreduce of ``elements`` device values and of the bare
    host one (rank 0's samples); each communicator's sum checked first."""
    expected = world.size * (world.size + 1) / 2
    host = np.ones(elements, dtype=np.float32)
    buffers = {name: backend.xp.full(elements, world.rank + 1, dtype=np.float32) for name in communicators}
    for name, comm in communicators.items():
        comm.allreduce(buffers[name])
        total = float(backend.to_host(buffers[name][:1])[0])
        if total != expected:
            sys.exit(f"device_allreduce: {name} summed {total}, not {expected}, on rank {world.rank}")

    def reduce(comm: Communicator, buffer: Any) -> None:
        comm.allreduce(buffer)
        backend.synchronize()

    variants = [lambda: {BARE: timed(lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM))}]
    variants += [lambda name=name, comm=comm: {name: timed(lambda: reduce(comm, buffers[name]))}
                 for name, comm in communicators.items()]
    return measure(variants, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--strategies", nargs="+", default=["mpi", "gpu-side", "nccl"])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    world = MPICommunicator(timeout=120)
    size, rank = world.size, world.rank
    backend = make_backend(device_of_rank(args.device, rank, size), "float32", gpu_id=world.local_rank)
    placement = gather_placement(world, backend, node_name())
    communicators = {}
    for strategy in args.strategies:
        try:
            check_strategy(strategy, placement)
        except UserError as error:
            if rank == 0:
                print(f"{strategy}: skipped ({error})")
            continue
        communicators[strategy] = build_communicator(strategy, placement, backend, world, timeout=120)

    rows = []
    for mib in args.mib:
        elements = int(mib * (1 << 20)) // 4
        samples = time_allreduces(communicators, backend, world, elements, args.repeats)
        if rank == 0:
            bare = statistics.median(samples[BARE])
            for name in [BARE, *communicators]:
                seconds = statistics.median(samples[name])
                algbw = elements * 4 / seconds / 1e9
                rows.append([f"{mib:g}", name, f"{seconds * 1e3:.3f}", f"{algbw:.2f}",
                             f"{algbw * 2 * (size - 1) / size:.2f}", f"{seconds / bare:.2f}x"])
    if rank == 0:
        print(f"{size} rank(s), devices {', '.join(placement.devices)}; sums checked")
        print(format_table(["MiB", "Allreduce", "ms", "algbw GB/s", "busbw GB/s", "vs bare MPI"], rows))


if __name__ == "__main__":
    main()
