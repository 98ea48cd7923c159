"""The scalability study of the paper's Section 4, run on the model.

A training step of each CNN is predicted on a baseline cluster (AMPERE by default) while
one parameter at a time is swept: the per-node batch, the node's peak FLOP/s and memory
bandwidth, the link bandwidth, and the number of nodes (with the per-node batch fixed,
so the global batch grows with the cluster). Each point is split into computation (FP,
BP and WU kernels) and communication (Allreduce of gradients, batch-norm sums, loss).
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pydtnn_lite.costs import ALLREDUCE, COMPUTE_STAGES, Stage
from pydtnn_lite.perfmodel.modelling.clusters import GBIT, Cluster
from pydtnn_lite.perfmodel.modelling.machines import cluster_machine
from pydtnn_lite.perfmodel.modelling.prediction import predict_step
from pydtnn_lite.perfmodel.modelling.workload import build_workload

BASELINE_BATCH = 128  # per node, as in the paper
SCALES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
SWEEPS = {
    "batch": (16, 32, 64, 128, 256, 512),
    "peak_flops": SCALES,  # times the baseline
    "memory_bandwidth": SCALES,
    "link_bandwidth_gbps": (1, 10, 25, 50, 100, 200, 400),
    "nodes": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
}


@dataclass(frozen=True)
class Point:
    """One predicted step of the study."""

    model: str
    dataset: str
    parameter: str
    value: float
    computation: float  # seconds
    communication: float
    step_with_overlap: float

    @property
    def step_without_overlap(self) -> float:
        return self.computation + self.communication


def _setting(cluster: Cluster, parameter: str, value: float) -> tuple[Cluster, int]:
    """The cluster and per-node batch of one point of a sweep."""
    if parameter == "batch":
        return cluster, int(value)
    if parameter == "link_bandwidth_gbps":
        return replace(cluster, link_bandwidth=value * GBIT), BASELINE_BATCH
    if parameter == "nodes":
        return replace(cluster, nodes=int(value)), BASELINE_BATCH
    return replace(cluster, **{parameter: getattr(cluster, parameter) * value}), BASELINE_BATCH


def study(models: Iterable[str], datasets: Iterable[str], cluster: Cluster) -> list[Point]:
    """Every sweep for every model and data set."""
    points = []
    for dataset in datasets:
        for model in models:
            network, optimizer = build_workload(model, dataset)
            for parameter, values in SWEEPS.items():
                for value in values:
                    setting, batch = _setting(cluster, parameter, value)
                    step = functools.partial(predict_step, network, optimizer, batch, setting.nodes,
                                             cluster_machine(setting))
                    # The split is that of a step without overlap, from a prediction of its own:
                    # where the batch norms' reductions advance the buckets, an overlapped
                    # prediction's kernels hold that work (ResNet-50 on ALTEC: 27 % too long).
                    blocking = step(overlap=False)
                    computation = sum(blocking.stage_seconds[s] for s in COMPUTE_STAGES)
                    communication = blocking.step_without_overlap - computation
                    reductions = sum(k.seconds for k in blocking.kernels if k.kernel == ALLREDUCE
                                     and k.stage != Stage.COMM)  # batch-norm sums, counted in FP and BP
                    points.append(Point(model, dataset, parameter, value, computation - reductions,
                                        communication + reductions, step(overlap=True).step_with_overlap))
    return points
