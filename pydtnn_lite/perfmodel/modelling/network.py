"""Two-level reductions predicted from Allreduce timed between nodes and inside them.

A calibration run on several nodes (launch/emulated-cluster.sh emulates them on one
machine) records :class:`NetworkTimings`: Allreduce among one rank per node, over the
network, and inside each node the reduce to its leader and the broadcast back. The
hierarchical strategy runs exactly those, so its time is predicted as the two levels'
sum. The flat reduction is the job-wide Allreduce the calibration timed on all its ranks.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from pydtnn_lite.perfmodel.modelling.allreduce import AllreduceTime, InterpolatedAllreduce, fit_allreduce
from pydtnn_lite.perfmodel.modelling.channel import NO_TRANSFER_COST, TransferCost
from pydtnn_lite.perfmodel.modelling.placement import Placement
from pydtnn_lite.perfmodel.modelling.synchronization import SyncWaitModel, fit_sync_wait

# The flat reduction's transfer cost sits in the network record under these keys (files
# written before the pipeline's cost was recorded beside it as a record of its own).
FLAT_TRANSFER_KEYS = {"cpu_per_byte": "transfer_cpu_per_byte", "window_bytes": "window_bytes",
                      "post_seconds": "post_seconds", "in_tests": "transfer_in_tests",
                      "start_seconds": "transfer_start_seconds", "post_test_seconds": "transfer_post_test_seconds"}


@dataclass(frozen=True)
class NetworkTimings:
    """``nodes`` nodes of ``ranks_per_node`` ranks, joined by links of ``link_gbit`` Gbit/s
    (None when not emulated); ``inter_node`` holds (bytes, seconds) of Allreduce among one
    rank per node, ``intra_node`` of a Reduce then Bcast among the ranks of each node at
    once (an Allreduce in files written before 2026-11-26, half the bytes moved; empty with
    one rank per node). ``transfer`` is what moving a bucket over the network costs a rank that
    computes meanwhile: CPU per byte of the bucket, in the tests that move it and in the
    kernels the network stack interrupts, and the bucket bytes the link moves at most
    between two tests (no cost and no limit in files written before they were measured).
    ``ranks_per_host`` ranks shared the cores of the machine that measured it: all of them
    on an emulated cluster, whose nodes are one machine's (None in files written before it
    was recorded). Where they time-shared the cores, ``straggler_waits`` holds (seconds of
    work, mean seconds waited for the slowest rank) after stretches of work on all the
    ranks at once (empty otherwise, and in files written before they were measured).
    ``two_level_transfer`` is ``transfer`` measured through the hierarchical strategy's
    pipelined reductions, whose levels inside the nodes take the ranks' cores in the calls
    that post and test the buckets (None with one rank per node, and in files written
    before it was measured)."""

    nodes: int
    ranks_per_node: int
    link_gbit: float | None
    inter_node: tuple[tuple[float, float], ...]
    intra_node: tuple[tuple[float, float], ...] = ()
    transfer: TransferCost = NO_TRANSFER_COST
    ranks_per_host: int | None = None
    straggler_waits: tuple[tuple[float, float], ...] = ()
    two_level_transfer: TransferCost | None = None

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def time_sharing(self, cores: int) -> float:
        """How many ranks shared each of the measuring machine's ``cores`` (1 where each had
        a core of its own, or the file does not say)."""
        return Placement(self.ranks, self.ranks_per_host or 1, cores).time_sharing

    @functools.cached_property
    def straggler_wait(self) -> SyncWaitModel | None:
        """The wait for the slowest rank fitted on ``straggler_waits`` (None without them)."""
        return fit_sync_wait(self.straggler_waits, self.ranks) if self.straggler_waits else None

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node, "link_gbit": self.link_gbit,
                "inter_node": [list(sample) for sample in self.inter_node],
                "intra_node": [list(sample) for sample in self.intra_node],
                **{FLAT_TRANSFER_KEYS[key]: value for key, value in self.transfer.to_dict().items()},
                "ranks_per_host": self.ranks_per_host,
                "straggler_waits": [list(sample) for sample in self.straggler_waits],
                "two_level_transfer": None if self.two_level_transfer is None else self.two_level_transfer.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> NetworkTimings:
        return cls(int(data["nodes"]), int(data["ranks_per_node"]),
                   None if data["link_gbit"] is None else float(data["link_gbit"]),
                   tuple((float(n), float(t)) for n, t in data["inter_node"]),
                   tuple((float(n), float(t)) for n, t in data["intra_node"]),
                   TransferCost.from_dict({key: data.get(stored) for key, stored in FLAT_TRANSFER_KEYS.items()}),
                   None if data.get("ranks_per_host") is None else int(data["ranks_per_host"]),
                   tuple((float(work), float(wait)) for work, wait in data.get("straggler_waits", [])),
                   None if data.get("two_level_transfer") is None
                   else TransferCost.from_dict(data["two_level_transfer"]))


def _level(procs: int, samples: tuple[tuple[float, float], ...]) -> AllreduceTime | None:
    if procs < 2 or not samples:
        return None
    rows = [(procs, n, t) for n, t in samples]
    return InterpolatedAllreduce.from_samples(rows, fit_allreduce(rows))


@dataclass(frozen=True)
class TwoLevelAllreduce:
    """Seconds of a hierarchical reduction: inside the nodes, then among their leaders."""

    timings: NetworkTimings
    inter: AllreduceTime | None
    intra: AllreduceTime | None

    @classmethod
    def from_timings(cls, timings: NetworkTimings) -> TwoLevelAllreduce:
        return cls(timings, _level(timings.nodes, timings.inter_node),
                   _level(timings.ranks_per_node, timings.intra_node))

    def seconds(self, nbytes: float, procs: int) -> float:
        """A reduction of ``nbytes`` over ``procs`` ranks placed as the calibration's
        (ValueError for another count: the levels were timed for that placement)."""
        if procs <= 1:
            return 0.0
        if procs != self.timings.ranks:
            raise ValueError(f"the two-level timings are of {self.timings.nodes} node(s) x "
                             f"{self.timings.ranks_per_node} rank(s), not of {procs} ranks")
        inter = self.inter.seconds(nbytes, self.timings.nodes) if self.inter else 0.0
        intra = self.intra.seconds(nbytes, self.timings.ranks_per_node) if self.intra else 0.0
        return inter + intra
