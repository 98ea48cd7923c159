"""Timing helpers shared by the benchmarks: a shared, noisy machine wants interleaved variants and medians."""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pydtnn_lite import kernels
from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator
from pydtnn_lite.data import open_dataset
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, LearningRateSchedule
from pydtnn_lite.runtime import keep_freed_memory
from pydtnn_lite.training import Trainer, TrainerSettings, build_trainer

Timings = Mapping[str, float]
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # the mpich wheel's, beside this Python


def timed(call: Callable[[], object]) -> float:
    """Wall seconds of one ``call()``."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def interleave(variants: Sequence[Callable[[], Timings]], rounds: int, warmup: int = 1,
               before: Callable[[], None] = lambda: None,
               combine: Callable[[Timings], Timings] = lambda timings: timings) -> dict[str, list[float]]:
    """Run every variant once per round and collect the named seconds each returns.

    The order rotates every round, so a slow spell of a shared machine hits all variants
    alike. ``before`` runs ahead of each call (a barrier, for collectives); ``combine``
    turns one call's figures into the recorded ones (e.g. the slowest rank's). The first
    ``warmup`` rounds warm caches and allocators and are not recorded.
    """
    samples: dict[str, list[float]] = {}
    for round_ in range(warmup + rounds):
        for offset in range(len(variants)):
            before()
            timings = combine(variants[(round_ + offset) % len(variants)]())
            if round_ >= warmup:
                for name, seconds in timings.items():
                    samples.setdefault(name, []).append(seconds)
    return samples


def slowest_rank(timings: Timings) -> Timings:
    """On MPI rank 0, each figure's maximum over the ranks (a collective ends with its slowest rank); elsewhere none."""
    from mpi4py import MPI

    gathered = MPI.COMM_WORLD.gather(dict(timings))
    if gathered is None:
        return {}
    return {name: max(ranks[name] for ranks in gathered if name in ranks) for name in gathered[0]}


def measure(variants: Sequence[Callable[[], Timings]], rounds: int) -> dict[str, list[float]]:
    """Every figure of ``variants`` over ``rounds`` interleaved rounds of an MPI job, a barrier before
    each call; the slowest rank's figures, on rank 0 only."""
    from mpi4py import MPI

    return interleave(variants, rounds, before=MPI.COMM_WORLD.Barrier, combine=slowest_rank)


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall seconds of ``repeats`` calls, after ``warmup`` untimed ones."""
    return statistics.median(interleave([lambda: {"call": timed(call)}], repeats, warmup)["call"])


def kernel_timed_step(name: str, trainer: Trainer, batch: Any,
                      replace: Callable[[str, Callable], Callable | None]) -> Callable[[], Timings]:
    """A variant for :func:`interleave`: one ``trainer`` step on ``batch``, timed as ``name``,
    and the part of it inside the kernel entries for which ``replace(entry, kernel)`` gives a
    function, as ``'{name} kernels'``: that function runs in the kernel's place, timed; the
    other entries run as they are."""
    inside = 0.0

    def timing(function: Callable) -> Callable:
        def timed_kernel(*args: Any, **kwargs: Any) -> Any:
            nonlocal inside
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                inside += time.perf_counter() - started
        return timed_kernel

    def instrumented(entry: str, kernel: Callable) -> Callable:
        replacement = replace(entry, kernel)
        return kernel if replacement is None else timing(replacement)

    def run() -> Timings:
        nonlocal inside
        inside = 0.0
        restore = kernels.instrument(instrumented)
        try:
            step = timed(lambda: trainer.train_step(batch))
        finally:
            restore()
        return {name: step, f"{name} kernels": inside}
    return run


def make_trainer(model: str, dataset: str, global_batch: int, comm: Communicator, bucket_mb: float = 4.0,
                 overlap: bool = True, device: str = "cpu", optimizer: str = "sgd",
                 arrange: Callable[[Network], Network] = lambda network: network,
                 clip_grad_norm: float | None = None) -> Trainer:
    """A trainer as the command line builds it (SGD or Adam, weights seeded 0, the gradient
    clipped to ``clip_grad_norm``), on ``comm``'s ranks; ``arrange`` may rearrange the
    unbuilt network first."""
    keep_freed_memory()
    data = open_dataset(dataset)
    network = arrange(create_model(model, data.input_shape, data.num_classes)).build(make_backend(device), seed=0)
    update = Adam(network) if optimizer == "adam" else SGD(network)
    return build_trainer(network, data, TrainerSettings(global_batch, clip_grad_norm=clip_grad_norm), comm=comm,
                         optimizer=update,
                         schedule=LearningRateSchedule(0.001), bucket_mb=bucket_mb, overlap=overlap)


def model_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the flags of a single-process model benchmark: model, data set, batch, BLAS threads."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads")
    return parser


def print_step_comparison(args: argparse.Namespace, samples: Mapping[str, Sequence[float]], baseline: str,
                          variant: str, kernels_label: str) -> None:
    """The medians of two interleaved variants' steps (``samples`` by variant name, and by
    name + " kernels" the kernels they differ in): each variant's step and kernels, then
    ``variant`` over ``baseline``."""
    median = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{args.model} on {args.dataset}, batch {args.batch_size}, {args.threads} threads "
          f"(medians of {args.steps} steps each, interleaved)")
    for name in (baseline, variant):
        print(f"{name}: step {median[name] * 1e3:.1f} ms, of which {kernels_label} "
              f"{median[name + ' kernels'] * 1e3:.1f} ms")
    print(f"{variant} against {baseline}: step {median[variant] / median[baseline]:.3f}x, "
          f"{kernels_label} {median[variant + ' kernels'] / median[baseline + ' kernels']:.3f}x")


@contextlib.contextmanager
def output_folder(keep: str | None, program: str) -> Iterator[str]:
    """Where a benchmark writes its traces: ``keep`` (``--keep DIR``), a new folder that
    stays (refused with one line where it exists), or a scratch folder deleted at the end."""
    if keep is None:
        with tempfile.TemporaryDirectory() as scratch:
            yield scratch
        return
    if os.path.exists(keep):
        raise SystemExit(f"{program}: --keep {keep} exists; name a new folder")
    os.makedirs(keep)
    yield os.path.abspath(keep)
