"""A trace directory against the prediction for the run it records: the validation, its report and summary."""
from __future__ import annotations

import os
from typing import Optional

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.prediction import Machine, predict_step
from pydtnn_lite.perfmodel.modelling.report import summary_text, write_report
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


def validate_trace(trace: str, loaded: tuple[list, list, dict], machine: Machine, machine_name: str,
                   out: Optional[str] = None) -> str:
    """Validate the trace of directory ``trace`` (``loaded`` is what ``load_trace`` read
    there) on ``machine``, write the report (to ``out``, default ``trace/validation``) and
    return the text summary."""
    validation = validation_of(trace, loaded, machine)
    meta = loaded[2]
    procs = int(meta["ranks"])
    title = (f"{meta['model']} on {meta['dataset']}, global batch {meta['global_batch']}, {procs} rank(s), "
             f"{meta.get('device', '?')}: measured against predicted ({machine_name})")
    paths = write_report(out or os.path.join(trace, "validation"), validation, title)
    return "\n".join([title, summary_text(validation), "wrote " + ", ".join(paths)])
