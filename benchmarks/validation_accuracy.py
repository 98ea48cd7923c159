"""How close the performance model comes to training steps, against how close the steps come to each other.

    python benchmarks/validation_accuracy.py --calibration calibration/dev-2core.json [OTHER.json ...] \\
        [--runs 3] [--ranks 2 4 8] [--steps 8] [--min-seconds 1] [--configs vgg11:64 vgg11:128 resnet18:48] \\
        [--no-overlap] [--matrix] [--plot FILE.png] [--keep DIR]
    python benchmarks/validation_accuracy.py --calibration NEWER.json [...] --traces DIR

Each round trains every configuration (``model:global batch[:data set]``, on each of
``--ranks``; ``--matrix``: the zoo at two batch sizes) once under ``mpiexec -n RANKS``
with ``--trace``, the order rotating from round to round so that a slow spell of the
shared machine hits all of them alike, and validates every trace against the
calibration, placed as the run's ranks were and corrected for the drift its
machine-state probe measured (the step error before that correction is printed too).
Given several calibration files, it validates the same runs against each in turn.
A run traces ``--steps`` steps, or more where the calibration predicts that they take
less than ``--min-seconds``: a small model's 20 ms steps would otherwise measure one
slow spell of a core rather than the model.
Per configuration it prints:

- model: the step error, stage WRE (FP, BP, WU) and COMM error of each run against the
  prediction, as ``python -m pydtnn_lite.validate`` reports them, and their median;
- between runs: the same figures with one run's measurement standing in for the
  prediction of another (every ordered pair of runs): how far the machine repeats a
  measurement from one minute to the next, the lowest error a prediction made in advance
  can expect here; and the split-half figures within the runs (median over runs);
- model / between runs: the ratio of the two medians, the baseline measured in the same
  session.

It ends with one line per configuration (the matrix), and with ``--plot`` draws the
step error of every configuration beside the between-run difference. ``--keep DIR`` keeps
the traces there (one folder per run) for ``python -m pydtnn_lite.trace summarize`` and
``python -m pydtnn_lite.validate``; otherwise they are deleted at the end. ``--traces DIR``
trains nothing: it validates the runs kept in DIR against the calibrations given, which
is how runs of one day are set against a calibration of another. Each calibration's
header says how many hours before (or after) the runs it was measured.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pydtnn_lite.costs import COMPUTE_STAGES
from pydtnn_lite.perfmodel.measuring.host import this_blas_kernels, this_processor
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.perfmodel.modelling.machines import CalibratedMachine, adjusted_machine, calibrated_machine
from pydtnn_lite.perfmodel.modelling.placement import Placement
from pydtnn_lite.perfmodel.modelling.prediction import predict_step
from pydtnn_lite.perfmodel.modelling.repeatability import comparison_table, model_and_floor
from pydtnn_lite.perfmodel.modelling.trace_validation import run_machines, validations_of
from pydtnn_lite.perfmodel.modelling.validation import Validation
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.textable import format_table
from pydtnn_lite.tracing import load_trace
from pydtnn_lite.tracing.records import META_FILE, read_meta

from common import MPIEXEC, output_folder

# The zoo at a small and a large batch for CIFAR-sized images; the large models at smaller
# batches, so that every configuration trains a step in seconds on 2 cores.
MATRIX = ("vgg11:32", "vgg11:64", "vgg16:16", "vgg16:32", "alexnet:32", "alexnet:96", "resnet18:16", "resnet18:48",
          "resnet50:8", "resnet50:16", "densenet121:8", "densenet121:16", "lenet:64", "lenet:256", "mlp:64",
          "mlp:256")


@dataclass(frozen=True)
class Config:
    model: str
    batch: int
    dataset: str
    ranks: int = 2

    @classmethod
    def parse(cls, text: str, ranks: int) -> Config:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise SystemExit(f"validation_accuracy: --configs takes model:batch[:dataset], got {text!r}")
        return cls(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else "synthetic", ranks)

    @classmethod
    def of_trace(cls, meta: dict) -> Config:
        """The configuration a kept run trained, from its trace's meta."""
        return cls(meta["model"], int(meta["global_batch"]), meta["dataset"], int(meta["ranks"]))

    def __str__(self) -> str:
        return f"{self.model}, global batch {self.batch}, {self.dataset}, {self.ranks} ranks"


