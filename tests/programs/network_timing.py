"""Run on every rank of an emulated cluster as ``network_timing.py OUT.json SIZE...``: times
Allreduce of each SIZE bytes between and inside the nodes, as ``calibrate`` does, and rank 0
writes the timings' record to OUT.json."""
import json
import sys

from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.comm.nodes import node_name
from pydtnn_lite.perfmodel.measuring.network_timing import network_timings
from pydtnn_lite.runtime import install_job_abort, set_blas_threads

comm = MPICommunicator()
install_job_abort(comm, "network_timing")
set_blas_threads(1)
timings = network_timings(comm, node_name(), [int(size) for size in sys.argv[2:]], [])
if comm.rank == 0:
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(timings.to_dict() if timings else None, out)
