"""Numba compilations shared out over a host's cores: a process compiles a function that
another is compiling only where a core would idle otherwise, and else waits for it and
reads it from the cache.

``cache=True`` keeps a compiled function's machine code beside its source, so only the
first run after an installation compiles (ResNet18's host kernels: 24-28 s of a 2-rank
job's first 28-31 s, the Zen 3 EPYC, 2026-12-07). But every process that called a function
before the cache held it compiled it as well, and ``mpirun -np 8`` on two cores had all
eight ranks compile every loop, four to a core: 134 s for two steps, where the cache made
them 18 s. Here a process's first call of a function takes the host's lock of that
function (free: nobody is compiling it, so it is in the cache or this process compiles
it) or else one of the host's spare slots, one per core it may run on but the lock
holder's, and compiles it beside the holder; with neither free it waits. Ranks no more
than the cores compile side by side as they did; ranks beyond them wait and then read
the cache (the same job: 47 s). A lock or slot is held for that one call, never across a
collective; a process that dies holding one releases it with its file descriptors.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from numba import njit

POLL_SECONDS = 0.01  # between looks at the lock and the slots: a compilation takes 0.3-12 s


def _took(lock: IO[str]) -> bool:
    """Whether this process now holds ``lock`` (or its file system has none)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # no locks there (ENOLCK): compile as every process did before
        pass
    return True


@contextlib.contextmanager
def compile_turn(function: Callable) -> Iterator[None]:
    """Hold the host's lock of ``function`` or one of its spare slots (see the module's
    docstring), whichever comes free first; neither where the temporary folder cannot hold
    their files, and the process compiles as every process did before."""
    # Imported at a first call: the runtime imports the communicators, whose gradient synchronizer imports the kernels.
    from pydtnn_lite.runtime import usable_cores

    folder = os.path.join(tempfile.gettempdir(), f"pydtnn-lite-numba-{os.getuid()}")
    name = hashlib.sha1(f"{inspect.getfile(function)}:{function.__qualname__}".encode()).hexdigest()[:16]
    with contextlib.ExitStack() as files:
        try:
            os.makedirs(folder, exist_ok=True)
            locks = [files.enter_context(open(os.path.join(folder, file), "a"))
                     for file in [f"{name}.lock"] + [f"slot-{i}.lock" for i in range(1, usable_cores())]]
        except OSError:
            locks = []
        while locks and not any(_took(lock) for lock in locks):
            time.sleep(POLL_SECONDS)
        yield  # closing the files releases the lock taken


class Compiled:
    """A Numba dispatcher whose first call in this process compiles, or reads from the cache,
    in its turn on the host (:func:`compile_turn`; a later signature compiles without waiting)."""

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        functools.update_wrapper(self, dispatcher.py_func)

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher.overloads:
            return self.dispatcher(*args)
        with compile_turn(self.dispatcher.py_func):
            return self.dispatcher(*args)

    @property
    def signatures(self) -> list:
        """The argument types compiled for in this process."""
        return self.dispatcher.signatures


def compiled(**options: Any) -> Callable[[Callable], Compiled]:
    """``numba.njit(cache=True, **options)`` for a function the interpreter calls, its first
    call in its turn on the host (:class:`Compiled`). Functions that only compiled
    code calls stay plain ``njit``: Numba compiles them inside their callers."""
    return lambda function: Compiled(njit(cache=True, **options)(function))
