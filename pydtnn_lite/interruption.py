"""Ctrl-C: one line saying where the run stopped, and exit status 130 on every rank within seconds."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType

from pydtnn_lite.comm import Communicator
from pydtnn_lite.output_lock import release_all

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
# Ctrl-C in a terminal reaches every rank at once; rank 0 ends the job. A rank interrupted alone
# (kill -INT of one process) waits this long for rank 0's end, then ends the job itself.
ALONE_AFTER_SECONDS = 1.0
OUTPUT_GRACE_SECONDS = 0.3  # mpiexec forwards a rank's output asynchronously: let the line out before ending
COMPILER_PACKAGES = ("numba", "llvmlite")
RETRY_SECONDS = 0.05  # how soon an interrupt that came during a compilation is delivered again


def interrupt_outside_compilers() -> None:
    """Make Ctrl-C raise KeyboardInterrupt as Python's own handler does, but never inside
    Numba's compiler: there it comes again 50 ms later, until the compilation has returned.

    A kernel compiles on its first call. A KeyboardInterrupt raised inside llvmlite's
    callbacks is swallowed by ctypes and leaves LLVM's code cache half written; the process
    then hung in that call (a traced run interrupted 18 s into its first step, with an
    empty Numba cache, never ended)."""
    signal.signal(signal.SIGINT, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _inside_compiler(frame):
        later = threading.Timer(RETRY_SECONDS, os.kill, (os.getpid(), signal.SIGINT))
        later.daemon = True
        later.start()
        return
    raise KeyboardInterrupt


def _inside_compiler(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame that called it runs code of Numba or llvmlite."""
    while frame is not None:
        path = frame.f_code.co_filename
        if any(f"{os.sep}{package}{os.sep}" in path for package in COMPILER_PACKAGES):
            return True
        frame = frame.f_back
    return False


def end_interrupted(comm: Communicator, program: str, where: str) -> int:
    """Report the interruption ``where`` (e.g. 'at step 12') once, release this run's output
    directories, and end the job with status 130: by returning it in a one-rank job, by aborting
    every rank otherwise (the others may be waiting inside a collective)."""
    if comm.rank != 0:
        time.sleep(ALONE_AFTER_SECONDS)
    rank = f" (rank {comm.rank} of {comm.size})" if comm.rank else ""
    sys.stderr.write(f"{program}: interrupted {where}{rank}; the last checkpoint, if any, is kept\n")
    sys.stderr.flush()
    release_all()
    if comm.size == 1:
        return INTERRUPTED_EXIT
    time.sleep(OUTPUT_GRACE_SECONDS)
    # MPI's abort prints a line of its own per rank: the user has been told already.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stderr.fileno())
    comm.abort(INTERRUPTED_EXIT)
    return INTERRUPTED_EXIT
