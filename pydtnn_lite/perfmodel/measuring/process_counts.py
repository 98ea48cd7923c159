"""Allreduce at process counts the calibration job itself does not have, oversubscribed ones included.

Users try a job on a laptop or a login node with more ranks than cores before they book
a cluster. A calibration run as ``mpiexec -n 2`` times Allreduce on 2 ranks; to predict
8 ranks on 2 cores it needs their Allreduce too, which is slower than any fit of the
2-rank samples says: the ranks time-share the cores, and MPICH's ranks poll while they
wait. So rank 0 of the calibration starts one child job per missing count (mpiexec of
the same environment, the parent job's MPI variables removed so that the child starts a
job of its own), while the parent's other ranks wait without spinning on a core. Each
child times the sizes as :mod:`allreduce_timing` does and writes its samples to a file,
with the CPU time each reduction took per rank: where ranks time-share the cores, that,
rather than its duration, is what a reduction overlapped with other ranks' backward
costs the step (``placement.py``).

Run as a child: ``mpiexec -n N python -m pydtnn_lite.perfmodel.measuring.process_counts OUT.json SIZE...``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from pydtnn_lite.comm import Communicator
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.measuring.allreduce_timing import KIB, MIB, allreduce_timings, log_spaced_sizes
from pydtnn_lite.perfmodel.measuring.machine_state import wait_idly

OVERSUBSCRIPTION = 4  # time counts up to this many ranks per core
# Oversubscribed reductions are slow: every octave up to 32 MiB (a few buckets) is enough.
CHILD_SIZES = tuple(KIB << i for i in range(0, 6, 2)) + log_spaced_sizes(64 * KIB, 32 * MIB, 1)
CHILD_TIMEOUT = 600.0  # seconds one child job may take before the calibration gives up on it
PARENT_VARIABLES = ("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCAL")  # the parent job's, which a child must not see


def missing_counts(job_size: int, cores: int) -> list[int]:
    """The process counts above the calibration job's own, up to :data:`OVERSUBSCRIPTION` per core."""
    return list(range(max(job_size, 1) + 1, OVERSUBSCRIPTION * cores + 1))


def child_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith(PARENT_VARIABLES)}


def run_child(ranks: int, sizes: Sequence[int]) -> list[tuple[int, int, float, float]]:
    """Start a job of ``ranks`` ranks that times ``sizes``; its (ranks, bytes, seconds, CPU seconds) samples."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "samples.json")
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", __name__, out, *map(str, sizes)]
        try:
            result = subprocess.run(command, env=child_environment(), capture_output=True, text=True,
                                    timeout=CHILD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise UserError(f"could not time Allreduce on {ranks} ranks ({error}): calibrate with "
                            "--no-oversubscribed to skip the counts beyond this job's") from None
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"timing Allreduce on {ranks} ranks failed ({last}): calibrate with "
                            "--no-oversubscribed to skip the counts beyond this job's")
        with open(out, encoding="utf-8") as handle:
            return [(ranks, int(nbytes), float(seconds), float(cpu)) for nbytes, seconds, cpu in json.load(handle)]


Sample = tuple[int, int, float]  # ranks, bytes, seconds


def samples_beyond(comm: Communicator, cores: int,
                   sizes: Sequence[int] = CHILD_SIZES) -> tuple[list[Sample], list[Sample]]:
    """Allreduce samples at every count of :func:`missing_counts`, timed by child jobs that
    rank 0 starts one after the other: (ranks, bytes, seconds), and (ranks, bytes, CPU
    seconds per rank) of the same calls. Collective; every rank gets the samples."""
    samples: list[tuple[int, int, float, float]] = []
    failure = None
    if comm.rank == 0:
        try:
            for ranks in missing_counts(comm.size, cores):
                samples += run_child(ranks, sizes)
        except UserError as error:
            failure = str(error)
    wait_idly(comm)
    samples, failure = comm.broadcast_object((samples, failure))
    if failure:
        raise UserError(failure)
    return [(p, n, t) for p, n, t, _ in samples], [(p, n, cpu) for p, n, _, cpu in samples]


def main(argv: Sequence[str]) -> None:
    """A child job: time ``argv[1:]`` bytes on every rank; rank 0 writes [[bytes, seconds, CPU
    seconds], ...] to ``argv[0]``."""
    from pydtnn_lite.comm.mpi import MPICommunicator
    from pydtnn_lite.runtime import set_blas_threads

    set_blas_threads(1)
    comm = MPICommunicator()
    sizes = [int(size) for size in argv[1:]]
    timings = allreduce_timings(comm, sizes)
    if comm.rank == 0:
        with open(argv[0], "w", encoding="utf-8") as handle:
            json.dump([[n, t.seconds, t.cpu_seconds] for n, t in zip(sizes, timings, strict=True)], handle)


if __name__ == "__main__":
    main(sys.argv[1:])
