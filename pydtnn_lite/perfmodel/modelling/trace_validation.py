"""A trace directory against the prediction for the run it records: the validation, its report and summary."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.prediction import Machine, predict_step
from pydtnn_lite.perfmodel.modelling.report import summary_text, validation_figures, write_report
from pydtnn_lite.perfmodel.modelling.validation import Validation, validate
from pydtnn_lite.perfmodel.modelling.workload import build_workload

CALIBRATION_KEY = "calibration"  # meta.json: the calibration file the traced run was validated with


def trace_calibration(meta: dict) -> str:
    """The calibration file a trace's ``meta`` names; UserError when it names none."""
    path = meta.get(CALIBRATION_KEY)
    if not path:
        raise UserError("the trace's meta.json names no calibration to validate against: give --calibration FILE "
                        "(python -m pydtnn_lite.calibrate) or --preset NAME")
    return str(path)


def validation_of(trace: str, loaded: tuple[list, list, dict], machine: Machine) -> Validation:
    """The trace of directory ``trace`` (``loaded`` is what ``load_trace`` read there)
    against the prediction of ``machine`` for the same model, batch, ranks and settings."""
    records, steps, meta = loaded
    if not steps:
        raise UserError(f"{trace} holds no traced training step: lower --trace-skip or train more steps")
    network, optimizer = build_workload(meta["model"], meta["dataset"], meta.get("dtype", "float32"),
                                        meta.get("optimizer", "sgd"))
    procs, bucket_mb = int(meta["ranks"]), float(meta.get("bucket_mb", 4.0))
    return validate(records, steps, bool(meta.get("overlap", True)),
                    lambda batch: predict_step(network, optimizer, batch, procs, machine, bucket_mb))


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

    def text(self) -> str:
        """The title, the step and stage table, and where the report went."""
        return "\n".join([self.title, summary_text(self.validation), "wrote " + ", ".join(self.paths)])

    def summary(self) -> dict:
        """One JSON object: the run, the machine, :func:`validation_figures` and the report's files."""
        meta = self.meta
        return {"trace": self.trace, "model": meta["model"], "dataset": meta["dataset"],
                "global_batch": meta["global_batch"], "procs": int(meta["ranks"]),
                "overlap": bool(meta.get("overlap", True)), "machine": self.machine_name,
                **validation_figures(self.validation), "report": self.paths}


def check_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                out: Optional[str] = None) -> CheckedTrace:
    """Validate the trace of directory ``trace`` (``loaded`` is what ``load_trace`` read
    there) on ``machine`` and write the report (to ``out``, default ``trace/validation``)."""
    validation = validation_of(trace, loaded, machine)
    meta = loaded[2]
    title = (f"{meta['model']} on {meta['dataset']}, global batch {meta['global_batch']}, {int(meta['ranks'])} "
             f"rank(s), {meta.get('device', '?')}: measured against predicted ({machine_name})")
    paths = write_report(out or os.path.join(trace, "validation"), validation, title)
    return CheckedTrace(trace, meta, machine_name, validation, title, paths)


def validate_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                   out: Optional[str] = None) -> str:
    """:func:`check_trace`, and its text summary."""
    return check_trace(trace, loaded, machine, machine_name, out).text()
