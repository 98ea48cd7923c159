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
place): the small kernels of a one-process job are mostly hand-off. And after the kernel
samples, it times every GEMM shape they hold both ways (:func:`measure_gemm_shapes`):
OpenBLAS splits a small product between threads at a loss, so one GEMM's ratio does not
hold for the rest (one process of two threads ran the 36 products of a Winograd layer of
VGG11 at batch 32 in 0.117 ms a call, where the ratio of a large GEMM predicted 0.068).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from pydtnn_lite import kernels
from pydtnn_lite.comm import Communicator
from pydtnn_lite.kernels.cpu import in_place
from pydtnn_lite.perfmodel.measuring.machine_state import REPEATS, timed_median, wait_idly
from pydtnn_lite.perfmodel.measuring.sampling import rounded
from pydtnn_lite.perfmodel.modelling.placement import ThreadScaling
from pydtnn_lite.runtime import set_blas_threads, usable_cores

GEMM_SHARE = (2048, 1152, 128)  # rows, depth, columns of a thread's share: a convolution's product, ~7 ms
MEMORY_SHARE = 4 << 20  # float32 elements of a thread's share of the loops: 16 MB, beyond the caches
MEMORY_LOOPS = 2  # parallel loop calls in the memory-bound work, each with its hand-off
HANDOFF_ELEMENTS = 1024  # a ReLU that takes microseconds in place: on the pool, its time is the hand-off
HANDOFF_REPEATS = 101
ROUNDS = 5  # the ratio's median over rounds: one round's GEMM ratio moved 0.96-1.59 within minutes
SHAPE_SECONDS = 0.02  # each GEMM shape is timed over about this long, in 3 to 50 calls
# Operands are taken in turn from a pool twice this machine's last-level cache, as a
# layer's products each read their own from memory: a Winograd layer's products (128 x 128
# x 256) ran 2.0x as fast on two threads with their operands in the cache, 1.2x from memory.
POOL_BYTES = 64 << 20
MAX_COPIES = 1024

T = TypeVar("T")


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
    tiny = np.ones(HANDOFF_ELEMENTS, dtype=np.float32)

    def tiny_loop() -> object:
        return kernels.relu(tiny)

    def whole_and_handoff() -> tuple[dict[str, float], float]:
        with in_place():
            alone = timed_median(tiny_loop, HANDOFF_REPEATS)[0]
        whole_seconds = {name: timed_median(run, REPEATS)[0] for name, run in whole.items()}
        return whole_seconds, max(0.0, timed_median(tiny_loop, HANDOFF_REPEATS)[0] - alone)

    whole_seconds, handoff = _on_every_core(comm, cores, blas_threads, whole_and_handoff)
    whole_seconds["memory"] -= MEMORY_LOOPS * handoff
    ratios = {name: seconds / float(np.median([rank[name] for rank in share_seconds]))
              for name, seconds in whole_seconds.items()}
    return {**ratios, "handoff": handoff}


def _on_every_core(comm: Communicator, cores: int, blas_threads: int, run: Callable[[], T]) -> T:
    """``run()`` on rank 0 with its BLAS and loops on ``cores`` threads while the other ranks
    wait idly, then back on ``blas_threads``; its result on every rank (collective)."""
    wait_idly(comm)
    result = None
    if comm.rank == 0:
        set_blas_threads(cores)
        try:
            result = run()
        finally:
            set_blas_threads(blas_threads)
    wait_idly(comm)
    return comm.broadcast_object(result)


def _gemm_call(dims: tuple[int, ...], pool: np.ndarray) -> Callable[[], object]:
    """A call of the GEMM of ``dims`` (rows, columns, depth, A transposed, B transposed) on
    operands stored as the layers store theirs, each call on the next ones of ``pool``
    (operands larger than the pool: their own, which no cache holds either)."""
    rows, columns, depth, transposed_a, transposed_b = dims
    shape_a = (depth, rows) if transposed_a else (rows, depth)
    shape_b = (columns, depth) if transposed_b else (depth, columns)
    size_a, size = rows * depth, rows * depth + depth * columns
    starts = range(0, pool.size - size + 1, size)[:MAX_COPIES] if size <= pool.size else range(0)
    operands = ([(pool[start:start + size_a].reshape(shape_a), pool[start + size_a:start + size].reshape(shape_b))
                 for start in starts]
                or [(np.ones(shape_a, dtype=np.float32), np.ones(shape_b, dtype=np.float32))])
    turns = itertools.cycle(operands)

    def call() -> object:
        a, b = next(turns)
        return kernels.gemm(a, b, trans_a=bool(transposed_a), trans_b=bool(transposed_b))
    return call


def _shape_seconds(shapes: Sequence[tuple[int, ...]]) -> list[float]:
    """The median seconds of each shape's GEMM on this rank's threads as they are set."""
    pool = np.random.default_rng(0).random(POOL_BYTES // 4, dtype=np.float32)
    seconds = []
    for dims in shapes:
        call = _gemm_call(dims, pool)
        estimate, _ = timed_median(call, 2)
        seconds.append(timed_median(call, min(50, max(3, math.ceil(SHAPE_SECONDS / max(estimate, 1e-6)))))[0])
    return seconds


def measure_gemm_shapes(comm: Communicator, shapes: Sequence[tuple[int, ...]], cores: int,
                        blas_threads: int) -> dict[tuple[int, ...], float]:
    """Each GEMM shape's ratio (:class:`ThreadScaling`'s ``gemm_shapes``): rank 0 alone on
    ``cores`` threads, over the whole on one thread as ``cores`` ranks run it at once, whose
    time is the ranks' median of theirs (collective; every rank gets the ratios)."""
    distinct = sorted(set(shapes))
    wait_idly(comm)
    alone = comm.allgather_object(_shape_seconds(distinct))
    threaded = _on_every_core(comm, cores, blas_threads, lambda: _shape_seconds(distinct))
    return {dims: rounded(cores * threaded[i] / float(np.median([rank[i] for rank in alone])))
            for i, dims in enumerate(distinct)}
