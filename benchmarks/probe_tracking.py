"""Whether the drift probes follow a network's own kernels on this machine, round after round.

    mpiexec -n 2 python benchmarks/probe_tracking.py --model vgg11 --batch-size 32 --rounds 8

The drift correction (docs/performance-model.md, "A machine that moves: drift") scales a
calibration's kernels by how far the machine-state probes moved since. That holds where
a network's kernels move as the probes do. Each round, every rank at once runs what a
traced run and a calibration run: the every-core probe (a one-thread GEMM and a copy on
every core), the kernel probe's small networks, and the network sampled whole as
``calibrate --models`` samples it (its kernels' medians over its steps, summed). It
prints each round's figures as times (a rate's inverse, relative to the first round's),
then, for each probe, the least-squares slope and the correlation of the logarithm of
the network's kernel time on the logarithm of the probe's over the rounds. A probe the
network follows has a slope near 1 and a correlation near 1; where the probes stand
still while the network moves, no correction can follow it. Two more figures separate
the instant from the trend: the correlation of the two over means of ``--window``
consecutive rounds (a machine's slow spells last minutes; a probe may follow them and
still miss the network's moves from one second to the next), and what correcting by the
probe leaves: the spread of log(network / probe) over the network's own spread (below
1, dividing the network's time by the probe's steadies it; above 1, the correction adds
the probe's noise). The baseline is the first round after an untimed warm-up round,
measured in the same run.

Each round also trains the network as a job does, its gradients summed by the trainer's
bucketed Allreduce overlapped with backward (``measure_probe(reduced=True)``), and the
last lines set its kernels against the calibration's sampling of the same round, in all
and kernel by kernel: a median near x1 says the calibration samples the network as
training runs it, so that what a prediction misses on this machine is the machine's
move, not the method. The sampling evicts the caches before each sampled update, the
job does not: a kernel well below x1 there is one a step leaves in the cache.
"""
from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.costs import GEMM
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.measuring.kernel_probe import probe_kernels
from pydtnn_lite.perfmodel.measuring.machine_state import probe_cores
from pydtnn_lite.perfmodel.measuring.probes import job_probes
from pydtnn_lite.perfmodel.measuring.sampling import measure_probe
from pydtnn_lite.runtime import keep_freed_memory, set_blas_threads
from pydtnn_lite.textable import format_table

# Each round's figures, as times (seconds, or a rate's inverse): what a probe says of the machine.
COLUMNS = ("core GEMM", "core copy", "kernel probe", "kernel probe GEMMs", "network GEMMs", "network kernels")
PROBES = COLUMNS[:4]
NETWORK = "network kernels"
TRAINED = "network kernels, trained"  # the same network, its gradients reduced as in a training job


def log_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, correlation) of the least-squares line of log(ys) on log(xs); (nan, nan)
    where xs do not vary."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    syy = sum((y - my) ** 2 for y in ly)
    sxy = sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True))
    if sxx == 0:
        return math.nan, math.nan
    return sxy / sxx, (sxy / math.sqrt(sxx * syy) if syy > 0 else math.nan)


def window_means(values: Sequence[float], window: int) -> list[float]:
    """The geometric means of every ``window`` consecutive ``values`` (a moving window)."""
    logs = [math.log(value) for value in values]
    return [math.exp(statistics.fmean(logs[start:start + window])) for start in range(len(logs) - window + 1)]


def spread_left(probe: Sequence[float], network: Sequence[float]) -> float:
    """The standard deviation of log(network / probe) over that of log(network): what is
    left of the network's spread once each round is corrected by the probe's move (nan
    where the network did not move)."""
    own = statistics.pstdev([math.log(y) for y in network])
    corrected = statistics.pstdev([math.log(y / x) for x, y in zip(probe, network, strict=True)])
    return corrected / own if own > 0 else math.nan


class Round(NamedTuple):
    """One round: each column's time, and the network's seconds a step by kernel name,
    sampled as calibrating does and trained as a job."""

    figures: dict[str, float]
    sampled: dict[str, float]
    trained: dict[str, float]


