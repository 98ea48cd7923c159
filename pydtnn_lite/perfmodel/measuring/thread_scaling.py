"""How far one rank's threads fall short of the cores they add (``placement.ThreadScaling``).

A calibration runs a rank per core, each on one thread; a job may run one rank on every
core (a single process on a laptop). The model then divides a threaded kernel's time by
the cores it gains, which holds for GEMM and not for the memory-bound parallel loops:
two threads of one process ran ReLU and the residual add over the whole work in about
twice the time that two one-thread ranks took for their halves at the same time
(2026-11-27, 1.96-2.22x in three calibrations; why, this machine does not say: one
thread alone streamed 25 GB/s, two threads of one process 30). So the calibration times
both: every rank running its share of a piece of work on one thread, all at once; then
its first rank running the whole on all of the host's cores while the others wait idly.
It also times the hand-off of a parallel loop to Numba's pool, which a call on more than
one thread pays whatever its size (about 0.1 ms here, where a ReLU of 64 KB takes 6 us in
place): the small kernels of a one-process job are mostly hand-off.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.comm import Communicator
from pydtnn_lite.perfmodel.measuring.machine_state import REPEATS, timed_median, wait_idly
from pydtnn_lite.perfmodel.modelling.placement import ThreadScaling
from pydtnn_lite.runtime import set_blas_threads, usable_cores

GEMM_SHARE = (2048, 1152, 128)  # rows, depth, columns of a thread's share: a convolution's product, ~7 ms
MEMORY_SHARE = 4 << 20  # float32 elements of a thread's share of the loops: 16 MB, beyond the caches
MEMORY_LOOPS = 2  # parallel loop calls in the memory-bound work, each with its hand-off
HANDOFF_ELEMENTS = 1024  # a ReLU that takes microseconds in place: on the pool, its time is the hand-off
HANDOFF_REPEATS = 101
ROUNDS = 5  # the ratio's median over rounds: one round's GEMM ratio moved 0.96-1.59 within minutes


def _work(shares: int) -> dict[str, Callable[[], object]]:
    """A GEMM and two memory-bound loops (ReLU, the residual add) over ``shares`` shares."""
    rng = np.random.default_rng(0)
    rows, depth, columns = GEMM_SHARE
    a = rng.standard_normal((shares * rows, depth), dtype=np.float32)
    b = rng.standard_normal((depth, columns), dtype=np.float32)
    x, y = (rng.standard_normal(shares * MEMORY_SHARE, dtype=np.float32) for _ in range(2))
    return {"gemm": lambda: kernels.gemm(a, b), "memory": lambda: kernels.add([kernels.relu(x), y])}


def measure_thread_scaling(comm: Communicator, blas_threads: int) -> ThreadScaling | None:
    """The shortfall of a rank running on all of its host's cores (collective; every rank gets
    it), or None where the ranks do not run one per core on one thread each
    (``blas_threads``), as the comparison needs."""
    cores = usable_cores()
    if cores < 2 or blas_threads != 1 or comm.local_size != cores:
        return None
    shares = _work(1)
    whole = _work(cores) if comm.rank == 0 else {}
    ratios = [_ratios(comm, shares, whole, cores, blas_threads) for _ in range(ROUNDS)]
    gemm, memory, handoff = (float(np.median([r[name] for r in ratios])) for name in ("gemm", "memory", "handoff"))
    return ThreadScaling(cores, gemm, memory, handoff)


def _ratios(comm: Communicator, shares: dict[str, Callable[[], object]], whole: dict[str, Callable[[], object]],
            cores: int, blas_threads: int) -> dict[str, float]:
    """One round: each of ``whole`` (rank 0's) on ``cores`` threads, less its hand-offs, over
    ``shares`` on one thread, every rank at once; and the hand-off (collective)."""
    wait_idly(comm)
    mine = {name: timed_median(run, REPEATS)[0] for name, run in shares.items()}
    share_seconds = comm.allgather_object(mine)
    wait_idly(comm)
    whole_seconds: dict[str, float] = {}
    handoff = 0.0
    if comm.rank == 0:
        tiny = np.ones(HANDOFF_ELEMENTS, dtype=np.float32)

        def tiny_loop() -> object:
            return kernels.relu(tiny)

        in_place = timed_median(tiny_loop, HANDOFF_REPEATS)[0]
        set_blas_threads(cores)
        try:
            whole_seconds = {name: timed_median(run, REPEATS)[0] for name, run in whole.items()}
            handoff = max(0.0, timed_median(tiny_loop, HANDOFF_REPEATS)[0] - in_place)
        finally:
            set_blas_threads(blas_threads)
    wait_idly(comm)
    whole_seconds, handoff = comm.broadcast_object((whole_seconds, handoff))
    whole_seconds["memory"] -= MEMORY_LOOPS * handoff
    ratios = {name: seconds / float(np.median([rank[name] for rank in share_seconds]))
              for name, seconds in whole_seconds.items()}
    return {**ratios, "handoff": handoff}
