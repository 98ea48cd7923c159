"""More ranks than cores: the communicator's own waits sleep from the start, and the start line says so."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pydtnn_lite.comm.mpi import SPIN_SECONDS
from pydtnn_lite.runtime import usable_cores

from mpi import MPIEXEC, REPO

SHOW_WAITS = ("from pydtnn_lite.comm import make_communicator; comm = make_communicator(timeout=5); "
              "seen = comm.allgather_object((comm.oversubscribed, comm.spin_seconds)); comm.barrier(); "
              "comm.rank == 0 and print(seen); comm.rank == 0 and print(comm.describe())")


def show_waits(pin_to_one_core: bool) -> list[str]:
    """What two ranks, pinned to one core or not, report of their waits, and rank 0's description."""
    core = min(os.sched_getaffinity(0))
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", SHOW_WAITS], capture_output=True, text=True,
                            timeout=60, cwd=REPO,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if pin_to_one_core else None)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def test_two_ranks_on_one_core_wait_without_spinning_and_say_so():
    seen, description = show_waits(pin_to_one_core=True)
    assert seen == str([(True, 0.0)] * 2)
    assert description.endswith(", 2 on 1 cores here")


def test_two_ranks_with_a_core_each_spin_briefly():
    if usable_cores() < 2:
        pytest.skip("needs two cores")
    seen, description = show_waits(pin_to_one_core=False)
    assert seen == str([(False, SPIN_SECONDS)] * 2)
    assert "cores here" not in description


LIMITED_BLAS = ("import numpy as np; from threadpoolctl import threadpool_info; "
                "from pydtnn_lite.runtime import set_blas_threads; set_blas_threads(1); "
                "from pydtnn_lite.kernels import cpu; cpu.relu(np.ones((4, 4), dtype=np.float32)); "
                "print(sorted({library['num_threads'] for library in threadpool_info() "
                "if library['user_api'] == 'blas'}))")


@pytest.mark.skipif(usable_cores() < 2, reason="one core: every BLAS runs one thread anyway")
def test_a_rank_limited_to_one_blas_thread_keeps_every_blas_library_to_it():
    # NumPy's OpenBLAS, and SciPy's, which Numba binds when it first loads a kernel: ranks
    # sharing a node must not keep a pool of a thread per core in either.
    result = subprocess.run([sys.executable, "-c", LIMITED_BLAS], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[1]"
