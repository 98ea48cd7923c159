"""The machine a prediction assumes: a preset cluster, figures given on the command line, or a calibration."""
from __future__ import annotations

from typing import Optional

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.allreduce import AllreduceModel, Link
from pydtnn_lite.perfmodel.clusters import PRESETS, Cluster
from pydtnn_lite.perfmodel.prediction import RooflineMachine
from pydtnn_lite.perfmodel.roofline import Roofline


def cluster_machine(cluster: Cluster, algorithm: str = "ring", itemsize: int = 4) -> RooflineMachine:
    """Roofline kernels and an alpha-beta-gamma Allreduce for ``cluster``.

    gamma is the time to reduce one byte at the peak rate: one FLOP per ``itemsize`` bytes.
    """
    link = Link(cluster.latency, 1.0 / cluster.link_bandwidth, 1.0 / (itemsize * cluster.peak_flops))
    return RooflineMachine(Roofline(cluster.peak_flops, cluster.memory_bandwidth),
                           AllreduceModel(algorithm, link, link))


def described_cluster(preset: Optional[str], peak_flops: Optional[float] = None,
                      memory_bandwidth: Optional[float] = None, link_bandwidth: Optional[float] = None,
                      latency: Optional[float] = None, nodes: Optional[int] = None) -> Cluster:
    """A preset (default: ampere) with any of its figures replaced."""
    name = preset or "ampere"
    if name not in PRESETS:
        raise UserError(f"unknown cluster preset {name!r}: choose one of {', '.join(PRESETS)}")
    base = PRESETS[name]
    values = {"peak_flops": peak_flops, "memory_bandwidth": memory_bandwidth, "link_bandwidth": link_bandwidth,
              "latency": latency, "nodes": nodes}
    for flag, value in values.items():
        if value is not None and value <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    changed = {key: value for key, value in values.items() if value is not None}
    return Cluster(**{**base.__dict__, **changed, "name": name if not changed else f"{name} (modified)"})
