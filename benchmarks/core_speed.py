"""How each core's speed moves over time, with every core busy: the machine-state probe, repeated.

    python benchmarks/core_speed.py [--seconds 90] [--repeats 3]

Runs the machine-state probe's core measurement (``measuring/machine_state.py``: a
one-thread GEMM on every core at once, then a copy on every core at once) back to back
for ``--seconds``, and prints each instant's per-core GEMM rate. It ends with, per core,
the median rate, the share of instants more than 15 % below it and the longest such
spell; and for the machine, the share of instants in which at least one core was slow,
which is how often a synchronous step waits for a slow core. The baseline is each
core's own median, measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

from pydtnn_lite.perfmodel.measuring.machine_state import core_rates
from pydtnn_lite.runtime import usable_cores
from pydtnn_lite.textable import format_table

SLOW = 0.85  # an instant below this fraction of the core's median is a slow spell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to watch")
    parser.add_argument("--repeats", type=int, default=3, help="timed GEMMs and copies per instant (as between steps)")
    args = parser.parse_args()
    cores = usable_cores()
    started = time.perf_counter()
    instants: list[tuple[float, list[float]]] = []
    while time.perf_counter() - started < args.seconds:
        at = time.perf_counter() - started
        rates = [gemm for gemm, _, _, _ in core_rates(cores, args.repeats)]
        instants.append((at, rates))
        print(f"{at:6.1f} s  " + "  ".join(f"core {c}: {rate / 1e9:6.1f}" for c, rate in enumerate(rates)) +
              " GFLOP/s", flush=True)
    rows, slow_any = [], [False] * len(instants)
    for core in range(cores):
        rates = [rates[core] for _, rates in instants]
        median = statistics.median(rates)
        slow = [rate < SLOW * median for rate in rates]
        slow_any = [a or b for a, b in zip(slow_any, slow, strict=True)]
        rows.append([core, f"{median / 1e9:.1f}", f"{100 * sum(slow) / len(slow):.0f}",
                     f"{longest(instants, slow):.1f}"])
    print()
    print(format_table(["core", "median GFLOP/s", f"% of instants < {SLOW:.0%} of median", "longest slow spell s"],
                       rows))
    print(f"{len(instants)} instants over {args.seconds:g} s; at least one core slow in "
          f"{100 * sum(slow_any) / len(slow_any):.0f} % of them")


def longest(instants: list[tuple[float, list[float]]], slow: list[bool]) -> float:
    """The longest run of consecutive slow instants, in seconds from its first to the next instant."""
    best, begun = 0.0, None
    times = [at for at, _ in instants] + [instants[-1][0]]
    for index, is_slow in enumerate(slow + [False]):
        if is_slow and begun is None:
            begun = times[index]
        elif not is_slow and begun is not None:
            best, begun = max(best, times[index] - begun), None
    return best


if __name__ == "__main__":
    main()