def steps_to_trace(config: Config, machine: CalibratedMachine, steps: int, min_seconds: float) -> int:
    """``steps``, or as many as the calibration predicts to take ``min_seconds`` on the
    configuration's ranks, all on this node."""
    network, optimizer = build_workload(config.model, config.dataset)
    placement = Placement(config.ranks, config.ranks, machine.calibration.placement.cores_per_node)
    step = predict_step(network, optimizer, max(1, config.batch // config.ranks), config.ranks,
                        adjusted_machine(machine, placement), dataset=config.dataset, prefetch=True).step_with_overlap
    return max(steps, math.ceil(min_seconds / step))


def traced_run(config: Config, steps: int, overlap: bool, trace: str) -> None:
    """Train ``config`` for one warm-up step and ``steps`` traced steps into ``trace``."""
    command = [MPIEXEC, "-n", str(config.ranks), sys.executable, "-m", "pydtnn_lite.train", "--model", config.model,
               "--dataset", config.dataset, "--batch-size", str(config.batch), "--epochs", "1",
               "--steps-per-epoch", str(steps + 1), "--eval-steps", "0", "--no-progress", "--trace", trace,
               "--run-dir", os.path.join(trace, "run")] + ([] if overlap else ["--no-overlap"])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"validation_accuracy: training {config} failed:\n{result.stderr[-2000:]}")


def median_step_error(validations: list[Validation]) -> float:
    """The signed step error of a configuration: the median over its runs."""
    return statistics.median(v.step.relative_error for v in validations)


def report(config: Config, traced: int, validations: list[Validation], raw: list[Validation]) -> str:
    steps = ", ".join(f"{1e3 * v.step.measured:.1f}" for v in validations)
    before = ", ".join(f"{100 * v.step.relative_error:+.1f}" for v in raw)
    return "\n".join([f"{config}, {traced} steps traced: measured steps {steps} ms; "
                      f"predicted {1e3 * validations[0].step.predicted:.1f} ms; "
                      f"step error before the drift correction {before} %",
                      *("  " + line for line in comparison_table(validations).split("\n"))])


def matrix_row(config: Config, validations: list[Validation], raw: list[Validation]) -> tuple:
    """One line of the matrix: medians over the runs, and the between-run medians beside them."""
    model, floor = model_and_floor(validations)
    signed, signed_raw = median_step_error(validations), median_step_error(raw)
    measured = statistics.median(v.step.measured for v in validations)
    return (config.model, config.batch, config.ranks, f"{1e3 * measured:.1f}",
            f"{1e3 * validations[0].step.predicted:.1f}", f"{100 * signed:+.1f}", f"{100 * signed_raw:+.1f}",
            f"{100 * floor['step error']:.1f}",
            *(f"{100 * model[f'WRE {s}']:.1f} / {100 * floor[f'WRE {s}']:.1f}" for s in COMPUTE_STAGES))


def summary(configs: list[Config], validations: dict[Config, list[Validation]]) -> str:
    """The median and the largest of the configurations' step errors (each their runs' median),
    the largest of any single run (a median of two runs hides one far off), and how many
    stage WREs stay within 1.5x the between-run WRE of the same configuration."""
    errors = {config: median_step_error(validations[config]) for config in configs}
    largest = max(configs, key=lambda config: abs(errors[config]))
    runs = [(config, v.step.relative_error) for config in configs for v in validations[config]]
    worst_config, worst = max(runs, key=lambda run: abs(run[1]))
    within = cells = 0
    for config in configs:
        model, floor = model_and_floor(validations[config])
        for stage in COMPUTE_STAGES:
            cells += 1
            within += model[f"WRE {stage}"] <= 1.5 * floor[f"WRE {stage}"]
    return (f"median |step error| {100 * statistics.median(abs(e) for e in errors.values()):.1f} %, largest "
            f"{100 * errors[largest]:+.1f} % ({label(largest)}); of a single run {100 * worst:+.1f} % "
            f"({label(worst_config)}); stage WRE within 1.5x the between-run WRE in {within} of {cells}")


