"""SplitMix64, the counter-based hash behind every random choice the data sets make.

A sample's random values are hashes of its index and a counter, never a generator's state,
so any rank draws any sample's values alone, in any order, in one call per batch. ``mix``
is written once: NumPy runs it on uint64 arrays, and ``mix_compiled`` is the same function
compiled by Numba for the scalar loops of compiled generators.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

WORD_MASK = (1 << 64) - 1  # Python integers to uint64: seeds and epochs wrap
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's counter increment


def mix(x: Any) -> Any:
    """One SplitMix64 step of ``x`` (uint64 scalar or array): every output bit depends on every input bit.

    The counter step is included (``mix(c)`` is SplitMix64's output for state ``c``), so
    ``mix(c), mix(c + GOLDEN), ...`` is its stream; uint64 arithmetic wraps, as the hash needs.
    """
    x = x + GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


mix_compiled = njit(cache=True, inline="always")(mix)
