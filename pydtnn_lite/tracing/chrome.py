"""Chrome trace (Perfetto, chrome://tracing) JSON of a traced job.

One process per rank; in each, timelines of compute kernels, of communication calls,
of whole steps and of the batches the prefetching thread read (data). Complete events
("ph": "X") carry times in microseconds and the record's layer, shapes, FLOPs and bytes
in ``args``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from pydtnn_lite.tracing.records import COMMUNICATION, COMPUTE, DATA_THREAD, KernelRecord, StepRecord

THREADS = {COMPUTE: 0, COMMUNICATION: 1, "steps": 2, DATA_THREAD: 3}
MICROSECONDS = 1e6


def _metadata(pid: int, tid: int, kind: str, name: str) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def chrome_trace(kernels: Iterable[KernelRecord], steps: Iterable[StepRecord], device: str = "") -> dict:
    """The ``{"traceEvents": [...]}`` document for ``kernels`` and ``steps`` of any number of ranks."""
    kernels, steps = list(kernels), list(steps)
    events = []
    for rank in sorted({k.rank for k in kernels} | {s.rank for s in steps}):
        events.append(_metadata(rank, 0, "process_name", f"rank {rank}" + (f" ({device})" if device else "")))
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
        events += [_metadata(rank, tid, "thread_name", name) for name, tid in THREADS.items()]
    for step in steps:
        events.append({"ph": "X", "name": f"step {step.step}", "cat": "step", "pid": step.rank,
                       "tid": THREADS["steps"], "ts": step.start * MICROSECONDS,
                       "dur": step.duration * MICROSECONDS, "args": {"samples": step.samples}})
    for record in kernels:
        seconds = max(record.duration, 1e-12)
        args = {"phase": record.phase, "step": record.step, "layer": record.layer, "layer_name": record.layer_name,
                "layer_type": record.layer_type, "shapes": record.shapes, "flops": _finite(record.flops),
                "bytes": _finite(record.bytes)}
        if record.flops > 0:
            args["GFLOP/s"] = round(record.flops / seconds / 1e9, 3)
        if record.bytes > 0:
            args["GB/s"] = round(record.bytes / seconds / 1e9, 3)
        name = record.kernel if not record.layer_name else f"{record.kernel} {record.layer_name}"
        events.append({"ph": "X", "name": name, "cat": record.stage, "pid": record.rank,
                       "tid": THREADS[record.thread], "ts": record.start * MICROSECONDS,
                       "dur": record.duration * MICROSECONDS, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
