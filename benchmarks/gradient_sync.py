"""Gradient synchronisation against bare mpi4py, bucket sizes, overlap with backward, and rank scaling.

    mpiexec -n 2 python benchmarks/gradient_sync.py [--model vgg11] [--batch-size 64] [--repeats 30]
        [--steps 15] [--bucket-mb 0.25 0.5 1 2 4 8 16 64] [--parts 1 2 3 4]

Every figure is the median of repeats interleaved with the baseline it is compared with,
in this run; each repeat starts after a barrier and counts the slowest rank. GB/s follow
the nccl-tests convention: algbw = bytes / time, busbw = algbw * 2(P-1)/P. Rank 0 prints:

1. sync: the trainer's GradientSynchronizer (blocking; 1 MiB first bucket, then 4 MiB)
   reducing the model's whole flat gradient, against a bare mpi4py Allreduce of the same
   bytes in one call and over the same bucket slices (the framework's own overhead), and
   the same slices' Iallreduce posted together, then waited for (what MPICH makes of
   reductions started at once: the synchronizer reduces in turn those backward did not start).
2. buckets: the blocking synchronizer with equal buckets of each --bucket-mb size, and one
   bucket holding the whole gradient.
3. overlap: the Trainer's training step with overlap off and on, and, separately, backward
   alone and the blocking synchronisation after it (T_comm). Hidden fraction from the step
   times, (off - on) / T_comm, and from the communication each mode charges to the step:
   the seconds its progress calls take inside backward plus the synchronisation left once
   the last rank's backward ends (free of the step-time noise of a shared machine).
4. scaling: training steps of rank 0 alone with every core's BLAS thread (the other ranks
   sleep) against all ranks with their share of the cores, same global batch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from pydtnn_lite.comm import GradientSynchronizer, SerialCommunicator, make_gradient_synchronizer
from pydtnn_lite.comm.gradients import MIB
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.layers import StepContext
from pydtnn_lite.runtime import default_blas_threads, set_blas_threads, usable_cores
from pydtnn_lite.textable import format_table
from pydtnn_lite.training import Trainer

from common import Timings, make_trainer, measure, timed

WORLD = MPI.COMM_WORLD
Samples = dict[str, list[float]]


def medians(samples: Samples, order: Sequence[str] = ()) -> dict[str, float]:
    """Each figure's median; the names in ``order`` first, in that order (rounds rotate the variants)."""
    names = list(order) + [name for name in samples if name not in order]
    return {name: statistics.median(samples[name]) for name in names}


def bare_allreduce(buffer: np.ndarray) -> None:
    WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)


