"""One call timed on every rank at once: the measuring phases' common stopwatch."""
from __future__ import annotations

import time
from collections.abc import Callable

from pydtnn_lite.comm import Communicator


def _nothing() -> None:
    pass


def seconds_together(comm: Communicator, run: Callable[[], object],
                     before: Callable[[], object] = _nothing,
                     synchronize: Callable[[], None] = _nothing) -> float:
    """Seconds of one call of ``run``, started on every rank of ``comm`` at once (after a
    barrier), after ``before()`` prepares it (writes its data, evicts the caches). A GPU's
    work is asynchronous: ``synchronize`` waits for it before the start and before the end."""
    before()
    synchronize()
    comm.barrier()
    started = time.perf_counter()
    run()
    synchronize()
    return time.perf_counter() - started
