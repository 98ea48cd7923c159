"""The one place that decides which array library a process computes with.

Layers, losses and optimizers are written once against the namespace returned by
:func:`array_module`; NumPy runs them on the CPU and CuPy on an NVIDIA GPU.
"""
from __future__ import annotations

import functools
import glob
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from pydtnn_lite.errors import UserError

DTYPES = {"float32": np.float32, "float64": np.float64}
DEFAULT_LAST_LEVEL_CACHE = 32 << 20  # where the operating system does not tell
# States the host's last-level cache where the operating system's figure is not the one to
# evict: a virtual machine reports its host's whole cache (hundreds of MiB on a 2-core guest).
CACHE_VARIABLE = "PYDTNN_LITE_LAST_LEVEL_CACHE"
CACHE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class BackendError(UserError):
    """The requested device or dtype cannot be used on this machine."""


@dataclass(frozen=True)
class Backend:
    """Array namespace, dtype and device of one process: NumPy on the host.

    Besides the namespace, a backend owns the copies between host and device, so that
    data loading and host-staged communication are written once for every device.
    """

    xp: ModuleType
    dtype: type
    device: str

    @property
    def on_gpu(self) -> bool:
        return False

    @property
    def winograd(self) -> bool:
        """Whether 3x3 convolutions may take the Winograd form (``layers.Conv2D``): on the
        host its tile transforms are compiled loops; on a GPU they are CuPy einsums, with
        which steps ran slower than on patch matrices (H200, 2026-11-27: ResNet18 on
        CIFAR-10, batch 128, 131.7 against 37.2 ms; VGG11 on ImageNet shapes, batch 64,
        115.3 against 89.4 ms), so a GPU keeps the latter."""
        return not self.on_gpu

    def asarray(self, data: Any) -> Any:
        """Copy host data to this backend's device, in its dtype."""
        return self.xp.asarray(data, dtype=self.dtype)

    def to_device(self, host: np.ndarray, dtype: Any = None) -> Any:
        """A batch read on the host, on the device in ``dtype`` (the backend's by default).

        The copy is queued, not waited for: kernels queued after it see the data.
        """
        return np.asarray(host, dtype=dtype or self.dtype)

    def to_host(self, array: Any) -> np.ndarray:
        """Return ``array`` as a NumPy array (a no-op on the CPU)."""
        return np.asarray(array)

    def host_buffer(self, size: int, dtype: Any) -> np.ndarray:
        """An empty host array of ``size`` elements that device copies can use directly
        (page-locked on a GPU, so copies run at full bus speed and asynchronously)."""
        return np.empty(size, dtype=dtype)

    def copy_to_host(self, array: Any, out: np.ndarray) -> np.ndarray:
        """Copy the device ``array`` into the host array ``out`` (same size) and wait for it."""
        np.copyto(out, array.reshape(out.shape))
        return out

    def staged(self, array: Any) -> np.ndarray:
        """``array``'s values in flat host memory that MPI can sum in place, to be copied back
        with :meth:`copy_from_host`: a contiguous host array is its own (nothing is copied
        either way); anything else is copied into a :meth:`host_buffer`."""
        if isinstance(array, np.ndarray) and array.flags.c_contiguous:
            return array.reshape(-1)
        return self.copy_to_host(array, self.host_buffer(array.size, array.dtype))

    def copy_from_host(self, host: np.ndarray, out: Any) -> Any:
        """Copy ``host`` into the device array ``out`` (same size); device work queued later sees it."""
        if not np.may_share_memory(host, out):  # else ``host`` is ``out`` staged in place
            np.copyto(out, host.reshape(out.shape))
        return out

    def synchronize(self) -> None:
        """Wait until queued device work has finished (a no-op on the CPU)."""

    def total(self, array: Any) -> float:
        """The sum of ``array``'s elements on the host: NaN or inf where an element is (the
        divergence check's test of a step's reduced gradients, every step)."""
        from pydtnn_lite.kernels import cpu  # the kernels build on this module

        return cpu.total(array)

    def clock(self) -> HostClock:
        """A clock that timestamps kernels on this backend's device."""
        return HostClock()

    def last_level_cache_bytes(self) -> int:
        """Size of the largest cache in front of this backend's memory (the CPU's last level)."""
        return host_last_level_cache_bytes()


@dataclass(frozen=True)
class CupyBackend(Backend):
    """CuPy on one NVIDIA GPU: kernels are queued on the current stream; host copies go
    through page-locked buffers on a copy stream of their own."""

    copies: list = field(default_factory=list, compare=False)  # (event, pinned buffer) of copies in flight

    @property
    def on_gpu(self) -> bool:
        return True

    def to_device(self, host: np.ndarray, dtype: Any = None) -> Any:
        cupy = self.xp
        pinned = self.host_buffer(host.size, dtype or self.dtype).reshape(host.shape)
        np.copyto(pinned, host, casting="unsafe")
        device = cupy.empty(host.shape, dtype=pinned.dtype)
        stream = _copy_stream(cupy)
        device.set(pinned, stream=stream)
        cupy.cuda.get_current_stream().wait_event(self._keep_until_copied(pinned, stream))
        return device

    def _keep_until_copied(self, buffer: np.ndarray, stream: Any) -> Any:
        """Hold ``buffer`` until the copy just queued on ``stream`` has run; return its event."""
        done = stream.record()
        self.copies[:] = [(event, kept) for event, kept in self.copies if not event.done]
        self.copies.append((done, buffer))
        return done

    def to_host(self, array: Any) -> np.ndarray:
        return array.get() if isinstance(array, self.xp.ndarray) else np.asarray(array)

    def host_buffer(self, size: int, dtype: Any) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(size, dtype=dtype)

    def copy_to_host(self, array: Any, out: np.ndarray) -> np.ndarray:
        self.xp.ascontiguousarray(array).reshape(out.shape).get(out=out)
        return out

    def copy_from_host(self, host: np.ndarray, out: Any) -> Any:
        stream = self.xp.cuda.get_current_stream()
        out.set(host.reshape(out.shape), stream=stream)  # asynchronous from page-locked memory
        self._keep_until_copied(host, stream)
        return out

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def total(self, array: Any) -> float:
        return float(array.sum())

    def clock(self) -> HostClock:
        return DeviceClock(self.xp)

    def last_level_cache_bytes(self) -> int:
        return int(self.xp.cuda.Device().attributes["L2CacheSize"])


