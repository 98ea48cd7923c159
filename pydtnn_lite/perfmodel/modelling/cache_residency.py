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
backward of its last layer; an update's as the previous step's update wrote it, a whole
step before.
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
    eviction of the caches."""

    ranks: int
    sizes: tuple[int, ...]
    resident: Mapping[str, Sequence[float]] = field(default_factory=dict)
    evicted: Mapping[str, Sequence[float]] = field(default_factory=dict)

    def ratio(self, kernel: str, nbytes: float) -> float:
        """Resident over evicted seconds of ``kernel`` on a gradient of ``nbytes``:
        interpolated in the sizes' logarithm, held at the smallest and largest size, at
        most 1 (a resident call slower than an evicted one is the machine's noise); 1 for
        a kernel not timed."""
        if kernel not in self.resident or not self.sizes:
            return 1.0
        ratios = np.minimum(np.asarray(self.resident[kernel]) / np.asarray(self.evicted[kernel]), 1.0)
        return float(np.interp(np.log(max(nbytes, 1.0)), np.log(self.sizes), ratios))

    def factor(self, kernel: str, nbytes: float, moved: float, cache_bytes: float) -> float:
        """What a call of ``kernel`` on a gradient of ``nbytes`` takes against its evicted
        time, where the node's ranks moved ``moved`` bytes since its data's last use, the
        call's own included: :meth:`ratio` where that fits in ``cache_bytes``, else 1."""
        return self.ratio(kernel, nbytes) if 0 < moved <= cache_bytes else 1.0

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "sizes": list(self.sizes),
                "resident": {name: list(seconds) for name, seconds in sorted(self.resident.items())},
                "evicted": {name: list(seconds) for name, seconds in sorted(self.evicted.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> CacheResidency:
        sizes = tuple(int(n) for n in data["sizes"])
        resident = {name: tuple(float(s) for s in seconds) for name, seconds in data["resident"].items()}
        evicted = {name: tuple(float(s) for s in seconds) for name, seconds in data["evicted"].items()}
        if set(resident) != set(evicted) or any(len(seconds) != len(sizes)
                                                for seconds in (*resident.values(), *evicted.values())):
            raise ValueError("cache_residency: a kernel's resident and evicted seconds must cover its sizes")
        return cls(int(data["ranks"]), sizes, resident, evicted)
