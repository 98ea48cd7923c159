"""The configuration of one training run, built once from the command line's flags.

Every flag is range-checked as it is parsed (pydtnn_lite/flags.py) and checked against the
others here, before any data is read or collective is entered, so a bad value ends the job
with one line naming it. What follows reads this frozen
record, never the flags.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TypeVar

from pydtnn_lite.data import Augmentation
from pydtnn_lite.errors import UserError
from pydtnn_lite.optim import LearningRateSchedule
from pydtnn_lite.run_record import TRAINING_FLAGS
from pydtnn_lite.training.checkpoint import checkpoint_path
from pydtnn_lite.training.faults import FaultInjection

DEVICES = ("cpu", "gpu", "auto")
T = TypeVar("T")


@dataclass(frozen=True)
class RunConfig:
    """One rank's view of the run: what to train, how, and where its outputs go."""

    model: str
    dataset: str
    data_dir: str | None
    augmentation: Augmentation
    prefetch: int  # training batches read ahead on a background thread
    global_batch: int
    accumulate: int  # micro-batches of global_batch summed into each update
    epochs: int
    steps_per_epoch: int | None
    eval_steps: int | None  # validation batches after each epoch (None: the whole test split; 0: none)
    optimizer: str  # sgd or adam
    momentum: float
    nesterov: bool
    weight_decay: float
    schedule: LearningRateSchedule
    clip_grad_norm: float | None  # the gradient's largest global L2 norm (None: no clipping)
    device: str  # this rank's: cpu, gpu or auto
    comm: str  # the --comm strategy
    dtype: str
    seed: int
    blas_threads: int | None
    share_weights: tuple[float, ...] | None
    balance: str  # on, off, or auto: on for jobs of CPU and GPU ranks without --partition
    balance_warmup: int
    balance_every: int
    bucket_mb: float
    overlap: bool
    collective_timeout: float
    run_dir: str
    checkpoint_dir: str | None
    checkpoint_every: int  # steps between checkpoints (0: at the end of each epoch)
    keep_checkpoints: int  # the last K stay on disk (and the best by validation accuracy)
    resume: str | None  # the checkpoint to continue from
    resume_overrides: frozenset[str]  # training flags (e.g. "--lr") that may differ from the checkpoint's
    load_weights: str | None
    evaluate_only: bool  # evaluate the loaded weights, train nothing
    save_weights: str | None
    progress: bool
    tensorboard: bool  # TensorBoard event files in the run directory
    log_every: int  # steps between progress lines when stdout is not a terminal
    trace: str | None
    trace_skip: int
    trace_steps: int | None
    validate: str | None
    faults: FaultInjection

    @classmethod
    def from_arguments(cls, args: argparse.Namespace, ranks: int, rank: int) -> RunConfig:
        """Check the parsed flags of a job of ``ranks`` ranks and build this rank's configuration.

        Raises UserError naming the first bad flag.
        """
        share_weights = check_partition(args.partition, ranks)
        if args.validate and not args.trace:
            raise UserError("--validate sets a trace against the model: add --trace DIR")
        resume = resume_from(args.resume, args.checkpoint_dir)
        check_evaluate_only(args, resume)
        return cls(
            model=args.model, dataset=args.dataset, data_dir=args.data_dir,
            augmentation=Augmentation(args.random_crop, args.random_flip), prefetch=args.prefetch,
            global_batch=global_batch(args, ranks), accumulate=args.accumulate, epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            eval_steps=args.eval_steps, optimizer=args.optimizer, momentum=args.momentum, nesterov=args.nesterov,
            weight_decay=args.weight_decay,
            schedule=schedule_of(args), clip_grad_norm=args.clip_grad_norm,
            device=device_of_rank(args.device, rank, ranks), comm=args.comm, dtype=args.dtype, seed=args.seed,
            blas_threads=args.blas_threads, share_weights=share_weights,
            balance=args.balance,
            balance_warmup=args.balance_warmup, balance_every=args.balance_every, bucket_mb=args.bucket_mb,
            overlap=not args.no_overlap, collective_timeout=args.collective_timeout, run_dir=args.run_dir,
            checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            resume=resume, resume_overrides=check_overrides(args.resume_override), evaluate_only=args.evaluate_only,
            load_weights=args.load_weights, save_weights=args.save_weights, progress=not args.no_progress,
            log_every=args.log_every, tensorboard=args.tensorboard,
            trace=args.trace, trace_skip=args.trace_skip, trace_steps=args.trace_steps, validate=args.validate,
            faults=FaultInjection(check_rank(args.inject_failure, "--inject-failure", ranks),
                                  check_rank(args.inject_stall, "--inject-stall", ranks),
                                  milliseconds_to_seconds(check_rank(args.inject_delay, "--inject-delay", ranks))))

    def balances(self, mixed_devices: bool) -> bool:
        """Whether the shares follow the ranks' measured speeds, in a job that mixes devices or not."""
        return self.balance == "on" or (self.balance == "auto" and mixed_devices and self.share_weights is None)