def cache_size_bytes(text: str) -> int | None:
    """Bytes of a cache size written as sysfs writes it ("32768K", "4M", "1048576"); None if it is not one."""
    text = text.strip().upper()
    if text[:-1].isdigit() and text[-1] in CACHE_UNITS:
        return int(text[:-1]) * CACHE_UNITS[text[-1]]
    return int(text) if text.isdigit() else None


def host_last_level_cache_bytes() -> int:
    """The largest CPU cache to evict: :data:`CACHE_VARIABLE` where it is set, else
    :func:`sysfs_last_level_cache_bytes`; 32 MiB where neither tells."""
    stated = os.environ.get(CACHE_VARIABLE)
    if stated is not None:
        size = cache_size_bytes(stated)
        if not size:
            raise UserError(f"{CACHE_VARIABLE}={stated!r} is not a cache size: give bytes, or a number with K, M "
                            "or G (32M)")
        return size
    return sysfs_last_level_cache_bytes() or DEFAULT_LAST_LEVEL_CACHE


def sysfs_last_level_cache_bytes() -> int | None:
    """The largest CPU cache that Linux sysfs names (None where it names none): the
    processor's own, whatever :data:`CACHE_VARIABLE` states to evict."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path, encoding="ascii") as handle:
                size = cache_size_bytes(handle.read())
        except OSError:
            continue
        if size is not None:
            sizes.append(size)
    return max(sizes, default=None)


@functools.cache
def _copy_stream(cupy: ModuleType) -> Any:
    """The non-blocking stream that host-to-device copies of batches run on."""
    return cupy.cuda.Stream(non_blocking=True)


class HostClock:
    """Kernel timestamps from the host's performance counter: CPU kernels run synchronously."""

    def start_step(self) -> None:
        """Mark the start of a step (nothing to do on the host)."""

    def stamp(self) -> Any:
        """A timestamp taken now."""
        return time.perf_counter()

    def resolve(self, stamps: Sequence[Any]) -> list[float]:
        """Seconds on the host's perf_counter scale of every stamp of this step."""
        return list(stamps)


class DeviceClock(HostClock):
    """Kernel timestamps as CUDA events on the current stream.

    Recording an event does not wait for the GPU, so timing a kernel adds no
    synchronisation; the events are read once, at the end of the step, and placed on the
    host's time scale through an event recorded (and waited for) at the step's start.
    """

    def __init__(self, cupy: ModuleType) -> None:
        self.cuda = cupy.cuda
        self.origin: Any = None  # the step's starting cupy.cuda.Event, once a step has started
        self.origin_host = 0.0

    def start_step(self) -> None:
        self.origin = self.cuda.Event()
        self.origin.record()
        self.origin.synchronize()
        self.origin_host = time.perf_counter()

    def stamp(self) -> Any:
        event = self.cuda.Event()
        event.record()
        return event

    def resolve(self, stamps: Sequence[Any]) -> list[float]:
        if not stamps:
            return []
        stamps[-1].synchronize()
        return [self.origin_host + self.cuda.get_elapsed_time(self.origin, event) / 1e3 for event in stamps]


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one usable CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:  # a broken driver install reports through various exception types
        return False


def make_backend(device: str = "cpu", dtype: str = "float32", gpu_id: int = 0) -> Backend:
    """Build the backend for ``device`` ('cpu', 'gpu' or 'auto') and ``dtype``.

    ``gpu_id`` is taken modulo the node's GPU count, so a rank's local rank can be passed.
    """
    if dtype not in DTYPES:
        raise BackendError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if device == "auto":
        device = "gpu" if gpu_available() else "cpu"
    if device == "cpu":
        return Backend(np, DTYPES[dtype], "cpu")
    if device == "gpu":
        if not gpu_available():
            raise BackendError("--device gpu asked for, but CuPy finds no usable CUDA GPU: "
                               "install the 'gpu' extra on a GPU machine, or use --device cpu")
        import cupy
        device_id = gpu_id % cupy.cuda.runtime.getDeviceCount()  # ranks of a node take the GPUs in turn
        cupy.cuda.Device(device_id).use()
        return CupyBackend(cupy, DTYPES[dtype], f"gpu:{device_id}")
    raise BackendError(f"unknown device {device!r}: choose cpu, gpu or auto")


def array_module(array: Any) -> ModuleType:
    """NumPy or CuPy, whichever owns ``array`` (Chainer's get_array_module)."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return np
    try:
        import cupy
    except ImportError:
        return np
    return cupy.get_array_module(array)
