"""A folder of calibration files, one per machine: each run takes the one of its own processor.

A calibration holds for the processor that measured it (its name, vector unit, cache and generation,
:class:`~pydtnn_lite.perfmodel.modelling.processors.Processor`); another processor's is
carried over only in part by the drift correction (``validate`` warns of it). Users who run on
several kinds of machine, and this repository, whose development machine has been an
AMD EPYC on some days and an Intel Xeon on others, keep one file per processor in a
folder and name the folder wherever a calibration file is asked for.
"""
from __future__ import annotations

import math
import os
from collections.abc import Set
from datetime import datetime

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.calibration import read_calibration_data
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels


def calibration_file(path: str, processor: Processor, device: str = "cpu", blas: Set[str] = frozenset()) -> str:
    """``path`` where it is not a folder. In a folder, of its calibrations (``*.json``) of one
    node's ``device`` run, the newest measured on ``processor`` (:meth:`Processor.same_as`;
    one that names its generation before one that does not, then one whose BLAS ran the
    run's ``blas`` kernels before one of others), else the newest of its name and
    vector unit (another cache or generation), else of its name, else the newest of any
    processor. A
    calibration of several (emulated) nodes is never picked: name its file."""
    if not os.path.isdir(path):
        return path
    candidates = []
    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        if not name.endswith(".json") or not os.path.isfile(file):
            continue
        try:
            data = read_calibration_data(file)
        except OSError as error:
            raise UserError(f"{error.strerror or error}: every .json file in a calibration folder is a calibration; "
                            "move the others out") from None
        except ValueError as error:
            raise UserError(f"{error} (every .json file in calibration folder {path} is read)") from None
        machine = data.get("machine")
        if not isinstance(machine, dict):
            raise UserError(f"{file} is a damaged calibration file (no machine record): calibrate again")
        if machine.get("device", "cpu") == device and not data.get("network"):
            measured_on = Processor.of(machine)
            named_generation = bool(processor.generation) and measured_on.generation == processor.generation
            same_kernels = bool(blas) and blas_kernels(machine) == blas
            candidates.append((measured_on.name == processor.name, measured_on.same_vector_unit(processor),
                               measured_on.same_as(processor), named_generation, same_kernels,
                               _measured_at(machine), file))
    if not candidates:
        raise UserError(f"{path} holds no calibration of one node's {device} run: write one with "
                        f"python -m pydtnn_lite.calibrate --out {os.path.join(path, 'NAME.json')}, or name a file")
    return max(candidates)[-1]


def _measured_at(machine: dict) -> float:
    """When a calibration was measured, in seconds since the epoch (its record's ISO date;
    files that do not say count as the oldest)."""
    try:
        return datetime.fromisoformat(str(machine["date"])).timestamp()
    except (KeyError, ValueError):
        return -math.inf