def label(config: Config) -> str:
    """A configuration as the summary names it: model, batch and ranks (``vgg11 b64 x8``)."""
    return f"{config.model} b{config.batch} x{config.ranks}"


MATRIX_HEADER = ("model", "batch", "ranks", "measured ms", "predicted ms", "step error %", "before drift %",
                 "between runs %", "WRE FP % (model / between)", "WRE BP %", "WRE WU %")


def plot(rows: list[tuple], path: str) -> None:
    """The step error of every configuration beside the between-run difference, as a bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r[0]} b{r[1]} x{r[2]}" for r in rows]
    errors = [abs(float(r[5])) for r in rows]
    floors = [float(r[7]) for r in rows]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.45 * len(rows)), 4.0))
    positions = range(len(rows))
    axes.bar([p - 0.2 for p in positions], errors, width=0.4, label="|step error|, model")
    axes.bar([p + 0.2 for p in positions], floors, width=0.4, label="between runs")
    axes.axhline(10, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(list(positions), labels, rotation=70, ha="right", fontsize=7)
    axes.set_ylabel("% of the measured step")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


@dataclass
class Validated:
    """The runs set against one calibration: per configuration, their validations after and
    before the drift correction and the steps each traced; and when the runs ran."""

    corrected: dict[Config, list[Validation]] = field(default_factory=dict)
    raw: dict[Config, list[Validation]] = field(default_factory=dict)
    traced_steps: dict[Config, int] = field(default_factory=dict)
    run_dates: list[datetime] = field(default_factory=list)


def validate_runs(runs: Sequence[tuple[Config, str]], machines: Sequence[CalibratedMachine]) -> list[Validated]:
    """Every run (configuration, trace folder) against each of ``machines``, placed as the
    run's ranks were, with and without the correction for the drift its probes measured."""
    validated = [Validated() for _ in machines]
    for config, trace in runs:
        loaded = load_trace(trace)
        traced = len({step.step for step in loaded[1]})
        date = datetime.fromisoformat(loaded[2]["date"]).replace(tzinfo=timezone.utc)
        for machine, results in zip(machines, validated, strict=True):
            before, corrected = run_machines(machine, loaded[2])
            validation_before, validation = validations_of(trace, loaded, [before, corrected])
            results.corrected.setdefault(config, []).append(validation)
            results.raw.setdefault(config, []).append(validation_before)
            results.traced_steps.setdefault(config, traced)
            results.run_dates.append(date)
    return validated


def kept_runs(folder: str) -> list[tuple[Config, str]]:
    """The runs an earlier ``--keep DIR`` left in ``folder``, in the order they ran."""
    if not os.path.isdir(folder):
        raise SystemExit(f"validation_accuracy: --traces {folder} is not a folder; name one that --keep DIR wrote")
    runs = []
    for entry in os.listdir(folder):
        trace = os.path.join(folder, entry)
        if os.path.isfile(os.path.join(trace, META_FILE)):
            meta = read_meta(trace)
            runs.append((meta["date"], entry, Config.of_trace(meta)))
    if not runs:
        raise SystemExit(f"validation_accuracy: --traces {folder} holds no traced run; write some with --keep DIR")
    return [(config, os.path.join(folder, entry)) for _, entry, config in sorted(runs)]


def calibration_age(machine: CalibratedMachine, run_dates: Sequence[datetime]) -> str:
    """When ``machine`` was calibrated, and how many hours before (or after) the runs."""
    measured = machine.calibration.machine.get("date")
    if not measured:
        return "calibrated on a date it does not record"
    calibrated = datetime.fromisoformat(measured)
    hours = [(date - calibrated).total_seconds() / 3600 for date in run_dates]
    when = f"calibrated {calibrated:%Y-%m-%d %H:%M}"
    if min(hours) >= 0:
        return f"{when}, {min(hours):.1f} to {max(hours):.1f} h before the runs"
    if max(hours) <= 0:
        return f"{when}, {-max(hours):.1f} to {-min(hours):.1f} h after the runs"
    return f"{when}, while the runs were traced"