def one_round(comm: MPICommunicator, model: str, batch: int, dataset: str) -> Round:
    """One round of the probes and the network's sample (collective)."""
    backend = make_backend("cpu")
    cores = probe_cores(comm)
    gemm_pace, copy_pace = cores.pace()
    probed = probe_kernels(comm)
    [network] = job_probes([(model, batch, dataset)])
    sampled = measure_probe(network, backend, comm, 3, CacheEvictor(backend), min_seconds=1.0).kernel_seconds()
    trained = measure_probe(network, backend, comm, 3, CacheEvictor(backend), min_seconds=1.0,
                            reduced=True).kernel_seconds()
    return Round({"core GEMM": 1.0 / gemm_pace, "core copy": 1.0 / copy_pace,
                  "kernel probe": sum(s.seconds for calls in probed.calls.values() for s in calls),
                  "kernel probe GEMMs": sum(s.seconds for s in probed.calls.get(GEMM, [])),
                  "network GEMMs": sampled.get(GEMM, 0.0), NETWORK: sum(sampled.values()),
                  TRAINED: sum(trained.values())}, sampled, trained)


def kernel_rows(rounds: Sequence[Round]) -> list[list[str]]:
    """Per kernel, largest share first: its share of the sampled network's time (over all
    rounds), and its time trained over sampled in the same round, median and range."""
    sampled = defaultdict(float)
    for one in rounds:
        for name, seconds in one.sampled.items():
            sampled[name] += seconds
    total = sum(sampled.values())
    rows = []
    for name in sorted(sampled, key=lambda name: -sampled[name]):
        ratios = sorted(one.trained[name] / one.sampled[name] for one in rounds
                        if one.sampled.get(name, 0.0) > 0 and name in one.trained)
        if ratios:
            rows.append([name, f"{100 * sampled[name] / total:.1f}", f"{statistics.median(ratios):.3f}",
                         f"{ratios[0]:.3f}", f"{ratios[-1]:.3f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg11", help="zoo network sampled whole")
    parser.add_argument("--batch-size", type=int, default=32, help="its batch per rank")
    parser.add_argument("--dataset", default="synthetic", help="its input shapes' data set (a generated one)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of the probes and the network")
    parser.add_argument("--window", type=int, default=5,
                        help="rounds per mean for the trend's correlation (at most --rounds)")
    args = parser.parse_args()
    if args.rounds < 2 or not 1 <= args.window <= args.rounds:
        parser.error(f"--rounds {args.rounds} --window {args.window}: take 2 rounds or more and a window of 1 "
                     "to --rounds rounds")
    set_blas_threads(1)  # as a calibration's ranks, one per core
    keep_freed_memory()  # as calibrate and train: the step's large temporaries reused, not mapped afresh
    comm = MPICommunicator()
    one_round(comm, args.model, args.batch_size, args.dataset)  # warm-up: first calls, compiled loops, page faults
    measured: list[Round] = []
    for index in range(args.rounds):
        measured.append(one_round(comm, args.model, args.batch_size, args.dataset))
        if comm.rank == 0:
            first, last = measured[0].figures, measured[-1].figures
            print(f"round {index + 1}: " + ", ".join(f"{name} x{last[name] / first[name]:.3f}" for name in COLUMNS) +
                  f" (network kernels {1e3 * last[NETWORK]:.1f} ms sampled, {1e3 * last[TRAINED]:.1f} ms trained)",
                  flush=True)
    if comm.rank != 0:
        return
    rounds = [one.figures for one in measured]
    rows = []
    network = [r[NETWORK] for r in rounds]
    for probe in PROBES:
        times = [r[probe] for r in rounds]
        slope, correlation = log_fit(times, network)
        _, trend = log_fit(window_means(times, args.window), window_means(network, args.window))
        rows.append([probe, f"{max(times) / min(times):.3f}", f"{slope:.2f}", f"{correlation:.2f}",
                     f"{trend:.2f}", f"{spread_left(times, network):.2f}"])
    network_spread = max(network) / min(network)
    print()
    print(f"{args.model} b{args.batch_size} on {comm.size} rank(s), {args.rounds} rounds: its kernels moved "
          f"x{network_spread:.3f} (slowest round over fastest)")
    print(format_table(["probe", "moved (slowest / fastest)", "slope of the network on it", "correlation",
                        f"correlation over {args.window}-round means", "spread left corrected by it"], rows))
    trained_over_sampled = sorted(r[TRAINED] / r[NETWORK] for r in rounds)
    print(f"trained as a job over sampled as calibrating does, the same round: median "
          f"x{statistics.median(trained_over_sampled):.3f} (x{trained_over_sampled[0]:.3f} to "
          f"x{trained_over_sampled[-1]:.3f}); by kernel:")
    print(format_table(["kernel", "% of the network's time", "trained / sampled, median", "lowest", "highest"],
                       kernel_rows(measured)))


if __name__ == "__main__":
    main()
