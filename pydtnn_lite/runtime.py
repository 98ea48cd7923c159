"""Process-level settings: BLAS threads per rank, and ending the whole job when one rank fails."""
from __future__ import annotations

import ctypes
import os
import sys
import time
import traceback
from typing import overload

from pydtnn_lite.comm import Communicator
from pydtnn_lite.errors import UserError

# mpiexec forwards a rank's output asynchronously; an immediate abort can drop the message.
ABORT_GRACE_SECONDS = 0.3
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1 << 30
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the first set wins
TRIM_THRESHOLD_BYTES = (1 << 31) - 1


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for reuse instead of handing it back to the system.

    Every step allocates and frees the same large temporaries (patch matrices and their
    gradients, hundreds of MB for VGG11). By default glibc maps each one fresh and unmaps
    it on free, so each step pays a page fault for every page it touches again
    (docs/performance.md, 'Single-process training step against the GEMM peak').
    Training, calibration and benchmarks all call this, so the calibrated kernel times
    match the training runs. Does nothing without glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def environment_blas_threads() -> tuple[int, str] | None:
    """The BLAS threads the environment asks for, and the variable that says so (None when unset).

    UserError for a value that is not a positive integer. OMP_NUM_THREADS may list one count
    per nesting level; its first is the BLAS's.
    """
    for variable in BLAS_THREAD_VARIABLES:
        text = os.environ.get(variable, "").strip()
        if not text:
            continue
        first = text.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise UserError(f"{variable}={text} is not a positive number of threads: set it to 1 or more, "
                            "or unset it")
        return int(first), variable
    return None


def default_blas_threads(comm: Communicator) -> int:
    """BLAS threads of a rank without --blas-threads: what OPENBLAS_NUM_THREADS or OMP_NUM_THREADS
    says when set, else the node's cores divided among this job's ranks on it (at least one each)."""
    from_environment = environment_blas_threads()
    if from_environment is not None:
        return from_environment[0]
    return max(1, usable_cores() // comm.local_size)


def blas_threads_origin(flag_value: int | None) -> str:
    """Where a rank's BLAS thread count came from, for the start line."""
    if flag_value is not None:
        return "--blas-threads"
    from_environment = environment_blas_threads()
    return from_environment[1] if from_environment is not None else "the node's cores over its ranks"


@overload
def set_blas_threads(threads: int) -> int: ...


@overload
def set_blas_threads(threads: None) -> None: ...


def set_blas_threads(threads: int | None) -> int | None:
    """Limit the BLAS and the host kernels of this process to ``threads`` (ranks sharing a node
    must not oversubscribe; None: no limit) and return ``threads``."""
    # Numba binds SciPy's own OpenBLAS the first time it loads a kernel: bound before the
    # limit, that library is limited with NumPy's, where later it kept a thread per core.
    import numba.np.arraymath  # noqa: F401
    from threadpoolctl import threadpool_limits

    from pydtnn_lite.kernels import cpu

    threadpool_limits(limits=threads, user_api="blas")
    cpu.set_threads(threads)
    return threads


def install_job_abort(comm: Communicator, program: str) -> None:
    """Make an uncaught exception on any rank end every rank within seconds.

    MPI leaves the other ranks blocked in their next collective otherwise; Abort tears
    the whole job down, and the message names the rank that failed.
    """
    def hook(kind, value, tb) -> None:
        report_and_abort(comm, program, value, tb)

    sys.excepthook = hook


def report_and_abort(comm: Communicator, program: str, error: BaseException, tb=None) -> None:
    """Print ``error`` (a UserError as one line, anything else with its traceback), naming the
    rank, then abort the job with exit code 1."""
    details = "" if isinstance(error, UserError) else "".join(
        traceback.format_exception(type(error), error, tb or error.__traceback__))
    sys.stderr.write(f"{details}{program}: error: rank {comm.rank} of {comm.size} failed: {error}; "
                     "ending the job\n")
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_SECONDS)
    comm.abort(1)
