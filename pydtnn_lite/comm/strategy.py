"""Which communicator moves the device arrays of a job, from where its ranks run.

``--comm`` names a strategy; every rank learns every rank's device and node first, so
the choice (and any error about it) is the same on all ranks.

| strategy | CPU ranks | GPU ranks |
| --- | --- | --- |
| mpi | MPI | MPI through host buffers (host-staged) |
| nccl | (error) | NCCL |
| hierarchical | MPI in the node, MPI between nodes | NCCL in the node, MPI between nodes |
| gpu-side | MPI to an attached GPU rank | NCCL among the GPU ranks |

``auto`` takes mpi when no rank has a GPU, nccl when all do, and for a job that mixes
them, whichever of mpi and gpu-side reduces a gradient-sized buffer faster here. A CPU
job on several nodes with several ranks on some node may be given a model's choice
between mpi (flat) and hierarchical (``prefer``, e.g. from a calibration's network timings).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydtnn_lite.backend import Backend
from pydtnn_lite.comm.base import Communicator
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.staged import HostStagedCommunicator
from pydtnn_lite.comm.two_level import TwoLevelCommunicator
from pydtnn_lite.errors import UserError

STRATEGIES = ("auto", "mpi", "nccl", "hierarchical", "gpu-side")
TIMING_REPEATS = 3


@dataclass(frozen=True)
class Placement:
    """The device ('cpu' or 'gpu:N') and node (an index) of every rank."""

    devices: tuple[str, ...]
    nodes: tuple[int, ...]

    @property
    def gpu_ranks(self) -> list[int]:
        return [rank for rank, device in enumerate(self.devices) if device.startswith("gpu")]

    @property
    def cpu_ranks(self) -> list[int]:
        return [rank for rank, device in enumerate(self.devices) if not device.startswith("gpu")]


def gather_placement(comm: Communicator, backend: Backend, host: str) -> Placement:
    """Every rank's device and node (ranks whose ``host`` names agree share a node)."""
    pairs = comm.allgather_object((backend.device, host))
    hosts = list(dict.fromkeys(name for _, name in pairs))
    return Placement(tuple(device for device, _ in pairs), tuple(hosts.index(name) for _, name in pairs))


def check_strategy(choice: str, placement: Placement) -> None:
    """Raise UserError when ``choice`` cannot run on ``placement``."""
    if choice not in STRATEGIES:
        raise UserError(f"unknown --comm {choice!r}: choose one of {', '.join(STRATEGIES)}")
    gpus, cpus = placement.gpu_ranks, placement.cpu_ranks
    if choice == "nccl" and cpus:
        raise UserError(f"--comm nccl needs every rank on a GPU, but rank(s) {', '.join(map(str, cpus))} run on "
                        "the CPU: use --comm mpi (host-staged) or --comm gpu-side")
    if choice == "gpu-side" and not gpus:
        raise UserError("--comm gpu-side needs at least one GPU rank: use --device gpu on some ranks, or --comm mpi")
    shared = [key for key, count in Counter(zip(placement.nodes, placement.devices, strict=True)).items()
              if count > 1 and key[1].startswith("gpu")]
    if shared and choice != "mpi":  # every other strategy may put these ranks in one NCCL group
        node, device = shared[0]
        raise UserError(f"NCCL needs one GPU per rank, but several ranks of node {node} share {device}: start no "
                        "more GPU ranks per node than it has GPUs, or use --comm mpi")


def resolve_auto(placement: Placement) -> str:
    """The strategy ``auto`` means for a job that is all CPU or all GPU; '' for a mixed job (timed)."""
    if not placement.gpu_ranks:
        return "mpi"
    if not placement.cpu_ranks:
        return "nccl"
    return ""


def node_leaders(placement: Placement) -> list[int]:
    """The hierarchical groups: each rank's leader is the lowest rank of its node."""
    first: dict[int, int] = {}
    for rank, node in enumerate(placement.nodes):
        first.setdefault(node, rank)
    return [first[node] for node in placement.nodes]


def gpu_leaders(placement: Placement) -> list[int]:
    """The gpu-side groups: every GPU rank leads itself, and the CPU ranks are dealt, in
    turn, to the GPU ranks of their own node (to all GPU ranks where their node has none)."""
    gpus = placement.gpu_ranks
    leader_of = list(range(len(placement.devices)))
    dealt: Counter = Counter()
    for rank in placement.cpu_ranks:
        same_node = [g for g in gpus if placement.nodes[g] == placement.nodes[rank]] or gpus
        leader = min(same_node, key=lambda g: (dealt[g], g))
        dealt[leader] += 1
        leader_of[rank] = leader
    return leader_of


