"""Machines to predict for: the paper's clusters (its Table 5) and clusters a user describes.

Link bandwidths are stored in bytes/s; the paper quotes Gbit/s.
"""
from __future__ import annotations

from dataclasses import dataclass

GBIT = 1e9 / 8


@dataclass(frozen=True)
class Cluster:
    """Nodes of one accelerator each, joined by links of one bandwidth and latency."""

    name: str
    nodes: int
    peak_flops: float  # FLOP/s per node
    memory_bandwidth: float  # bytes/s per node
    link_bandwidth: float  # bytes/s
    latency: float  # s


PRESETS = {
    # ALTEC: 8 nodes with a V100 each; Infiniband EDR. Alpha and beta are the paper's
    # measured NCCL figures (12.24 Gbit/s, 30 us), not the nominal link.
    "altec": Cluster("altec", 8, 133e12, 900e9, 12.24 * GBIT, 30e-6),
    # AMPERE: the paper's hypothetical 100-node A100 cluster, Infiniband HDR, nominal figures.
    "ampere": Cluster("ampere", 100, 156e12, 1555e9, 400 * GBIT, 0.5e-6),
}
