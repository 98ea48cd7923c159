"""The messages of a run, through Python's logging: a rank prefix, and timestamps in log files.

A job's ranks share one output; the prefix ``[rank R/N]`` says which one spoke (a job of
one process has none). Written to a terminal, a line is the message alone; written to a
file (a SLURM log, a pipe) it starts with the time, so the log can be read afterwards.
"""
from __future__ import annotations

import logging
import sys
from typing import TextIO

LOGGER = logging.getLogger("pydtnn_lite")


def setup_logging(level: str, rank: int = 0, size: int = 1, stream: TextIO | None = None) -> logging.Logger:
    """Send pydtnn_lite's messages of ``level`` ('debug', 'info', ...) and above to ``stream`` (stdout)."""
    stream = stream or sys.stdout
    prefix = f"[rank {rank}/{size}] " if size > 1 else ""
    stamp = "" if stream.isatty() else "%(asctime)s "
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(f"{stamp}{prefix}%(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False
    return LOGGER
