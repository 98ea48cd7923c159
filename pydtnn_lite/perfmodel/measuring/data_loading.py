"""How long the embedded data sets take to load a batch, on every rank at once as in training."""
from __future__ import annotations

import statistics
import time

import numpy as np

from pydtnn_lite.comm import Communicator
from pydtnn_lite.data import open_dataset

# The data sets a calibration times (file-based ones depend on their files' location), and
# batch sizes that span a rank's share of small and large global batches.
TIMED = {"synthetic": (4, 16, 64, 128), "synthetic-imagenet": (2, 4, 8), "digits": (4, 16, 64, 128)}
REPEATS = 3


def time_data_loading(comm: Communicator, timed: dict[str, tuple[int, ...]] = TIMED,
                      repeats: int = REPEATS) -> dict[str, list[tuple[float, float]]]:
    """(samples, median seconds) of loading batches of each data set of ``timed``, the
    median over the ranks, which load at once (collective; every rank gets the samples)."""
    mine: dict[str, list[float]] = {}
    for name, sizes in timed.items():
        data = open_dataset(name)
        for size in sizes:
            seconds = []
            for repeat in range(repeats + 1):  # the first call warms the allocator
                indices = (np.arange(size) + repeat * size) % len(data)
                comm.barrier()
                started = time.perf_counter()
                data.load(indices)
                seconds.append(time.perf_counter() - started)
            mine.setdefault(name, []).append(statistics.median(seconds[1:]))
    everyone = comm.allgather_object(mine)
    return {name: [(float(size), float(np.median([rank[name][i] for rank in everyone])))
                   for i, size in enumerate(sizes)] for name, sizes in timed.items()}
