"""A trace directory against the prediction for the run it records: the validation, its report and summary.

A calibrated machine is first placed as the traced job's ranks were (its meta.json
records the ranks per node, the node's cores and the BLAS threads), then corrected for
how far the machine moved between the calibration's machine-state probe and the one the
run took when it started (``drift.py``). The raw error is the one before that correction.
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.drift import Drift, MachineState, ProbedWork
from pydtnn_lite.perfmodel.modelling.machines import (
    AdjustedMachine,
    CalibratedMachine,
    adjusted_machine,
    calibration_warnings,
)
from pydtnn_lite.perfmodel.modelling.placement import Placement
from pydtnn_lite.perfmodel.modelling.prediction import Machine, StepPrediction, predict_step
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels
from pydtnn_lite.perfmodel.modelling.report import summary_text, validation_figures, write_report
from pydtnn_lite.perfmodel.modelling.validation import Validation, validate
from pydtnn_lite.perfmodel.modelling.workload import build_workload

CALIBRATION_KEY = "calibration"  # meta.json: the calibration file the traced run was validated with
# Traced steps spanning less than this measure a moment of the machine (its cores slow down
# for seconds at a time: docs/performance-model.md) more than the model.
MIN_TRACED_SECONDS = 1.0


def trace_calibration(meta: dict) -> str:
    """The calibration file a trace's ``meta`` names; UserError when it names none."""
    path = meta.get(CALIBRATION_KEY)
    if not path:
        raise UserError("the trace's meta.json names no calibration to validate against: give --calibration FILE "
                        "(python -m pydtnn_lite.calibrate) or --preset NAME")
    return str(path)


def job_placement(meta: dict) -> Placement | None:
    """How the traced job's ranks sat, from its meta.json (None for traces that do not say)."""
    if "ranks_per_node" not in meta or "cores_per_node" not in meta:
        return None
    return Placement(int(meta["ranks"]), int(meta["ranks_per_node"]), int(meta["cores_per_node"]),
                     int(meta.get("blas_threads", 1)))


def kernel_probe_of(meta: dict) -> ProbedWork | None:
    """The traced run's kernel probe, the mean of its runs (as it started and ended; traces
    written before 2026-11-26 evening kept one run); None where it was not probed."""
    runs = meta.get("kernel_probes")
    if not runs:
        return None
    return ProbedWork.mean([ProbedWork.from_dict(run) for run in (runs if isinstance(runs, list) else [runs])])


def run_machines(machine: Machine, meta: dict) -> tuple[Machine, Machine]:
    """(raw, corrected): a calibrated ``machine`` placed as the traced job was, before and after
    the correction for the drift its machine-state probe measured; other machines as they are.
    A hierarchical run is predicted with the calibration's two-level reductions where it has them."""
    if not isinstance(machine, CalibratedMachine):
        return machine, machine
    placement = job_placement(meta)
    state = MachineState.from_dict(meta["machine_state"]) if meta.get("machine_state") else None
    probed = kernel_probe_of(meta)
    raw = adjusted_machine(machine, placement)
    corrected = adjusted_machine(machine, placement, state, probed, Processor.of(meta))
    if meta.get("strategy") == "hierarchical":  # the drift stays the flat model's
        # Traces written before the reductions were pipelined ran them after backward.
        two_level = machine.hierarchical(pipelined=bool(meta.get("reduces_during_backward", False)))
        raw, corrected = (dataclasses.replace(adjusted, base=two_level) for adjusted in (raw, corrected))
    return raw, corrected


def validation_of(trace: str, loaded: tuple[list, list, dict], machine: Machine) -> Validation:
    """The trace of directory ``trace`` (``loaded`` is what ``load_trace`` read there)
    against the prediction of ``machine`` for the same model, batch, ranks and settings."""
    return validations_of(trace, loaded, [machine])[0]


def validations_of(trace: str, loaded: tuple[list, list, dict], machines: Sequence[Machine]) -> list[Validation]:
    """:func:`validation_of` on each of ``machines``, the traced model built once."""
    records, steps, meta = loaded
    if not steps:
        raise UserError(f"{trace} holds no traced training step: lower --trace-skip or train more steps")
    network, optimizer = build_workload(meta["model"], meta["dataset"], meta.get("dtype", "float32"),
                                        meta.get("optimizer", "sgd"))
    procs, bucket_mb = int(meta["ranks"]), float(meta.get("bucket_mb", 4.0))
    accumulate = int(meta.get("accumulate", 1))  # a step's samples are its micro-batches' together
    clip = meta.get("clip_grad_norm") is not None
    dataset, overlap = meta["dataset"], bool(meta.get("overlap", True)) and accumulate == 1
    prefetch = int(meta.get("prefetch", 0)) > 0  # traces written before reading ahead existed read in the step

    def predictor(machine: Machine) -> Callable[[int], StepPrediction]:
        return lambda batch: predict_step(network, optimizer, batch // accumulate, procs, machine, bucket_mb,
                                          dataset=dataset, prefetch=prefetch, accumulate=accumulate, clip=clip,
                                          overlap=overlap)
    placement = job_placement(meta)
    time_shared = placement is not None and placement.oversubscribed
    return [validate(records, steps, overlap, predictor(machine), time_shared) for machine in machines]


