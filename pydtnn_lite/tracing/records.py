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


def read_records(path: str, kind: type[Record]) -> list[Record]:
    """Read a CSV written by :func:`write_records` back into ``kind`` objects."""
    convert: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}
    # The field types are strings under postponed annotations, classes without them.
    converters = [convert[f.type if isinstance(f.type, str) else f.type.__name__] for f in fields(kind)]
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    expected = [f.name for f in fields(kind)]
    if not rows or rows[0] != expected:
        raise ValueError(f"{path} is not a {kind.__name__} file (header {rows[0] if rows else 'missing'})")
    return [kind(*(to(value) for to, value in zip(converters, row, strict=True))) for row in rows[1:]]


def write_meta(directory: str, meta: dict) -> None:
    with open(os.path.join(directory, META_FILE), "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=2)


def read_meta(directory: str) -> dict:
    with open(os.path.join(directory, META_FILE), encoding="utf-8") as handle:
        return json.load(handle)


def load_trace(directory: str) -> tuple[list[KernelRecord], list[StepRecord], dict]:
    """The kernel records, step records and run description of a trace directory."""
    missing = [name for name in (EVENTS_FILE, STEPS_FILE, META_FILE)
               if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise FileNotFoundError(f"{directory} is not a trace directory (no {', '.join(missing)}): "
                                "write one with python -m pydtnn_lite.train --trace DIR")
    return (read_records(os.path.join(directory, EVENTS_FILE), KernelRecord),
            read_records(os.path.join(directory, STEPS_FILE), StepRecord), read_meta(directory))
