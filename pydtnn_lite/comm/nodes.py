"""Which node a rank runs on, and the link of an emulated cluster.

Ranks normally share a node when they share a host name. An emulated cluster
(launch/emulated-cluster.sh) runs its nodes as network namespaces of one machine, which
the host name and MPI's shared-memory split cannot tell apart, so its launcher names each
rank's node in :data:`NODE_VARIABLE` and the rate of its links in :data:`LINK_VARIABLE`.
"""
from __future__ import annotations

import os
import platform

NODE_VARIABLE = "PYDTNN_LITE_NODE"  # the emulated node's index, set by the launcher
LINK_VARIABLE = "PYDTNN_LITE_LINK_GBIT"  # the emulated links' rate in Gbit/s


def node_name() -> str:
    """The name of this rank's node: ranks with equal names share a node."""
    emulated = os.environ.get(NODE_VARIABLE)
    return f"{platform.node()}/emulated-node-{emulated}" if emulated else platform.node()


def emulated_link_gbit() -> float | None:
    """The emulated cluster's link rate in Gbit/s; None outside an emulated cluster."""
    rate = os.environ.get(LINK_VARIABLE)
    return float(rate) if rate else None
