"""Tracing: per-kernel timings of every rank, as Chrome trace JSON, CSV records and summaries."""
from pydtnn_lite.tracing.records import KernelRecord, StepRecord, load_trace
from pydtnn_lite.tracing.summary import kernel_rows, rank_rows, report
from pydtnn_lite.tracing.tracer import Tracer

__all__ = ["Tracer", "KernelRecord", "StepRecord", "load_trace", "kernel_rows", "rank_rows", "report"]