@dataclass
class CheckedTrace:
    """A validated trace: what was validated on which machine, the validation, and the
    report's title and files."""

    trace: str
    meta: dict
    machine_name: str
    validation: Validation
    title: str
    paths: list[str]
    raw: Validation | None = None  # before the drift correction, where one was made
    drift: Drift | None = None
    traced_seconds: float = 0.0  # the span of the traced steps (the longest rank's)
    warnings: list[str] = field(default_factory=list)  # what the calibration lacks for the run (kernels, threads)

    def text(self) -> str:
        """The title, the step and stage table, the drift, and where the report went."""
        lines = [self.title, summary_text(self.validation)]
        if self.drift is not None and self.raw is not None:
            lines.append(f"drift since the calibration: {self.drift.describe()}; step error "
                         f"{100 * self.raw.step.relative_error:+.1f} % before this correction")
            if self.drift.moved:
                lines.append(f"warning: the probes measured a move of {100 * self.drift.measured:.0f} % since the "
                             "calibration (more than 10 %): calibrate again for figures that need no correction")
        lines += [f"warning: {line}" for line in self.warnings]
        if self.traced_seconds < MIN_TRACED_SECONDS:
            lines.append(f"warning: the traced steps span {self.traced_seconds:.2f} s, less than "
                         f"{MIN_TRACED_SECONDS:g} s: they measure a moment of the machine more than the model; "
                         "trace more steps (raise --steps-per-epoch)")
        return "\n".join(lines + ["wrote " + ", ".join(self.paths)])

    def summary(self) -> dict:
        """One JSON object: the run, the machine, :func:`validation_figures` and the report's files."""
        meta = self.meta
        return {"trace": self.trace, "model": meta["model"], "dataset": meta["dataset"],
                "global_batch": meta["global_batch"], "procs": int(meta["ranks"]),
                "overlap": bool(meta.get("overlap", True)), "machine": self.machine_name,
                "traced_seconds": self.traced_seconds,
                **validation_figures(self.validation, self.raw, self.drift), "warnings": self.warnings,
                "report": self.paths}


def check_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                out: str | None = None) -> CheckedTrace:
    """Validate the trace of directory ``trace`` (``loaded`` is what ``load_trace`` read
    there) on ``machine`` and write the report (to ``out``, default ``trace/validation``)."""
    meta = loaded[2]
    raw_machine, machine = run_machines(machine, meta)
    drift = machine.drift if isinstance(machine, AdjustedMachine) and meta.get("machine_state") else None
    raw: Validation | None = None
    if drift is None:
        validation = validation_of(trace, loaded, machine)
    else:
        raw, validation = validations_of(trace, loaded, [raw_machine, machine])
    title = f"{run_label(meta)}: measured against predicted ({machine_name})"
    paths = write_report(out or os.path.join(trace, "validation"), validation, title)
    spans: defaultdict[int, float] = defaultdict(float)
    for step in loaded[1]:
        spans[step.rank] += step.duration
    warnings = processor_warnings(machine, meta) + calibration_warnings(machine, validation.kernels,
                                                                          meta.get("dtype", "float32"))
    return CheckedTrace(trace, meta, machine_name, validation, title, paths, raw, drift, max(spans.values()), warnings)


def run_label(meta: dict) -> str:
    """What a traced run trained, from its ``meta``: "vgg11 on synthetic, global batch 64, 2 rank(s), cpu"."""
    return (f"{meta['model']} on {meta['dataset']}, global batch {meta['global_batch']}, {int(meta['ranks'])} "
            f"rank(s), {meta.get('device', '?')}")


def processor_warnings(machine: Machine, meta: dict) -> list[str]:
    """A line where the traced run's processor is not the one ``machine``'s calibration
    measured, by name or by vector unit (:class:`Processor`; none for a preset, or a trace or
    file that does not name its processor), and one where its BLAS ran other kernels
    (:func:`blas_kernels`). The drift probes time a few kernels and shapes; another
    processor or other GEMM kernels move the others by other factors, which no probe
    corrects."""
    calibration = machine.base.calibration if isinstance(machine, AdjustedMachine) else (
        machine.calibration if isinstance(machine, CalibratedMachine) else None)
    if calibration is None or meta.get("device", "cpu") != "cpu":
        return []
    ran_on, measured_on = Processor.of(meta), Processor.of(calibration.machine)
    warnings = []
    if ran_on.differs_from(measured_on):
        warnings.append(f"the run's processor ({ran_on}) is not the calibration's ({measured_on}): the drift "
                        "correction carries the calibration over only in part; calibrate on this processor for "
                        "figures that need none")
    ran_with, measured_with = blas_kernels(meta), blas_kernels(calibration.machine)
    if ran_with and measured_with and ran_with != measured_with:
        warnings.append(f"the run's BLAS ran {', '.join(sorted(ran_with))} kernels, the calibration's "
                        f"{', '.join(sorted(measured_with))}: its GEMMs are predicted at another machine's speed; "
                        "calibrate with the run's OPENBLAS_CORETYPE")
    return warnings


def validate_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                   out: str | None = None) -> str:
    """:func:`check_trace`, and its text summary."""
    return check_trace(trace, loaded, machine, machine_name, out).text()
