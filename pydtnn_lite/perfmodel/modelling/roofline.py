"""The roofline: a kernel takes as long as the slower of its arithmetic and its memory traffic."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """A processor described by its peak arithmetic rate and its memory bandwidth."""

    peak_flops: float  # FLOP/s
    memory_bandwidth: float  # bytes/s

    def seconds(self, flops: float, nbytes: float) -> float:
        """Time of a kernel that performs ``flops`` and moves ``nbytes``: flops / min(peak, bw x intensity)."""
        return max(flops / self.peak_flops, nbytes / self.memory_bandwidth)

    def attainable_flops(self, intensity: float) -> float:
        """FLOP/s reachable at ``intensity`` FLOPs per byte."""
        return min(self.peak_flops, self.memory_bandwidth * intensity)


def gemm_intensity(m: int, n: int, k: int, itemsize: int) -> float:
    """FLOPs per byte of an (m x k) @ (k x n) product that reads and writes each operand once."""
    return 2.0 * m * n * k / ((m * n + m * k + n * k) * itemsize)