def print_results(path: str, machine: CalibratedMachine, validated: Validated, header: str,
                  plot_to: str | None) -> None:
    """Every configuration's report, then the matrix and its summary, against one calibration."""
    configs = list(validated.corrected)
    print(f"{header}, calibration {path} ({calibration_age(machine, validated.run_dates)}); load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    for config in configs:
        print(report(config, validated.traced_steps[config], validated.corrected[config], validated.raw[config]))
    rows = [matrix_row(config, validated.corrected[config], validated.raw[config]) for config in configs]
    print(f"\nMatrix against {path} (medians over the runs; WRE: the model's / between runs')")
    print(format_table(MATRIX_HEADER, rows))
    print(summary(configs, validated.corrected))
    if plot_to:
        plot(rows, plot_to)
        print(f"wrote {plot_to}")


# What shapes the runs trained now: --traces trains none.
TRAINING_FLAGS = ("configs", "runs", "ranks", "matrix", "steps", "min_seconds", "no_overlap", "keep")


@contextmanager
def runs_to_validate(args: argparse.Namespace, machine: CalibratedMachine) -> Iterator[tuple[list, str]]:
    """The runs (configuration, trace folder) and a line that says what they are: those kept
    in ``--traces``, or new ones traced now, in the order of the configurations (their traces
    deleted on leaving, unless ``--keep``)."""
    if args.traces:
        yield kept_runs(args.traces), f"runs kept in {args.traces}"
        return
    configs = [Config.parse(text, ranks) for text in (MATRIX if args.matrix else args.configs) for ranks in args.ranks]
    steps = {config: steps_to_trace(config, machine, args.steps, args.min_seconds) for config in configs}
    with output_folder(args.keep, "validation_accuracy") as traces:
        runs = []
        for round_ in range(args.runs):
            for offset in range(len(configs)):
                config = configs[(round_ + offset) % len(configs)]
                trace = os.path.join(traces, f"{config.model}-{config.batch}-{config.ranks}-{round_}")
                traced_run(config, steps[config], not args.no_overlap, trace)
                runs.append((config, trace))
        runs.sort(key=lambda run: configs.index(run[0]))
        yield runs, (f"ranks {', '.join(map(str, args.ranks))}; at least {args.steps} traced steps and "
                     f"{args.min_seconds:g} s (predicted) per run, {args.runs} runs each, "
                     f"overlap {'off' if args.no_overlap else 'on'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", required=True, nargs="+",
                        help="calibration files (a folder: its file of this processor): each validates the same "
                             "runs (the first sets the steps traced)")
    parser.add_argument("--configs", nargs="+", default=["vgg11:64", "vgg11:128", "resnet18:48"])
    parser.add_argument("--runs", type=int, default=3, help="rounds over the configurations (at least 2)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2], help="rank counts to run each configuration on")
    parser.add_argument("--matrix", action="store_true", help="the zoo at two batch sizes (instead of --configs)")
    parser.add_argument("--plot", default=None, metavar="FILE", help="draw the matrix's step errors into FILE (PNG)")
    parser.add_argument("--steps", type=int, default=8, help="traced steps per run, after one warm-up step")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="trace more steps where --steps would take less than this (predicted)")
    parser.add_argument("--no-overlap", action="store_true", help="reduce gradients after backward")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the traces in DIR (a new folder)")
    parser.add_argument("--traces", default=None, metavar="DIR",
                        help="train nothing: validate the runs that an earlier --keep DIR kept there")
    args = parser.parse_args()
    ignored = [f"--{name.replace('_', '-')}" for name in TRAINING_FLAGS
               if getattr(args, name) != parser.get_default(name)]
    if args.traces and ignored:
        raise SystemExit(f"validation_accuracy: --traces trains nothing, so {', '.join(ignored)} would be ignored: "
                         "leave them out, or drop --traces to train new runs")
    if args.runs < 2:
        raise SystemExit("validation_accuracy: --runs must be at least 2 (the floor compares runs)")
    paths = [calibration_file(path, this_processor(), blas=this_blas_kernels()) for path in args.calibration]
    machines = [calibrated_machine(path) for path in paths]
    with runs_to_validate(args, machines[0]) as (runs, header):
        validated = validate_runs(runs, machines)
    for index, (path, machine) in enumerate(zip(paths, machines, strict=True)):
        print_results(path, machine, validated[index], header, args.plot if index == 0 else None)


if __name__ == "__main__":
    main()
