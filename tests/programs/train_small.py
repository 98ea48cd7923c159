"""Train a small network with every layer kind that talks across ranks, then evaluate it;
rank 0 saves the weights and the validation loss and accuracy.

Run as ``[mpiexec -n P] python train_small.py OUT.npz --batch B --steps S [--no-overlap]
[--random-crop PAD] [--random-flip] [--device D[,D...]] [--comm STRATEGY | --staged |
--leaders L0 L1 ...]``. ``--comm`` picks the communicator as the trainer does. ``--staged``
reduces through host buffers and ``--leaders`` in two levels (groups given by each rank's
leader), as GPU ranks do, with MPI at every level, so a CPU can run them. Rank 0 prints
the communicator it trains with.
"""
import argparse

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import make_communicator
from pydtnn_lite.comm.nodes import node_name
from pydtnn_lite.comm.staged import HostStagedCommunicator
from pydtnn_lite.comm.strategy import connect
from pydtnn_lite.comm.two_level import TwoLevelCommunicator
from pydtnn_lite.data import Augmentation, open_dataset
from pydtnn_lite.layers import BatchNorm, Conv2D, Dense, Dropout, Flatten, MaxPool2D, ReLU
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, LearningRateSchedule
from pydtnn_lite.run_config import device_of_rank
from pydtnn_lite.runtime import install_job_abort, set_blas_threads
from pydtnn_lite.training import TrainerSettings, build_trainer


def small_network() -> Network:
    net = Network("small", (8, 8, 1), 10)
    net.add(Conv2D(6, 3, padding=1))
    net.add(BatchNorm())
    net.add(ReLU())
    net.add(MaxPool2D(2))
    net.add(Flatten())
    net.add(Dropout(0.25, seed=5))
    net.add(Dense(32))
    net.add(BatchNorm())
    net.add(ReLU())
    net.add(Dense(10))
    return net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-overlap", action="store_true")
    parser.add_argument("--bucket-mb", type=float, default=0.002)
    parser.add_argument("--weights", type=float, nargs="*", default=None)
    parser.add_argument("--random-crop", type=int, default=0)
    parser.add_argument("--random-flip", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--comm", default=None)
    parser.add_argument("--staged", action="store_true")
    parser.add_argument("--leaders", type=int, nargs="*", default=None)
    args = parser.parse_args()
    comm = make_communicator(timeout=60)
    install_job_abort(comm, "train_small")
    set_blas_threads(1)
    backend = make_backend(device_of_rank(args.device, comm.rank, comm.size), "float32", gpu_id=comm.local_rank)
    if args.comm:
        comm, _, description = connect(comm, backend, args.comm, 1024, node_name(), timeout=60)
    else:
        if args.staged:
            comm = HostStagedCommunicator(backend, timeout=60)
        elif args.leaders:
            comm = TwoLevelCommunicator(backend, args.leaders, "mpi", "mpi", "two-level", timeout=60)
        description = comm.describe()
    if comm.rank == 0:
        print(f"communicator: {description}", flush=True)
    network = small_network().build(backend, seed=comm.rank)  # rank 0's weights win
    comm.broadcast(network.flat_params)
    optimizer = SGD(network, momentum=0.9, weight_decay=1e-4)
    settings = TrainerSettings(args.batch, seed=1, steps_per_epoch=args.steps,
                               share_weights=tuple(args.weights) if args.weights else None,
                               augmentation=Augmentation(args.random_crop, args.random_flip))
    trainer = build_trainer(network, open_dataset("digits"), settings, comm=comm, optimizer=optimizer,
                            schedule=LearningRateSchedule(0.05), bucket_mb=args.bucket_mb, overlap=not args.no_overlap)
    trainer.train_epoch(0)
    # Every rank evaluates its share; the figures are the sums over all ranks.
    validation = trainer.evaluate(open_dataset("digits", "test"), 40, max_steps=3)
    if comm.rank == 0:
        np.savez(args.out, **network.state_dict(), validation=np.array([validation.loss, validation.accuracy]))


if __name__ == "__main__":
    main()