def posted_together(buffers: Sequence[np.ndarray]) -> None:
    for request in [WORLD.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM) for buffer in buffers]:
        request.Wait()


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows as aligned columns under ``title``; floats with two decimals."""
    cells = [[f"{c:.2f}" if isinstance(c, float) else c for c in row] for row in rows]
    return f"{title}\n{format_table(header, cells)}\n"


def sync_rows(times: dict[str, float], nbytes: int, baseline: str) -> list[list[object]]:
    """Per variant: ms, algbw and busbw in GB/s, and throughput relative to ``baseline``."""
    rows = []
    for name, seconds in times.items():
        algbw = nbytes / seconds / 1e9
        rows.append([name, seconds * 1e3, algbw, algbw * 2 * (WORLD.size - 1) / WORLD.size, times[baseline] / seconds])
    return rows


def synchronisation(sync: GradientSynchronizer, repeats: int) -> str:
    """Part 1: the blocking synchronizer against bare mpi4py on the same bytes."""
    flat = sync.network.flat_grads  # zeros: repeated sums never overflow, and adding floats takes the same time
    slices = [flat[bucket.start:bucket.stop] for bucket in sync.buckets]
    names = ["bare Allreduce, one call", "bare Allreduce, same buckets", "GradientSynchronizer",
             "bare Iallreduce, same buckets posted together"]
    samples = measure([lambda: {names[0]: timed(lambda: bare_allreduce(flat))},
                       lambda: {names[1]: timed(lambda: [bare_allreduce(s) for s in slices])},
                       lambda: {names[2]: timed(sync.finish)},
                       lambda: {names[3]: timed(lambda: posted_together(slices))}], repeats)
    if not samples:
        return ""
    times = medians(samples, names)
    return (table(f"1. sync: {flat.nbytes / MIB:.1f} MiB gradient, {sync.describe()}, median of {repeats}",
                  ["", "ms", "algbw GB/s", "busbw GB/s", "x one call"], sync_rows(times, flat.nbytes, names[0]))
            + f"synchronizer / bare Allreduce of the same buckets: "
              f"{times[names[1]] / times[names[2]]:.2f}x throughput\n"
            + f"buckets posted together / reduced in turn: {times[names[1]] / times[names[3]]:.2f}x throughput\n")


def bucket_sweep(sync: GradientSynchronizer, sizes_mb: Sequence[float], repeats: int) -> str:
    """Part 2: equal buckets of each size, and one bucket of the whole gradient."""
    network, comm = sync.network, sync.comm
    nbytes = network.flat_grads.nbytes
    sizes = {f"{size:g} MiB": size for size in sizes_mb}
    whole = f"one bucket ({nbytes / MIB:.1f} MiB)"
    sizes[whole] = nbytes / MIB
    synchronizers = {name: GradientSynchronizer(network, comm, size, size, overlap=False)
                     for name, size in sizes.items()}
    samples = measure([lambda name=name, s=s: {name: timed(s.finish)} for name, s in synchronizers.items()], repeats)
    if not samples:
        return ""
    times = medians(samples, list(synchronizers))
    rows = [[name, len(synchronizers[name].buckets), *row[1:]]
            for name, row in zip(times, sync_rows(times, nbytes, whole), strict=True)]
    return table(f"2. buckets: blocking synchronizer, equal buckets, median of {repeats}",
                 ["bucket", "buckets", "ms", "algbw GB/s", "busbw GB/s", "x one bucket"], rows)


class ProgressTimer:
    """Stands in for a synchronizer in the trainer and adds up the seconds of the layer_done calls
    backward makes and of the synchronizer's tests after kernel calls: the communication work
    that the overlap moves into backward."""

    def __init__(self, synchronizer: GradientSynchronizer) -> None:
        self.synchronizer, self.seconds = synchronizer, 0.0
        self.comm = synchronizer.comm  # the trainer's collectives go through its synchronizer's communicator
        self.tests_before = synchronizer.kernel_test_seconds

    def layer_done(self, layer_index: int) -> None:
        self.seconds += timed(lambda: self.synchronizer.layer_done(layer_index))

    def finish(self) -> None:
        self.seconds += self.synchronizer.kernel_test_seconds - self.tests_before
        self.synchronizer.finish()


def overlap(trainer: Trainer, blocking: GradientSynchronizer, overlapped: GradientSynchronizer, steps: int) -> str:
    """Part 3: how much of T_comm the overlapped synchronizer hides behind backward."""
    network, loss = trainer.network, trainer.loss
    batch = trainer.load_step(0, 0)

    def step(sync: GradientSynchronizer, mode: str) -> Timings:
        progress = ProgressTimer(sync)
        trainer.synchronizer = progress
        seconds = timed(lambda: trainer.train_step(batch))
        # The rank whose backward ends last waits least in finish(): its wait is the communication
        # left once every rank is done, free of the ranks' skew, and its progress calls plus that
        # wait are what communication adds to the step.
        return {f"step {mode}": seconds, f"progress {mode}": progress.seconds,
                f"left {mode}": WORLD.allreduce(sync.exposed_seconds, op=MPI.MIN),
                f"charged {mode}": WORLD.allreduce(progress.seconds + sync.exposed_seconds, op=MPI.MIN)}

    def backward_then_sync() -> Timings:
        ctx = StepContext(training=True, global_batch=batch.global_size, sample_offset=batch.offset,
                          sum_across_ranks=trainer.comm.allreduce)
        loss.forward(network.forward(batch.images, ctx), batch.labels, ctx)
        backward = timed(lambda: network.backward(loss.backward()))
        WORLD.Barrier()  # T_comm without the ranks' skew
        return {"backward": backward, "T_comm": timed(blocking.finish)}

    samples = measure([lambda: step(blocking, "off"), lambda: step(overlapped, "on"), backward_then_sync], steps)
    if not samples:
        return ""
    times = medians(samples)
    comm_time = times["T_comm"]
    quartiles = {mode: statistics.quantiles(samples[f"step {mode}"])[::2] for mode in ("off", "on")}
    rows = [["step", times["step off"] * 1e3, times["step on"] * 1e3],
            ["step, quartiles", *(f"{low * 1e3:.0f}-{high * 1e3:.0f}" for low, high in quartiles.values())],
            ["progress calls inside backward", times["progress off"] * 1e3, times["progress on"] * 1e3],
            ["sync left after the last backward", times["left off"] * 1e3, times["left on"] * 1e3],
            ["communication charged to the step", times["charged off"] * 1e3, times["charged on"] * 1e3]]
    from_steps = (times["step off"] - times["step on"]) / comm_time
    from_parts = 1 - times["charged on"] / times["charged off"]
    return (table(f"3. overlap: {network.name}, global batch {batch.global_size} ({batch.samples} on rank 0), "
                  f"median of {steps}", ["ms", "overlap off", "overlap on"], rows)
            + f"backward alone {times['backward'] * 1e3:.1f} ms, T_comm (blocking sync after backward and a barrier) "
              f"{comm_time * 1e3:.2f} ms: backward is {times['backward'] / comm_time:.0f}x T_comm\n"
            + f"hidden from step times, (off - on) / T_comm: {from_steps:.0%}\n"
            + f"hidden from the parts, 1 - charged on / charged off: {from_parts:.0%}\n")


def scaling(args: argparse.Namespace, trainer: Trainer, overlapped: GradientSynchronizer, steps: int) -> str:
    """Part 4: img/s of rank 0 alone (every core) against all ranks (their share each), same global batch."""
    trainer.synchronizer = overlapped  # as the command line trains
    per_rank, cores = default_blas_threads(trainer.comm), usable_cores()
    alone = make_trainer(args.model, args.dataset, args.batch_size, SerialCommunicator()) if WORLD.rank == 0 else None
    batches = {t: t.load_step(0, 0) for t in (trainer, alone) if t is not None}

    def train_step(t: Trainer) -> float:
        return timed(lambda: t.train_step(batches[t]))

    def rank_zero_alone() -> Timings:
        timings = {}
        if alone is not None:
            set_blas_threads(cores)
            timings["alone"] = train_step(alone)
            set_blas_threads(per_rank)
        done = WORLD.Ibarrier()
        while not done.Test():  # the other ranks sleep instead of spinning in a blocking barrier
            time.sleep(1e-3)
        return timings

    samples = measure([rank_zero_alone, lambda: {"all": train_step(trainer)}], steps)
    if not samples:
        return ""
    times = medians(samples)
    rows = [[f"1 rank x {cores} BLAS threads", times["alone"] * 1e3, args.batch_size / times["alone"]],
            [f"{WORLD.size} ranks x {per_rank} BLAS threads", times["all"] * 1e3, args.batch_size / times["all"]]]
    return (table(f"4. scaling: {trainer.network.name}, global batch {args.batch_size}, overlap on, median of {steps}",
                  ["", "step ms", "img/s"], rows)
            + f"throughput {WORLD.size} ranks / 1 rank on the same cores: {times['alone'] / times['all']:.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch of the training steps (parts 3-4)")
    parser.add_argument("--repeats", type=int, default=30, help="repeats of each synchronisation (parts 1-2)")
    parser.add_argument("--steps", type=int, default=15, help="repeats of each training-step variant (parts 3-4)")
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 8, 16, 64],
                        help="bucket sizes of the sweep (part 2), MiB")
    parser.add_argument("--parts", type=int, nargs="+", choices=range(1, 5), default=[1, 2, 3, 4],
                        help="which parts to run")
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 2:
        parser.error("--repeats must be at least 1 and --steps at least 2 (the step quartiles need two)")
    if WORLD.size < 2:
        sys.exit("gradient_sync: needs at least 2 ranks: mpiexec -n 2 python benchmarks/gradient_sync.py")

    comm = MPICommunicator()
    set_blas_threads(default_blas_threads(comm))
    trainer = make_trainer(args.model, args.dataset, args.batch_size, comm, overlap=False)
    blocking = trainer.synchronizer
    overlapped = make_gradient_synchronizer(trainer.network, comm, 4.0, overlap=True)
    parts = {1: lambda: synchronisation(blocking, args.repeats),
             2: lambda: bucket_sweep(blocking, args.bucket_mb, args.repeats),
             3: lambda: overlap(trainer, blocking, overlapped, args.steps),
             4: lambda: scaling(args, trainer, overlapped, args.steps)}
    for number in args.parts:
        report = parts[number]()
        if report:
            print(report, flush=True)


if __name__ == "__main__":
    main()