def group_kind(placement: Placement, leader_of: Sequence[int], leader: int) -> str:
    """'nccl' when every rank of ``leader``'s group is a GPU rank, else 'mpi'."""
    members = [rank for rank, lead in enumerate(leader_of) if lead == leader]
    return "nccl" if all(placement.devices[rank].startswith("gpu") for rank in members) else "mpi"


def build_communicator(strategy: str, placement: Placement, backend: Backend, world: MPICommunicator,
                       timeout: float) -> Communicator:
    """This rank's communicator for ``strategy`` (not 'auto') over the ranks of ``world``."""
    if strategy == "nccl":
        from pydtnn_lite.comm.nccl import NCCLCommunicator

        return NCCLCommunicator(backend, world, timeout)
    if strategy == "hierarchical":
        leader_of = node_leaders(placement)
        return TwoLevelCommunicator(backend, leader_of, group_kind(placement, leader_of, leader_of[world.rank]),
                                    "mpi", "hierarchical", world, timeout)
    if strategy == "gpu-side":
        leader_of = gpu_leaders(placement)
        return TwoLevelCommunicator(backend, leader_of, "mpi", "nccl", "gpu-side", world, timeout)
    if backend.on_gpu:
        return HostStagedCommunicator(backend, world, timeout)
    return MPICommunicator(world, timeout)


def fastest(candidates: dict[str, Communicator], elements: int, backend: Backend,
            agree: Callable[[float], float]) -> str:
    """The name of the candidate that sums ``elements`` values fastest; ``agree`` turns this
    rank's seconds into the job's (the slowest rank's), so all ranks pick the same.
    Collective: the others release the MPI communicators they made (a two-level candidate
    makes up to five, and MPI holds a few thousand a process)."""
    timings: dict[str, float] = {}
    for name, comm in candidates.items():
        buffer = backend.xp.zeros(elements, dtype=backend.dtype)
        comm.allreduce(buffer)  # warm-up: connections and buffers
        backend.synchronize()
        began = time.perf_counter()
        for _ in range(TIMING_REPEATS):
            comm.allreduce(buffer)
        backend.synchronize()
        timings[name] = agree((time.perf_counter() - began) / TIMING_REPEATS)
    best = min(timings, key=timings.__getitem__)
    for name, comm in candidates.items():
        if name != best and isinstance(comm, TwoLevelCommunicator):
            comm.free()
    return best


def spans_nodes_in_groups(placement: Placement) -> bool:
    """Whether the ranks sit on several nodes and some node holds several: flat and
    hierarchical reductions then differ."""
    nodes = Counter(placement.nodes)
    return len(nodes) > 1 and max(nodes.values()) > 1


def connect(world: Communicator, backend: Backend, choice: str, bucket_elements: int, host: str,
            timeout: float, prefer: Callable[[Placement], str | None] | None = None,
            ) -> tuple[Communicator, Placement, str]:
    """This rank's communicator for ``--comm choice``, the job's placement, and a line that
    says which strategy was taken.

    Collective: every rank of ``world`` calls it. A single process keeps ``world``; the
    communicators of several ranks span those of ``world``, an MPICommunicator. For a
    mixed job, ``auto`` times mpi and gpu-side on buffers of ``bucket_elements`` values.
    For a CPU job whose nodes hold several ranks, ``auto`` takes ``prefer(placement)``
    where it names a strategy (the same on every rank).
    """
    placement = gather_placement(world, backend, host)
    check_strategy(choice, placement)
    strategy = resolve_auto(placement) if choice == "auto" else choice
    if world.size == 1:
        return world, placement, world.describe()
    if not isinstance(world, MPICommunicator):
        raise TypeError(f"connect: {world.size} ranks need an MPICommunicator, got {type(world).__name__}")
    chosen_by = ""
    if choice == "auto" and strategy == "mpi" and prefer is not None and spans_nodes_in_groups(placement):
        preferred = prefer(placement)
        if preferred:
            strategy, chosen_by = preferred, " (auto: predicted faster by the model)"
    if strategy:
        comm = build_communicator(strategy, placement, backend, world, timeout)
        return comm, placement, f"{comm.describe()}, {strategy} strategy{chosen_by}"
    candidates = {name: build_communicator(name, placement, backend, world, timeout)
                  for name in ("mpi", "gpu-side")}
    mpi = candidates["mpi"]
    best = fastest(candidates, bucket_elements, backend, lambda seconds: max(mpi.allgather_object(seconds)))
    comm = candidates[best]
    return comm, placement, f"{comm.describe()}, {best} strategy (auto: the faster on a bucket here)"
