"""Reading the next batches on a background thread while the current step computes.

A :class:`Prefetcher` calls ``produce(step)`` for each step in order, at most ``depth``
steps ahead of the one being consumed, and hands each result over with the times its
production began and ended (the tracer draws them on the rank's data track). What a step
receives depends only on ``produce`` and the step, never on ``depth``: runs stay
deterministic for any depth. NumPy releases the GIL in the copies and decoding that
dominate loading, so the thread's work overlaps the step's kernels.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Produced(Generic[T]):
    """One step's item and when (time.perf_counter seconds) its production began and ended."""

    item: T
    started: float
    finished: float


class _Failure:
    """What the thread hands over in place of an item when ``produce`` raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()  # put after the last step's item


class Prefetcher(Generic[T]):
    """Iterates over ``produce(step)`` for ``steps``, produced up to ``depth`` steps ahead on a thread.

    ``depth`` 0 produces each item in the caller's thread when it is asked for. An
    exception raised by ``produce`` is raised again where the item it failed on is taken.
    Call :meth:`close` (or use ``with``) to stop the thread early.
    """

    def __init__(self, produce: Callable[[int], T], steps: Iterable[int], depth: int) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be at least 0, got {depth}")
        self.produce, self.steps, self.depth = produce, iter(steps), depth
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, name="pydtnn-prefetch", daemon=True)
            self._thread.start()

    def _timed(self, step: int) -> Produced[T]:
        started = time.perf_counter()
        item = self.produce(step)
        return Produced(item, started, time.perf_counter())

    def _run(self) -> None:
        try:
            for step in self.steps:
                if self._stop.is_set():
                    return
                self._put(self._timed(step))
        except BaseException as error:  # handed to the consumer, which raises it in the main thread
            self._put(_Failure(error))
            return
        self._put(_END)

    def _put(self, item: object) -> None:
        """Queue ``item``, waiting for room, unless the consumer has stopped (:meth:`close`
        then makes room, so a wait that began before it stopped ends at once)."""
        if not self._stop.is_set():
            self._queue.put(item)

    def __iter__(self) -> Iterator[Produced[T]]:
        return self

    def __next__(self) -> Produced[T]:
        if self._thread is None:
            return self._timed(next(self.steps))
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.error
        return item

    def close(self) -> None:
        """Stop producing and wait for the thread to end."""
        if self._thread is not None:
            self._stop.set()
            # Room for the one item the thread may be waiting to queue: it then sees the stop.
            while not self._queue.empty():
                self._queue.get_nowait()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
