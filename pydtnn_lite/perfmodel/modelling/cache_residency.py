"""A bucket's Allreduce and a layer's update with their data still in the cache, and when a step leaves it there.

``calibrate`` times the Allreduce of a gradient bucket and the optimizer's update with
the caches evicted before each call (``measuring/allreduce_timing.py``,
``measuring/sampling.py``), as a network larger than the last-level cache leaves them.
A small network leaves them in the cache instead: MLP's whole step fits in 300 MiB of
L3, and its update and COMM came out at 0.64 and 0.63 of the evicted prediction
(docs/performance.md, 'A step that fits in the cache'). The calibration's
:class:`CacheResidency` holds both kernels timed both ways at a few gradient sizes; a
prediction scales a call's evicted time by the ratio at its size where its data is still
resident when the call comes.

Resident means: what the node's ranks moved since the data's last use, the call's own
bytes included, fits in the last-level cache (a least-recently-used cache with the bytes
moved as the reuse distance; they count data moved twice twice, so the rule errs towards
evicted). A bucket's data was last used as backward wrote it, from the start of the
backward of its last layer; an update's state as the previous step's update wrote it, a
whole step before, its parameter and gradient by its layer's backward (the prediction
weighs the two ages by their bytes).

Time since that use counts too. A virtual machine's last-level cache is its host's, shared
with other tenants whose traffic goes on while a step computes: on the Xeon with 300 MiB
of L3 (2026-12-06) a 6 MiB update took 1.2 ms with its data just used, 1.7 ms after a
10 ms spin that moved nothing, and 1.8-1.9 ms evicted, as MLP's update took in a step
10 ms after its last one. The record also holds each kernel timed after ``idle_seconds``
of waiting since its data's last use; a call's ratio follows its own time since then,
between the resident ratio at no wait and the longest wait's beyond it.

An evicted update is timed after an update of other arrays, as the calibration samples
updates (``warm_evicted_updates``); records written before 2026-12-07 timed it
as the first call after the eviction, 85-90 us slower, so their ratios put small updates
too far below the samples' time.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CacheResidency:
    """Each kernel's median seconds (``resident``, ``evicted``: by kernel name, one per
    size) on gradients of ``sizes`` bytes, on ``ranks`` ranks of one node at once: with the
    gradient just written and the rest of the data used by the call before, and after an
    eviction of the caches; ``idle`` (by kernel name, one row of sizes per wait of
    ``idle_seconds``) as resident, after the rank waited that long busy since the data's
    last use (empty in records written before 2026-12-06: resident at any wait).
    ``warm_evicted_updates``: the evicted updates followed an update of other arrays (false
    in records written before 2026-12-07)."""

    ranks: int
    sizes: tuple[int, ...]
    resident: Mapping[str, Sequence[float]] = field(default_factory=dict)
    evicted: Mapping[str, Sequence[float]] = field(default_factory=dict)
    idle_seconds: tuple[float, ...] = ()
    idle: Mapping[str, Sequence[Sequence[float]]] = field(default_factory=dict)
    warm_evicted_updates: bool = False

    def ratio(self, kernel: str, nbytes: float, since_use: float = 0.0) -> float:
        """Resident over evicted seconds of ``kernel`` on a gradient of ``nbytes``, its data
        last used ``since_use`` seconds before: interpolated in the sizes' logarithm, held
        at the smallest and largest size, then in the wait between no wait (resident) and
        the timed waits, held at the longest; never below a shorter wait's ratio (a longer
        wait cannot bring data back) and at most 1 (a resident call slower than an evicted
        one is the machine's noise); 1 for a kernel not timed."""
        if kernel not in self.resident or not self.sizes:
            return 1.0
        evicted = np.asarray(self.evicted[kernel])
        rows = [self.resident[kernel], *self.idle.get(kernel, ())]
        log_size = np.log(max(nbytes, 1.0))
        at_size = [float(np.interp(log_size, np.log(self.sizes), np.minimum(np.asarray(row) / evicted, 1.0)))
                   for row in rows]
        waits = (0.0, *self.idle_seconds[:len(rows) - 1])
        return float(np.interp(since_use, waits, np.maximum.accumulate(at_size)))

    def factor(self, kernel: str, nbytes: float, moved: float, cache_bytes: float, since_use: float = 0.0) -> float:
        """What a call of ``kernel`` on a gradient of ``nbytes`` takes against its evicted
        time, where the node's ranks moved ``moved`` bytes since its data's last use, the
        call's own included, ``since_use`` seconds before: :meth:`ratio` where that fits in
        ``cache_bytes``, else 1."""
        return self.ratio(kernel, nbytes, since_use) if 0 < moved <= cache_bytes else 1.0

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "sizes": list(self.sizes),
                "resident": {name: list(seconds) for name, seconds in sorted(self.resident.items())},
                "evicted": {name: list(seconds) for name, seconds in sorted(self.evicted.items())},
                "idle_seconds": list(self.idle_seconds),
                "idle": {name: [list(row) for row in rows] for name, rows in sorted(self.idle.items())},
                "warm_evicted_updates": self.warm_evicted_updates}

    @classmethod
    def from_dict(cls, data: dict) -> CacheResidency:
        sizes = tuple(int(n) for n in data["sizes"])
        resident = {name: tuple(float(s) for s in seconds) for name, seconds in data["resident"].items()}
        evicted = {name: tuple(float(s) for s in seconds) for name, seconds in data["evicted"].items()}
        waits = tuple(float(s) for s in data.get("idle_seconds", ()))
        idle = {name: tuple(tuple(float(s) for s in row) for row in rows)
                for name, rows in data.get("idle", {}).items()}
        if set(resident) != set(evicted) or any(len(seconds) != len(sizes)
                                                for seconds in (*resident.values(), *evicted.values())):
            raise ValueError("cache_residency: a kernel's resident and evicted seconds must cover its sizes")
        if not set(idle) <= set(resident) or any(len(rows) != len(waits) or any(len(row) != len(sizes) for row in rows)
                                                 for rows in idle.values()):
            raise ValueError("cache_residency: a kernel's idle seconds must cover every wait and size")
        return cls(int(data["ranks"]), sizes, resident, evicted, waits, idle,
                   bool(data.get("warm_evicted_updates", False)))
