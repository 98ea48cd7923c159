"""What the tracer records, and the files a trace directory holds.

A trace directory has, for all ranks together:

- ``events.csv``: one row per kernel call (:class:`KernelRecord`), the raw data the
  summaries and the performance-model validator read;
- ``steps.csv``: one row per traced step and rank (:class:`StepRecord`);
- ``trace.json``: the same events as a Chrome trace (``chrome.py``);
- ``summary.csv``: per stage, layer and kernel statistics (``summary.py``);
- ``meta.json``: the run that produced it (model, batch, ranks, device, ...).
"""
from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass, fields
from typing import Any, TypeVar

EVENTS_FILE, STEPS_FILE, META_FILE = "events.csv", "steps.csv", "meta.json"
TRAIN, EVAL = "train", "eval"
COMPUTE, COMMUNICATION = "compute", "communication"  # the timelines of a rank's step
DATA_THREAD = "data"  # the timeline of batches read ahead by the prefetching thread, outside the steps


@dataclass
class KernelRecord:
    """One kernel call on one rank.

    ``layer`` is the layer's index in the network (the loss is ``len(layers)``, -1 when the
    call belongs to no layer, e.g. a gradient bucket or data loading); ``stage`` is FP, BP,
    WU, COMM (gradient and loss reductions) or DATA. ``start`` is seconds since the job's
    trace origin (common to all ranks up to the skew of a barrier). ``flops`` and
    ``bytes`` are the analytic counts of the call (NaN when no analytic count exists).
    """

    rank: int
    phase: str
    step: int
    stage: str
    layer: int
    layer_name: str
    layer_type: str
    kernel: str
    thread: str
    start: float
    duration: float
    shapes: str
    flops: float
    bytes: float


@dataclass
class StepRecord:
    """One traced training step on one rank: its span and the samples it trained on."""

    rank: int
    step: int
    start: float
    duration: float
    samples: int


Record = TypeVar("Record", KernelRecord, StepRecord)


def write_records(path: str, records: Iterable[Any], kind: type[Record]) -> None:
    """Write ``records`` of dataclass ``kind`` as CSV with a header row."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(kind)])
        writer.writerows(astuple(record) for record in records)


def read_text(path: str) -> str:
    """The text of ``path``; ValueError naming the file and line of bytes that are not UTF-8."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: not UTF-8 text ({error.reason}); the file is damaged: "
                         "trace the run again") from None


def read_records(path: str, kind: type[Record]) -> list[Record]:
    """Read a CSV written by :func:`write_records` back into ``kind`` objects; ValueError naming the
    file and line of a damaged row (a cut-off write, NUL bytes, a missing or extra field)."""
    convert: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}
    # The field types are strings under postponed annotations, classes without them.
    converters = [convert[f.type if isinstance(f.type, str) else f.type.__name__] for f in fields(kind)]
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    expected = [f.name for f in fields(kind)]
    records = []
    try:
        header = next(reader, None)
        if header != expected:
            raise ValueError(f"{path} line 1: not a {kind.__name__} file of this version (header "
                             f"{header or 'missing'}): trace the run again")
        for row in reader:
            if len(row) != len(expected):
                raise ValueError(f"{path} line {reader.line_num}: {len(row)} fields instead of {len(expected)}; "
                                 "the file is damaged (cut off?): trace the run again")
            records.append(kind(*(to(value) for to, value in zip(converters, row, strict=True))))
    except csv.Error as error:
        raise ValueError(f"{path} line {reader.line_num}: {error}; the file is damaged: trace the run again") from None
    except ValueError as error:
        if str(error).startswith(path):
            raise
        raise ValueError(f"{path} line {reader.line_num}: {error}; the file is damaged: trace the run again") from None
    return records


def write_meta(directory: str, meta: dict) -> None:
    with open(os.path.join(directory, META_FILE), "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=2)


META_KEYS = ("model", "dataset", "global_batch", "ranks")  # what every reader of meta.json relies on


def read_meta(directory: str) -> dict:
    """The run description of a trace; ValueError naming the file (and line) when it is damaged."""
    path = os.path.join(directory, META_FILE)
    try:
        meta = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} line {error.lineno}: not JSON ({error.msg}); the file is damaged: "
                         "trace the run again") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a JSON object; the file is damaged: trace the run again")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by --trace; trace the run again")
    return meta


def trace_meta(directory: str) -> dict:
    """The run description of a trace directory, without reading its records:
    FileNotFoundError where it is not one, ValueError where its meta.json is damaged."""
    missing = [name for name in (EVENTS_FILE, STEPS_FILE, META_FILE)
               if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise FileNotFoundError(f"{directory} is not a trace directory (no {', '.join(missing)}): "
                                "write one with python -m pydtnn_lite.train --trace DIR")
    return read_meta(directory)


def load_trace(directory: str) -> tuple[list[KernelRecord], list[StepRecord], dict]:
    """The kernel records, step records and run description of a trace directory.

    ValueError naming the file (and line) when one is damaged, or when the trace holds no
    traced training step or no kernel of one.
    """
    meta = trace_meta(directory)
    steps = read_records(os.path.join(directory, STEPS_FILE), StepRecord)
    kernels = read_records(os.path.join(directory, EVENTS_FILE), KernelRecord)
    if not steps:
        raise ValueError(f"{os.path.join(directory, STEPS_FILE)} holds no traced training step: lower "
                         "--trace-skip or train more steps")
    if not any(record.phase == TRAIN for record in kernels):
        raise ValueError(f"{os.path.join(directory, EVENTS_FILE)} holds no kernel of a training step: the file is "
                         "damaged (cut off?): trace the run again")
    return kernels, steps, meta
