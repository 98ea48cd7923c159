"""How long the embedded data sets take to load a batch, on every rank at once as in training."""
from __future__ import annotations

import functools
import statistics

import numpy as np

from pydtnn_lite.comm import Communicator
from pydtnn_lite.data import open_dataset
from pydtnn_lite.perfmodel.measuring.timing import seconds_together
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.training import TrainerSettings, build_trainer

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
                seconds.append(seconds_together(comm, functools.partial(data.load, indices)))
            mine.setdefault(name, []).append(statistics.median(seconds[1:]))
    everyone = comm.allgather_object(mine)
    return {name: [(float(size), float(np.median([rank[name][i] for rank in everyone])))
                   for i, size in enumerate(sizes)] for name, sizes in timed.items()}


# A model whose step is about as long as reading its batch, so that the cost of reading
# ahead shows: the zoo's MLP at 128 samples per rank on the synthetic set.
READ_AHEAD_MODEL, READ_AHEAD_DATASET, READ_AHEAD_SAMPLES = "mlp", "synthetic", 128
READ_AHEAD_STEPS, READ_AHEAD_ROUNDS = 40, 5


def time_read_ahead(comm: Communicator, read_seconds: float, steps: int = READ_AHEAD_STEPS,
                    rounds: int = READ_AHEAD_ROUNDS) -> list[tuple[float, float, float]]:
    """(step seconds reading in the step, step seconds reading ahead, ``read_seconds``) of
    ``rounds`` rounds, each training the probe model ``steps`` steps both ways on every rank
    at once (collective; every rank gets the samples, its steps the slowest rank's).

    ``read_seconds`` is the time to read the probe's batch, from :func:`time_data_loading`.
    A batch read ahead costs the step what the loader thread takes from the cores the ranks
    compute on; where every core runs a rank, the placement alone would say all of it, but
    the loader also runs while the ranks wait for each other, and in what the interpreter
    leaves free. The share the step pays is (ahead - (in step - read)) / read.
    """
    network, _ = build_workload(READ_AHEAD_MODEL, READ_AHEAD_DATASET)
    data = open_dataset(READ_AHEAD_DATASET)
    samples = []
    for round_ in range(rounds + 1):  # the first round warms up
        seconds = []
        for prefetch in (0, 2):
            settings = TrainerSettings(READ_AHEAD_SAMPLES * comm.size, steps_per_epoch=steps, prefetch=prefetch)
            trainer = build_trainer(network, data, settings, comm=comm)
            comm.barrier()
            result = trainer.train_epoch(round_)
            seconds.append(max(comm.allgather_object(result.seconds)) / steps)
        if round_ > 0:
            samples.append((seconds[0], seconds[1], read_seconds))
    return samples


def read_ahead_share(samples: list[tuple[float, float, float]]) -> float:
    """The share of a batch's reading that a step reading ahead pays (the median over the
    samples of :func:`time_read_ahead`, within 0 and 1); 1 without samples."""
    if not samples:
        return 1.0
    shares = [(ahead - (inline - read)) / read for inline, ahead, read in samples if read > 0]
    return float(np.clip(statistics.median(shares), 0.0, 1.0)) if shares else 1.0
