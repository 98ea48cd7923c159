"""The kernel probe: a few networks of the calibration grid's families, trained again at a run's start.

The every-core probe (``machine_state.py``) follows two rates, a GEMM's and a large
copy's, and the kernels follow neither closely once the processor changes: on
2026-11-24 this machine (an AMD EPYC, where the reference calibration ran on an Intel
Xeon) copied 1.7x faster than at the calibration, while its batch-norm kernels ran at
about the calibration's speed and its updates 1.9x faster. So a traced run also trains
these few small networks as ``calibrate`` samples its grid (the tracer times every
kernel call, each paired with its cost) and keeps every call's median seconds, with the
time of each step outside its kernels, and times loading batches of the run's data set. A
validation sets them against the calibration's models for the same work: each kernel's,
the interpreter's and the loader's time now over then (``modelling/drift.py``).

They run as the reference calibration's kernels ran: one single-thread rank per core, all
at once, the ranks meeting at a barrier wherever a job's ranks meet (each batch-norm
reduction, the end of backward: :class:`~pydtnn_lite.perfmodel.measuring.sampling.ProbeSynchronizer`),
so that the ranks run each kernel together and share the memory system as a job's ranks
and the calibration's samples do; the job's ranks beyond the cores wait without spinning.
Ranks left to run apart timed a 2M-weight update at 0.7-1.5 ms in a minute when the
ranks' updates, run together, took 1.3-1.8 ms, and 0.7-0.9 ms in the next: alone, a rank
streamed at its own rate whatever the memory system gave two ranks at once (the Zen 4
EPYC, 2026-12-07).
"""
from __future__ import annotations

import numba
from threadpoolctl import threadpool_limits

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Communicator, SerialCommunicator
from pydtnn_lite.kernels import cpu
from pydtnn_lite.perfmodel.measuring.data_loading import TIMED, time_data_loading
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.measuring.machine_state import wait_idly
from pydtnn_lite.perfmodel.measuring.probes import Probe
from pydtnn_lite.perfmodel.measuring.sampling import measure_probe, median_over_ranks
from pydtnn_lite.perfmodel.modelling.drift import ProbedWork
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
# Every step sampled right after an eviction, as every calibration's runs of the probe were:
# a drift is the same work's time now over then, so the probe never changes how it times it.
SAMPLE_EVERY = 1
# Batches of the calibration's timed data sets, a few tens of milliseconds in all.
DATA_BATCHES = {"synthetic": (16, 64), "synthetic-imagenet": (2, 4), "digits": (16, 64)}


def probe_kernels(comm: Communicator, dataset: str | None = None, on_host: bool = True) -> ProbedWork:
    """Every kernel call of the probe networks, with its median seconds over the probing
    ranks; their steps' time outside the kernels; and, where the calibration times
    ``dataset`` (the run's), loading batches of it (collective; every rank gets them all).
    Only ranks that train ``on_host`` probe (the networks are the host's kernels), one a
    core, meeting among themselves."""
    probing = on_host and comm.local_rank < usable_cores()
    ranks = comm.split(0 if probing else None, comm.rank)
    mine = ProbedWork()
    if ranks is not None:
        mine = _measure_one_thread(dataset, ranks)
        ranks.free()
    wait_idly(comm)
    measured = [work for work in comm.allgather_object(mine) if work.calls]
    if not measured:
        return ProbedWork()
    return ProbedWork(median_over_ranks([work.calls for work in measured]),
                      [sample for work in measured for sample in work.outside],
                      {name: [sample for work in measured for sample in work.data.get(name, [])]
                       for name in measured[0].data}, meeting_ranks=len(measured))


def _measure_one_thread(dataset: str | None, ranks: Communicator) -> ProbedWork:
    """The probe networks on this rank, its BLAS and parallel loops on one thread, the
    probing ``ranks`` meeting as a job's do (collective over them); and the data set's
    batches, alone."""
    backend = make_backend("cpu")
    evict = CacheEvictor(backend)
    threads = numba.get_num_threads()
    cpu.set_threads(1)
    try:
        calls: dict[str, list[KernelSample]] = {}
        outside = []
        with threadpool_limits(1, user_api="blas"):
            for probe in KERNEL_PROBES:
                measured = measure_probe(probe, backend, ranks, PROBE_STEPS, evict,
                                         period=SAMPLE_EVERY)
                for name, samples in measured.samples.items():
                    calls.setdefault(name, []).extend(samples)
                outside.append(measured.overhead)
        data = {}
        if dataset in TIMED:
            data = time_data_loading(SerialCommunicator(), {dataset: DATA_BATCHES[dataset]})
        return ProbedWork(calls, outside, data)
    finally:
        cpu.set_threads(threads)
