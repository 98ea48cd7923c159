"""The one place that decides which array library a process computes with.

Layers, losses and optimizers are written once against the namespace returned by
:func:`array_module`; NumPy runs them on the CPU and CuPy on an NVIDIA GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from pydtnn_lite.errors import UserError

DTYPES = {"float32": np.float32, "float64": np.float64}


class BackendError(UserError):
    """The requested device or dtype cannot be used on this machine."""


@dataclass(frozen=True)
class Backend:
    """Array namespace, dtype and device of one process."""

    xp: ModuleType
    dtype: type
    device: str

    def asarray(self, data: Any) -> Any:
        """Copy host data to this backend's device, in its dtype."""
        return self.xp.asarray(data, dtype=self.dtype)

    def to_host(self, array: Any) -> np.ndarray:
        """Return ``array`` as a NumPy array (a no-op on the CPU)."""
        return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else np.asarray(array)

    def synchronize(self) -> None:
        """Wait until queued device work has finished (a no-op on the CPU)."""
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def clock(self) -> "HostClock":
        """A clock that timestamps kernels on this backend's device."""
        return HostClock() if self.xp is np else DeviceClock(self.xp)


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
        self.origin, self.origin_host = None, 0.0

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
    """Build the backend for ``device`` ('cpu', 'gpu' or 'auto') and ``dtype``."""
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
        cupy.cuda.Device(gpu_id).use()
        return Backend(cupy, DTYPES[dtype], f"gpu:{gpu_id}")
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
