"""A communicator that times the collectives of another, for the tracer.

The tracer puts one in the gradient synchronizer's place while it is attached, so every
collective of a step (gradient buckets, batch-norm sums, the loss) passes through it;
the requests of non-blocking reductions come back wrapped too, so their progress tests
and waits are timed where the synchronizer calls them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pydtnn_lite.comm import Communicator, Request
from pydtnn_lite.costs import ALLREDUCE_PROGRESS, ALLREDUCE_START, ALLREDUCE_WAIT

# time(kernel, function, args, moved): run function(*args) timed as kernel on the
# communication timeline, ``moved`` the bytes the call moves (None: none counted).
TimeCall = Callable[[str, Callable[..., Any], tuple, Any], Any]


def host_bytes(data: Any) -> int:
    """Bytes of an array, or of a list of float64 host values."""
    return data.nbytes if hasattr(data, "nbytes") else 8 * len(data)


class TracedRequest(Request):
    """A request whose progress tests and wait are timed."""

    def __init__(self, request: Request, time_call: TimeCall) -> None:
        self.request, self.time_call = request, time_call

    def test(self) -> bool:
        return self.time_call(ALLREDUCE_PROGRESS, self.request.test, (), None)

    def wait(self) -> None:
        self.time_call(ALLREDUCE_WAIT, self.request.wait, (), None)

    @property
    def collectives_started(self) -> int:
        return self.request.collectives_started


class TracedCommunicator(Communicator):
    """``inner``'s ranks and collectives; the reductions of a step timed through ``time_call``."""

    def __init__(self, inner: Communicator, time_call: TimeCall) -> None:
        self.inner, self.time_call = inner, time_call
        self.rank, self.size = inner.rank, inner.size
        self.local_rank, self.local_size = inner.local_rank, inner.local_size
        self.oversubscribed = inner.oversubscribed
        self.name = inner.name

    @property
    def blocked_seconds(self) -> float:  # type: ignore[override]
        return self.inner.blocked_seconds

    def allreduce(self, array: Any) -> Any:
        return self.time_call("allreduce", self.inner.allreduce, (array,), host_bytes(array))

    def iallreduce(self, array: Any) -> Request:
        request = self.time_call(ALLREDUCE_START, self.inner.iallreduce, (array,), host_bytes(array))
        return TracedRequest(request, self.time_call)

    def allreduce_host(self, values: Sequence[float]) -> np.ndarray:
        return self.time_call("allreduce", self.inner.allreduce_host, (values,), host_bytes(values))

    def broadcast(self, array: Any, root: int = 0) -> Any:
        return self.inner.broadcast(array, root)

    def allgather_object(self, obj: Any) -> list:
        return self.inner.allgather_object(obj)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.inner.broadcast_object(obj, root)

    def gather_object(self, obj: Any, root: int = 0) -> list | None:
        return self.inner.gather_object(obj, root)

    def barrier(self) -> None:
        self.inner.barrier()

    def split(self, color: int | None, key: int) -> Communicator | None:
        """``inner``'s sub-communicator, untraced: the probes that use one time their own calls."""
        return self.inner.split(color, key)

    def free(self) -> None:
        self.inner.free()

    def abort(self, code: int) -> None:
        self.inner.abort(code)

    def describe(self) -> str:
        return self.inner.describe()
