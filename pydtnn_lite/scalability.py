"""Command line: ``python -m pydtnn_lite.scalability [--preset ampere] [--out DIR]``.

Reproduces the scalability study of the reference paper with the performance model:
the step of vgg16, resnet50 and densenet121 at CIFAR-10 and ImageNet shapes, split into
computation and communication, while the per-node batch, peak FLOP/s, memory bandwidth,
link bandwidth and cluster size are swept one at a time around the baseline cluster.
Writes ``scalability.csv`` and one PNG per data set.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from pydtnn_lite.cli import command_parser, parse_command_line
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.clusters import PRESETS
from pydtnn_lite.perfmodel.modelling.scalability import BASELINE_BATCH, SWEEPS, Point, study
from pydtnn_lite.textable import format_table

PROGRAM = "pydtnn_lite.scalability"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-scalability", __doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vgg16", "resnet50", "densenet121"])
    parser.add_argument("--datasets", nargs="+", default=["cifar10", "imagenet"])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ampere", help="baseline cluster")
    parser.add_argument("--out", default="scalability", help="output directory (default ./scalability)")
    return parser


def plot(points: list[Point], dataset: str, path: str) -> None:
    """Rows: swept parameters; columns: models; stacked computation and communication per point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p.model for p in points if p.dataset == dataset))
    figure, axes = plt.subplots(len(SWEEPS), len(models), figsize=(4.2 * len(models), 2.6 * len(SWEEPS)),
                                squeeze=False)
    for row, parameter in enumerate(SWEEPS):
        for column, model in enumerate(models):
            axis = axes[row][column]
            chosen = [p for p in points if (p.dataset, p.model, p.parameter) == (dataset, model, parameter)]
            labels = [f"{p.value:g}" for p in chosen]
            computation = [1e3 * p.computation for p in chosen]
            axis.bar(labels, computation, label="computation")
            axis.bar(labels, [1e3 * p.communication for p in chosen], bottom=computation, label="communication")
            axis.plot(labels, [1e3 * p.step_with_overlap for p in chosen], "k.-", label="step, overlapped")
            axis.set_xlabel(parameter.replace("_", " ") + ("" if parameter in ("batch", "nodes",
                                                                               "link_bandwidth_gbps") else " (x)"))
            axis.set_ylabel("ms per step")
            axis.tick_params(axis="x", labelsize=7)
            if row == 0:
                axis.set_title(f"{model}, {dataset}")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    try:
        points = study(args.models, args.datasets, PRESETS[args.preset])
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scalability.csv"), "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(asdict(points[0])) + ["step_without_overlap"])
            writer.writeheader()
            writer.writerows(dict(asdict(p), step_without_overlap=p.step_without_overlap) for p in points)
        for dataset in args.datasets:
            plot(points, dataset, os.path.join(args.out, f"scalability-{dataset}.png"))
    except (UserError, OSError) as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except ImportError:
        print(f"{PROGRAM}: error: the plots need matplotlib: pip install 'pydtnn_lite[plot]'", file=sys.stderr)
        return 2
    print(f"baseline {args.preset}: {PRESETS[args.preset].nodes} nodes, per-node batch {BASELINE_BATCH}")
    baseline = [p for p in points if p.parameter == "batch" and p.value == BASELINE_BATCH]
    print(format_table(("model", "dataset", "computation ms", "communication ms", "overlapped step ms"),
                       [(p.model, p.dataset, f"{1e3 * p.computation:.2f}", f"{1e3 * p.communication:.2f}",
                         f"{1e3 * p.step_with_overlap:.2f}") for p in baseline], align="<<>>>"))
    print(f"wrote {args.out}/scalability.csv and {len(args.datasets)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
