"""A gradient bucket's Allreduce and a layer's update with their data in the cache, against after an eviction.

    mpiexec -n 2 python benchmarks/cache_residency.py [--mib 1 4 16 64] [--calls 15] [--rounds 2]

``calibrate`` times both kernels after an eviction of the caches, as a network larger than
the last-level cache leaves them: its bucket and its optimizer state are touched again only
after the rest of the step has streamed through memory. A small network (MLP, LeNet) keeps
its bucket, or its whole step, in the cache, and pays the resident time instead. This runs
the measurement ``calibrate`` records for that (``measuring/cache_residency.py``) at the
sizes given, every rank at once, each on its share of the cores as ``calibrate`` runs them:

- resident: the gradient written just before the call, the rest of its data used by the call before;
- after a wait: as resident, then the rank spins for each of ``--idle-ms`` before the call;
- evicted: after every rank has streamed twice the last-level cache (as ``calibrate`` samples them),
  an update after an update of a few elements of other arrays, as a step's updates follow each other.

Rank 0 prints the medians of each kernel and their ratios over the evicted one, the
factor a prediction applies where a step leaves the data in the cache (1.0: the cache
does not matter at that size), the call coming right after the data's last use or that
long after it. On a host whose cache other tenants share, the ratio climbs towards 1 with
the wait: their traffic evicts the data while the rank computes.
"""
from __future__ import annotations

import argparse

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.cache_residency import CALLS, IDLE_WAITS, ROUNDS, measure_cache_residency
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.runtime import default_blas_threads, set_blas_threads
from pydtnn_lite.textable import format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 4, 16, 64],
                        help="sizes of the gradient (MiB of float32)")
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per size, kernel, mode and round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="resident and evicted rounds, alternating")
    parser.add_argument("--idle-ms", type=float, nargs="*", default=[1e3 * wait for wait in IDLE_WAITS],
                        help="waits from the data's last use to a resident call (ms; none: only right after)")
    args = parser.parse_args()
    comm = MPICommunicator()
    set_blas_threads(default_blas_threads(comm))  # as calibrate runs them: a rank's share of the cores
    residency = measure_cache_residency(comm, CacheEvictor(make_backend("cpu")),
                                        [int(mib * (1 << 20)) for mib in args.mib], args.calls, args.rounds,
                                        [ms / 1e3 for ms in args.idle_ms])
    if comm.rank != 0:
        return
    rows = []
    for kernel in residency.resident:
        for index, nbytes in enumerate(residency.sizes):
            evicted = residency.evicted[kernel][index]
            in_cache = (residency.resident[kernel][index], *(row[index] for row in residency.idle.get(kernel, ())))
            rows.append([kernel, f"{nbytes / (1 << 20):g}", *(f"{1e3 * s:.3f}" for s in in_cache),
                         f"{1e3 * evicted:.3f}", *(f"{s / evicted:.2f}" for s in in_cache)])
    cache = make_backend("cpu").last_level_cache_bytes() >> 20
    waits = [f"after {ms:g} ms" for ms in args.idle_ms]
    print(f"{comm.size} rank(s), each streaming {2 * cache} MiB to evict the caches")
    print(format_table(["kernel", "MiB", "resident ms", *waits, "evicted ms", "resident / evicted",
                        *(f"{wait} / evicted" for wait in waits)], rows))


if __name__ == "__main__":
    main()
