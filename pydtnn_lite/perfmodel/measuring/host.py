"""The machine a calibration describes: what it is, its two roofs (GEMM peak, memory bandwidth), its caches."""
from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from pydtnn_lite.backend import Backend, sysfs_last_level_cache_bytes
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels
from pydtnn_lite.runtime import usable_cores

PEAK_GEMM_SIZE = 2048  # n of the n x n x n matrix product that measures the compute roof
BANDWIDTH_BYTES = 256 << 20  # copied array: far beyond any cache, small enough for every machine here


def _cpuinfo() -> str:
    """The text of /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def _first_processor_fields(cpuinfo: str | None) -> dict[str, str]:
    """The fields of the first processor that ``cpuinfo`` (the text of /proc/cpuinfo; read when None) describes."""
    fields: dict[str, str] = {}
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """The processor's name from ``cpuinfo`` (/proc/cpuinfo, read when None), or what the platform module knows."""
    name = _first_processor_fields(cpuinfo).get("model name")
    return name or platform.processor() or platform.machine()


# /proc/cpuinfo's feature flags of the vector units a calibration tells apart, widest first.
VECTOR_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"), ("asimd", "NEON"))


def vector_unit(cpuinfo: str | None = None) -> str:
    """The widest vector unit of the processor (:data:`VECTOR_FLAGS`) by the feature flags of
    ``cpuinfo`` (the text of /proc/cpuinfo; read when None); '' where none is named."""
    fields = _first_processor_fields(cpuinfo)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())  # x86, ARM
    return next((unit for flag, unit in VECTOR_FLAGS if flag in flags), "")


def cpu_generation(cpuinfo: str | None = None) -> str:
    """The processor's generation by ``cpuinfo`` (the text of /proc/cpuinfo; read when None):
    'family 25 model 17' on x86, 'implementer 0x41 part 0xd0c' on ARM, '' where it says neither."""
    fields = _first_processor_fields(cpuinfo)
    for first, second, as_named in (("cpu family", "model", "family {} model {}"),
                                    ("CPU implementer", "CPU part", "implementer {} part {}")):
        if fields.get(first) and fields.get(second):
            return as_named.format(fields[first], fields[second])
    return ""


def this_processor() -> Processor:
    """The processor this process runs on, its cache as sysfs names it (0 where it does not)."""
    cpuinfo = _cpuinfo()
    return Processor(cpu_model(cpuinfo), vector_unit(cpuinfo), sysfs_last_level_cache_bytes() or 0,
                     cpu_generation(cpuinfo))


def blas_info() -> list[dict]:
    """The BLAS libraries NumPy loaded, with their version and threads (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    keep = ("internal_api", "version", "threading_layer", "architecture", "num_threads")
    return [{key: library.get(key) for key in keep} for library in threadpool_info()
            if library.get("user_api") == "blas"]


def this_blas_kernels() -> set[str]:
    """The kernels the BLAS libraries NumPy loaded run here (threadpoolctl's "architecture")."""
    return blas_kernels({"blas": blas_info()})


def mpi_library() -> str:
    """The first line of the MPI library's version string ('' without mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return ""
    return MPI.Get_library_version().strip().splitlines()[0]


def describe_machine(backend: Backend, blas_threads: int, ranks: int) -> dict:
    """What a calibration's figures hold for: processor, cores, libraries, precision, date."""
    machine = {"host": platform.node(), **this_processor().record(), "cores": os.cpu_count(),
               "usable_cores": usable_cores(), "last_level_cache_bytes": backend.last_level_cache_bytes(),
               "blas": blas_info(), "blas_threads": blas_threads,
               "ranks": ranks, "dtype": np.dtype(backend.dtype).name, "device": backend.device,
               "mpi_library": mpi_library(), "numpy": np.__version__, "python": platform.python_version(),
               "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    if backend.on_gpu:
        properties = backend.xp.cuda.runtime.getDeviceProperties(backend.xp.cuda.Device().id)
        machine["gpu_model"] = properties["name"].decode()
    return machine


def _fastest(run: Callable[[], object], backend: Backend, repeats: int) -> float:
    """The shortest of ``repeats`` timed runs of ``run`` after one warm-up: a roof is the
    best the machine does, and interference only ever slows a run down."""
    run()
    backend.synchronize()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        backend.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def gemm_peak(backend: Backend, size: int = PEAK_GEMM_SIZE, repeats: int = 3) -> float:
    """FLOP/s of a ``size``-cubed matrix product in the backend's dtype."""
    rng = np.random.default_rng(0)
    a, b = (backend.asarray(rng.standard_normal((size, size))) for _ in range(2))
    out = backend.xp.empty_like(a)
    return 2.0 * size ** 3 / _fastest(lambda: backend.xp.matmul(a, b, out=out), backend, repeats)


class CacheEvictor:
    """Pushes a backend's operands out of its caches, as a training step's other work does.

    In a network larger than the cache, a layer's optimizer state and a gradient bucket
    are touched again only after the rest of the step has streamed through memory, so
    their kernels read them from memory, not from the cache. Calling the evictor reads and
    writes a buffer twice the size of the last-level cache, which leaves none of what was
    there before (every rank of a node does it at once, so a shared cache is covered too).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.buffer = backend.xp.zeros(2 * backend.last_level_cache_bytes() // 4, dtype=np.float32)
        self.seconds = 0.0  # what the last eviction took

    def __call__(self) -> None:
        started = time.perf_counter()
        self.buffer += 1.0  # whole numbers: never denormal, so never slow
        self.backend.synchronize()
        self.seconds = time.perf_counter() - started


def memory_bandwidth(backend: Backend, nbytes: int = BANDWIDTH_BYTES, repeats: int = 3) -> float:
    """Bytes/s of copying a large array, counting the bytes read and the bytes written as the
    kernels' byte counts do."""
    source = backend.xp.ones(nbytes // 4, dtype=np.float32)
    target = backend.xp.empty_like(source)
    return 2.0 * nbytes / _fastest(lambda: backend.xp.copyto(target, source), backend, repeats)
