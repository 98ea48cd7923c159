"""Allreduce between the nodes of a job and inside them, for the two-level model.

A job whose ranks sit on several nodes (named by :func:`pydtnn_lite.comm.nodes.node_name`,
e.g. under launch/emulated-cluster.sh) sums a hierarchical reduction in two levels: inside
each node, then among one rank per node. The calibration times both levels as the
hierarchical strategy runs them: Allreduce among the lowest rank of every node (the
leaders), and a Reduce onto the node's lowest rank followed by a Bcast from it among the
ranks of each node, every node at once (where a node has more than one rank). The two
move twice what an Allreduce of two ranks does: on an emulated 2 x 2 cluster a 4 MiB
Reduce and Bcast took 20 ms against 12 ms for the Allreduce, and steps timed against
the Allreduce waited 50-55 ms a bucket where the model gave 44. The job-wide samples of
:mod:`allreduce_timing` serve the flat reduction; with one rank per node they are the
inter-node samples too, and are not timed twice. Beside them it measures what moving
buckets over the network costs the computing ranks (:mod:`transfer_cost`), flat and, where
the nodes hold several ranks, through the hierarchical strategy's pipeline (whose levels
inside the nodes are the ranks' own work, done in the calls that post and test the
buckets), and, where the job's ranks time-share the cores, how long they wait for the
slowest (:mod:`straggler_waits`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.nodes import emulated_link_gbit
from pydtnn_lite.comm.strategy import Placement, node_leaders
from pydtnn_lite.comm.two_level import TwoLevelCommunicator
from pydtnn_lite.perfmodel.measuring.allreduce_timing import time_allreduce
from pydtnn_lite.perfmodel.measuring.machine_state import wait_idly
from pydtnn_lite.perfmodel.measuring.straggler_waits import time_straggler_waits
from pydtnn_lite.perfmodel.measuring.transfer_cost import measure_transfer
from pydtnn_lite.perfmodel.modelling.network import NetworkTimings
from pydtnn_lite.runtime import usable_cores

if TYPE_CHECKING:
    from pydtnn_lite.comm.mpi import MPICommunicator


def network_timings(comm: MPICommunicator, node: str, sizes: Sequence[int],
                    job_samples: Sequence[tuple[int, float, float]]) -> NetworkTimings | None:
    """The inter-node Allreduce and the intra-node Reduce and Bcast of ``sizes`` bytes on the
    nodes of ``comm``'s ranks (``node`` is this rank's node name; ``job_samples`` the
    (ranks, bytes, seconds) already timed on the job's ranks); None when every rank is on
    one node or the nodes hold different numbers of ranks. Collective; every rank gets the
    result."""
    names = comm.allgather_object(node)
    nodes = list(dict.fromkeys(names))
    per_node = {name: names.count(name) for name in nodes}
    if len(nodes) < 2 or len(set(per_node.values())) > 1:
        return None
    ranks_per_node = per_node[node]
    transfer = measure_transfer(comm)
    waits = tuple(time_straggler_waits(comm)) if comm.local_size > usable_cores() else ()
    if ranks_per_node == 1:
        inter_node = tuple((float(n), t) for p, n, t in job_samples if p == comm.size and n in sizes)
        return NetworkTimings(len(nodes), 1, emulated_link_gbit(), inter_node, transfer=transfer,
                              ranks_per_host=comm.local_size, straggler_waits=waits)
    # The hierarchical strategy of CPU ranks on these nodes: MPI at both levels.
    placement = Placement(("cpu",) * comm.size, tuple(nodes.index(name) for name in names))
    hierarchical = TwoLevelCommunicator(make_backend("cpu"), node_leaders(placement), "mpi", "mpi", "hierarchical",
                                        comm, comm.timeout)
    two_level_transfer = measure_transfer(hierarchical)
    hierarchical.free()
    leaders = comm.split(0 if names.index(node) == comm.rank else None, comm.rank)
    inter: list[float] = []
    if leaders is not None:
        inter = time_allreduce(leaders, sizes)
        leaders.free()
    wait_idly(comm)  # the other ranks wait without taking the leaders' cores
    local = comm.split(nodes.index(node), comm.rank)
    assert local is not None
    intra = time_allreduce(local, sizes, reduce=local.reduce_broadcast_bare)
    local.free()
    # Every node timed its own level at once; the step waits for the slowest.
    slowest = [max(column) for column in zip(*comm.allgather_object(intra), strict=True)]
    inter = comm.broadcast_object(inter, root=0)
    return NetworkTimings(len(nodes), ranks_per_node, emulated_link_gbit(),
                          tuple(zip(map(float, sizes), inter, strict=True)),
                          tuple(zip(map(float, sizes), slowest, strict=True)), transfer, comm.local_size, waits,
                          two_level_transfer)