def resume_from(resume: str | None, checkpoint_dir: str | None) -> str | None:
    """The checkpoint --resume continues from: its PATH; --checkpoint-dir's without one; with 'auto',
    --checkpoint-dir's when one is there, else none (a fresh start: the first run of a requeued job)."""
    if resume not in ("", "auto"):
        return resume
    if not checkpoint_dir:
        raise UserError(f"--resume {'without a path' if resume == '' else 'auto'} needs --checkpoint-dir")
    if resume == "auto" and not os.path.isfile(checkpoint_path(checkpoint_dir)):
        return None
    return checkpoint_dir


def schedule_of(args: argparse.Namespace) -> LearningRateSchedule:
    """The learning-rate schedule the --lr... flags describe (each flag's own range is checked as it is parsed)."""
    if args.lr_schedule == "cosine" and args.lr_decay_epochs:
        raise UserError("--lr-decay-epochs steps the learning rate down, --lr-schedule cosine lowers it smoothly: "
                        "give one of them")
    if args.lr_schedule == "cosine" and args.min_lr >= args.lr:
        raise UserError(f"--min-lr must be at least 0 and below --lr ({args.lr}), got {args.min_lr}")
    return LearningRateSchedule(args.lr, args.warmup_epochs, tuple(args.lr_decay_epochs), args.lr_decay_factor,
                                cosine_epochs=args.epochs if args.lr_schedule == "cosine" else None,
                                min_lr=args.min_lr)


def check_evaluate_only(args: argparse.Namespace, resume: str | None) -> None:
    """--evaluate-only needs weights to evaluate and a test split to evaluate them on."""
    if not args.evaluate_only:
        return
    if not args.load_weights and resume is None:
        found = f": there is no checkpoint in {args.checkpoint_dir}" if args.resume == "auto" else ""
        raise UserError(f"--evaluate-only evaluates loaded weights: add --load-weights FILE or --resume{found}")
    if args.eval_steps == 0:
        raise UserError("--evaluate-only with --eval-steps 0 evaluates nothing: drop --eval-steps 0")


def global_batch(args: argparse.Namespace, ranks: int) -> int:
    """--batch-size, or --local-batch-size times the ranks; at least one sample per rank."""
    if args.local_batch_size is not None:
        batch = args.local_batch_size * ranks
    else:
        batch = args.batch_size
    if batch < ranks:
        raise UserError(f"the global batch of {batch} is smaller than the {ranks} ranks: "
                        f"use --batch-size {ranks} or more")
    return batch


def check_partition(weights: tuple[float, ...] | None, ranks: int) -> tuple[float, ...] | None:
    """--partition (parsed into weights, each in range) with one weight per rank (None when not given)."""
    if weights is not None and len(weights) != ranks:
        raise UserError(f"--partition needs {ranks} weights (one per rank), got {len(weights)}")
    return weights


def check_rank(rank_value: tuple[int, T] | None, flag: str, ranks: int) -> tuple[int, T] | None:
    """The RANK:VALUE of a fault-injection flag, its rank one of the job's (None when not given)."""
    if rank_value is not None and rank_value[0] >= ranks:
        raise UserError(f"{flag} names rank {rank_value[0]}, but the job has ranks 0 to {ranks - 1}")
    return rank_value


def milliseconds_to_seconds(rank_delay: tuple[int, float] | None) -> tuple[int, float] | None:
    """--inject-delay's (rank, milliseconds per sample) as (rank, seconds per sample)."""
    return None if rank_delay is None else (rank_delay[0], rank_delay[1] / 1e3)


def check_overrides(names: list[str]) -> frozenset[str]:
    """--resume-override's flag names, with their dashes; UserError for one that is no training flag."""
    flags = frozenset(name if name.startswith("--") else f"--{name}" for part in names for name in part.split(",")
                      if name)
    unknown = sorted(flags - set(TRAINING_FLAGS))
    if unknown:
        raise UserError(f"--resume-override takes training flags ({', '.join(f[2:] for f in TRAINING_FLAGS)}); "
                        f"got {', '.join(unknown)}")
    return flags


def device_of_rank(text: str, rank: int, size: int) -> str:
    """This rank's entry of --device: the one value given, or the rank's item of a per-rank list."""
    devices = text.split(",")
    if len(devices) not in (1, size) or any(device not in DEVICES for device in devices):
        raise UserError(f"--device takes cpu, gpu or auto, once or once per rank ({size} here), got {text!r}")
    return devices[0] if len(devices) == 1 else devices[rank]
