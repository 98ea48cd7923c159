"""Balanced shares against equal shares when one rank is slower.

    mpiexec -n 2 python benchmarks/heterogeneous.py [--model vgg11] [--batch-size 32] [--slowdown 3] [--steps 6]

The last rank is made ``--slowdown`` times slower than it measures itself to be, by extra
work per sample it loads (a ``SlowedDataset``). The same trainer then runs ``--steps``
steps with equal shares, and as many with shares that follow the measured speeds (after
the balancer's warm-up). Prints the median step of each, the reduction, and each rank's
median time blocked in collectives per step: the straggler wait that balancing removes.

The last line is ``verdict: faster`` when balancing moved samples off the slow rank and
shortened the step. Otherwise it is ``verdict: unmoved`` (the shares stayed) or
``verdict: slower`` (the step grew), a line on stderr says so, and every rank exits 1.
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

FASTER = "faster"
VERDICTS = {FASTER: "balancing moved samples off the slow rank and shortened the step",
            "slower": "balancing moved samples off the slow rank but made the step slower",
            "unmoved": "balancing did not move samples off the slow rank"}


def verdict_of(equal: list[int], balanced: list[int], slow: int, plain: float, tuned: float) -> str:
    """'faster' when balancing gave the slow rank fewer samples and shortened the median step;
    'unmoved' when it did not take samples off the slow rank; 'slower' when it did, but the step grew."""
    if balanced[slow] >= equal[slow]:
        return "unmoved"
    return FASTER if tuned < plain else "slower"


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
    # Every rank has the same shares; the step times are rank 0's, as it prints them.
    plain, tuned = comm.broadcast_object((statistics.median(equal), statistics.median(balanced)))
    equal_shares = partition(args.batch_size, [1.0] * comm.size)
    balanced_shares = partition(args.batch_size, trainer.share_weights)
    verdict = verdict_of(equal_shares, balanced_shares, slow, plain, tuned)
    if comm.rank == 0:
        print(f"{args.model}, global batch {args.batch_size}, {comm.size} ranks; rank {slow} made {args.slowdown:g}x "
              f"slower ({(args.slowdown - 1) * per_sample * 1e3:.1f} ms extra per sample)")
        print(f"equal shares {equal_shares}: step {plain * 1e3:.1f} ms (median of {args.steps})")
        print(f"balanced shares {balanced_shares}: step {tuned * 1e3:.1f} ms (median of {args.steps})")
        change = 1 - tuned / plain
        print(f"step time {'reduced' if change >= 0 else 'increased'} by {abs(change):.1%}")
        for rank, (before, after) in enumerate(waits):
            print(f"rank {rank}: blocked in collectives {before * 1e3:.1f} ms per step with equal shares, "
                  f"{after * 1e3:.1f} ms balanced")
        print(f"verdict: {verdict}", flush=True)
        if verdict != FASTER:
            print(f"heterogeneous: {VERDICTS[verdict]}", file=sys.stderr, flush=True)
    if verdict != FASTER:
        sys.exit(1)


if __name__ == "__main__":
    main()
