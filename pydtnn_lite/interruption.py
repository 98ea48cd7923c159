"""Ctrl-C: one line saying where the run stopped, and exit status 130 on every rank within seconds."""
from __future__ import annotations

import os
import sys
import time

from pydtnn_lite.comm import Communicator
from pydtnn_lite.output_lock import release_all

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
# Ctrl-C in a terminal reaches every rank at once; rank 0 ends the job. A rank interrupted alone
# (kill -INT of one process) waits this long for rank 0's end, then ends the job itself.
ALONE_AFTER_SECONDS = 1.0
OUTPUT_GRACE_SECONDS = 0.3  # mpiexec forwards a rank's output asynchronously: let the line out before ending


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
