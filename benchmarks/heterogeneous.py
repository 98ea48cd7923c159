"""Balanced shares against equal shares when one rank is slower.

    mpiexec -n 2 python benchmarks/heterogeneous.py [--model vgg11] [--batch-size 32] [--slowdown 3] [--steps 6]

The last rank is made ``--slowdown`` times slower than it measures itself to be, by extra
work per sample it loads (a ``SlowedDataset``). The same trainer then runs ``--steps``
steps with equal shares, and as many with shares that follow the measured speeds (after
the balancer's warm-up). Prints the median step of each, the reduction, and each rank's
median time blocked in collectives per step: the straggler wait that balancing removes.
"""
from __future__ import annotations

import statistics
import sys
import time

from pydtnn_lite.comm import make_communicator
from pydtnn_lite.data import SlowedDataset, partition
from pydtnn_lite.runtime import default_blas_threads, set_blas_threads
from pydtnn_lite.training import Trainer
from pydtnn_lite.training.balance import LoadBalancer

from common import make_trainer, model_parser

WARMUP = 2


def timed_epoch(trainer: Trainer, epoch: int, steps: int) -> tuple[list[float], list[float]]:
    """Wall seconds and seconds blocked in collectives of each of ``steps`` steps on this rank."""
    durations, blocked = [], []
    mark = [time.perf_counter(), trainer.comm.blocked_seconds]

    def on_step(step: int, result: object) -> None:
        now, waited = time.perf_counter(), trainer.comm.blocked_seconds
        durations.append(now - mark[0])
        blocked.append(waited - mark[1])
        mark[:] = [now, waited]

    trainer.steps_per_epoch = steps
    trainer.global_step = epoch * steps
    trainer.train_epoch(epoch, [on_step])
    return durations, blocked


def main() -> None:
    parser = model_parser(__doc__)
    parser.set_defaults(batch_size=32, threads=None)
    parser.add_argument("--slowdown", type=float, default=3.0, help="how many times slower the last rank is made")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per variant")
    args = parser.parse_args()
    comm = make_communicator()
    if comm.size < 2:
        sys.exit("run under mpiexec -n 2 or more: balancing needs ranks")
    set_blas_threads(args.threads or default_blas_threads(comm))
    trainer = make_trainer(args.model, args.dataset, args.batch_size, comm)
    slow = comm.size - 1

    durations, blocked = timed_epoch(trainer, 0, 3)
    per_sample = (durations[-1] - blocked[-1]) / (args.batch_size // comm.size)
    if comm.rank == slow:
        trainer.data = SlowedDataset(trainer.data, (args.slowdown - 1) * per_sample)

    equal, equal_blocked = timed_epoch(trainer, 1, args.steps)
    trainer.balancer = LoadBalancer(comm.size, warmup=WARMUP, every=WARMUP)
    balanced, balanced_blocked = timed_epoch(trainer, 2, WARMUP + args.steps)
    balanced, balanced_blocked = balanced[WARMUP:], balanced_blocked[WARMUP:]

    waits = comm.allgather_object((statistics.median(equal_blocked), statistics.median(balanced_blocked)))
    if comm.rank == 0:
        plain, tuned = statistics.median(equal), statistics.median(balanced)
        print(f"{args.model}, global batch {args.batch_size}, {comm.size} ranks; rank {slow} made {args.slowdown:g}x "
              f"slower ({(args.slowdown - 1) * per_sample * 1e3:.1f} ms extra per sample)")
        print(f"equal shares {partition(args.batch_size, [1.0] * comm.size)}: step {plain * 1e3:.1f} ms (median of "
              f"{args.steps})")
        print(f"balanced shares {partition(args.batch_size, trainer.share_weights)}: step {tuned * 1e3:.1f} ms "
              f"(median of {args.steps})")
        print(f"step time reduced by {1 - tuned / plain:.1%}")
        for rank, (before, after) in enumerate(waits):
            print(f"rank {rank}: blocked in collectives {before * 1e3:.1f} ms per step with equal shares, "
                  f"{after * 1e3:.1f} ms balanced")


if __name__ == "__main__":
    main()
