"""The kernel probe: a few networks of the calibration grid's families, trained again at a run's start.

The every-core probe (``machine_state.py``) follows two rates, a GEMM's and a large
copy's, and the kernels follow neither closely once the processor changes: on
2026-11-24 this machine (an AMD EPYC, where the reference calibration ran on an Intel
Xeon) copied 1.7x faster than at the calibration, while its batch-norm kernels ran at
about the calibration's speed and its updates 1.9x faster. So a traced run also trains
these few small networks as ``calibrate`` samples its grid (the tracer times every
kernel call, each paired with its cost) and keeps every call's median seconds. A
validation sets them against the calibration's models for the same calls: each kernel's
time now over then (``modelling/drift.py``).

They run as the reference calibration's kernels ran: one single-thread rank per core, all
at once; the job's ranks beyond the cores wait without spinning.
"""
from __future__ import annotations

import numba
from threadpoolctl import threadpool_limits

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator, SerialCommunicator
from pydtnn_lite.kernels import cpu
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.measuring.machine_state import wait_idly
from pydtnn_lite.perfmodel.measuring.probes import Probe
from pydtnn_lite.perfmodel.measuring.sampling import measure_probe, median_over_ranks
from pydtnn_lite.perfmodel.modelling.regression import KernelSample
from pydtnn_lite.runtime import usable_cores

# Every kernel of the zoo's training steps, on maps from within the L2 caches to beyond them
# (a second or two in all).
KERNEL_PROBES = (
    Probe("conv", 16, (16, 64, 64, 3, 1, 1)),
    Probe("conv", 16, (8, 128, 128, 3, 1, 1)),
    Probe("conv", 64, (32, 3, 16, 5, 1, 0)),  # a first layer's few channels, beyond the L2 caches
    Probe("pool", 64, (16, 64, 2, 2, 0)),
    Probe("pool", 16, (8, 128, 3, 2, 1)),
    Probe("merge", 16, (16, 64)),
    Probe("dense", 32, (4096, 512, 10)),  # 2M weights: updates that stream from memory, as a model's do
    Probe("dense", 32, (4096, 512, 10), "adam"),
)
PROBE_STEPS = 3  # traced steps per network; a sample is a call's median over them


def probe_kernels(comm: Communicator) -> dict[str, list[KernelSample]]:
    """Every kernel call of the probe networks with its median seconds over the probing ranks
    (collective; every rank gets them)."""
    mine: dict[str, list[KernelSample]] = {}
    if comm.local_rank < usable_cores():
        mine = _measure_one_thread()
    wait_idly(comm)
    measured = [samples for samples in comm.allgather_object(mine) if samples]
    return median_over_ranks(measured)


def _measure_one_thread() -> dict[str, list[KernelSample]]:
    """The probe networks on this rank alone, its BLAS and parallel loops on one thread."""
    backend = make_backend("cpu")
    evict = CacheEvictor(backend)
    threads = numba.get_num_threads()
    cpu.set_threads(1)
    try:
        samples: dict[str, list[KernelSample]] = {}
        with threadpool_limits(1, user_api="blas"):
            for probe in KERNEL_PROBES:
                measured = measure_probe(probe, backend, SerialCommunicator(), PROBE_STEPS, evict)
                for name, calls in measured.samples.items():
                    samples.setdefault(name, []).extend(calls)
        return samples
    finally:
        cpu.set_threads(threads)
