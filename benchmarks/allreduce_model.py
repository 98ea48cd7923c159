"""The calibrated Allreduce models against fresh measurements, in and out of sample.

    mpiexec -n 2 python benchmarks/allreduce_model.py [--calibration calibration/dev-2core.json] [--min-mib 1]

Times an in-place Allreduce with the calibration's own routine (``time_allreduce``:
float32 buffers, interleaved rounds, median of the calls) at every size from ``--min-mib``
up that the calibration sampled ("in"), and between them ("out"): the geometric middle
of each two neighbouring samples, where an interpolation is at its worst, and 1.5, 6, 24
and 96 MiB. It prints the predictions of both Allreduce models (``interpolate``, ``fit``)
of the calibration file, with their errors, and the errors of the same models built from
this run's own "in" times instead of the file's:

- "in" against the file: how far the machine's times moved since the calibration;
- "out" against the file: that, plus the model's error between samples;
- "out" against this run: the model's error between samples alone.
"""
from __future__ import annotations

import argparse
import itertools
import math

import numpy as np

from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.perfmodel.measuring.allreduce_timing import KIB, MIB, time_allreduce
from pydtnn_lite.perfmodel.modelling.allreduce import AllreduceTime
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.machines import allreduce_models
from pydtnn_lite.runtime import keep_freed_memory
from pydtnn_lite.textable import format_table

EARLIER_SIZES = [3 * MIB // 2 << k for k in range(0, 7, 2)]  # 1.5, 6, 24, 96 MiB: the first version's sizes


def benchmark_sizes(sampled: list[int], min_bytes: int) -> dict[int, str]:
    """Sizes to time from ``min_bytes`` up, each marked "in" (a sampled size) or "out"."""
    sampled = [n for n in sorted(sampled) if n >= min_bytes]
    middles = [int(round(math.sqrt(a * b) / KIB)) * KIB for a, b in itertools.pairwise(sampled)]
    sizes = {n: "out" for n in middles + [n for n in EARLIER_SIZES if sampled and min_bytes <= n <= sampled[-1]]}
    sizes.update({n: "in" for n in sampled})
    return dict(sorted(sizes.items()))


def errors(model: AllreduceTime, procs: int, sizes: dict[int, str], measured: list[float]) -> dict[str, np.ndarray]:
    """(predicted - measured) / measured per size, grouped "in" and "out" of sample."""
    out: dict[str, list[float]] = {"in": [], "out": []}
    for (nbytes, kind), seconds in zip(sizes.items(), measured, strict=True):
        out[kind].append(model.seconds(nbytes, procs) / seconds - 1)
    return {kind: np.array(values) for kind, values in out.items()}


def summary(errors_by_kind: dict[str, np.ndarray], kinds: tuple[str, ...]) -> str:
    return "; ".join(f"{kind}: |error| mean {np.mean(np.abs(errors_by_kind[kind])):.1%}, "
                     f"max {np.max(np.abs(errors_by_kind[kind])):.1%}" for kind in kinds if errors_by_kind[kind].size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", default="calibration/dev-2core.json")
    parser.add_argument("--min-mib", type=float, default=1.0, help="smallest message, MiB")
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer and the calibration do: MPICH's large reductions run 2x faster with it
    world = MPICommunicator()
    procs = world.size
    samples = Calibration.load(args.calibration).allreduce_samples
    sizes = benchmark_sizes([int(n) for p, n, _ in samples if p == procs], int(args.min_mib * MIB))
    measured = time_allreduce(world, list(sizes))
    if world.rank != 0:
        return
    models = allreduce_models(samples)
    fresh = {(procs, float(n)): t for (n, kind), t in zip(sizes.items(), measured, strict=True) if kind == "in"}
    this_run = allreduce_models([(p, n, fresh.get((p, n), t)) for p, n, t in samples])
    print(f"{procs} ranks, {args.calibration}: fit {models['fit'].algorithm} with thresholds "
          f"{[int(t) for t in models['fit'].thresholds]} bytes")
    headers = ["bytes", "sample", "measured us"]
    for name in models:
        headers += [name, "error"]
    rows = []
    for (nbytes, kind), seconds in zip(sizes.items(), measured, strict=True):
        row = [nbytes, kind, f"{seconds * 1e6:.1f}"]
        for model in models.values():
            predicted = model.seconds(nbytes, procs)
            row += [f"{predicted * 1e6:.1f}", f"{predicted / seconds - 1:+.1%}"]
        rows.append(row)
    print(format_table(headers, rows, align=">" * len(headers)))
    for name in models:
        print(f"{name}, the file's samples: {summary(errors(models[name], procs, sizes, measured), ('in', 'out'))}")
        print(f"{name}, this run's samples: {summary(errors(this_run[name], procs, sizes, measured), ('out',))}")


if __name__ == "__main__":
    main()
