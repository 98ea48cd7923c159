"""Command line: ``[mpirun -np N] python -m pydtnn_lite.train --model vgg11 [options]``.

Every rank parses the same arguments and builds the same job. Set-up errors (bad
flags, data, paths) are gathered from all ranks and reported once by rank 0 as one
line, and every rank exits with status 2; an unexpected exception on any rank aborts
the whole job (status 1) within seconds.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

import numpy as np

from pydtnn_lite.backend import Backend, make_backend
from pydtnn_lite.comm import Communicator, make_communicator, make_gradient_synchronizer
from pydtnn_lite.comm.strategy import STRATEGIES, connect
from pydtnn_lite.data import Augmentation, Dataset, SlowedDataset, dataset_names, open_dataset, partition
from pydtnn_lite.errors import TrainingError, UserError
from pydtnn_lite.models import create_model, model_names
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, LearningRateSchedule, Optimizer
from pydtnn_lite.runtime import (default_blas_threads, install_job_abort, keep_freed_memory, report_and_abort,
                                 set_blas_threads)
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine
from pydtnn_lite.perfmodel.modelling.trace_validation import validate_trace
from pydtnn_lite.tracing import Tracer, load_trace
from pydtnn_lite.training import History, StepResult, Trainer, load_checkpoint, save_checkpoint
from pydtnn_lite.training.balance import LoadBalancer

PROGRAM = "pydtnn_lite.train"
SETUP_ERROR_EXIT = 2
TRAINING_ERROR_EXIT = 3
STALL_SECONDS = 600  # long enough for any --collective-timeout under test to fire first
T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROGRAM}",
        description="Data-parallel CNN training on NumPy (CPU) or CuPy (GPU); run it under "
                    "mpirun for several ranks. --batch-size is the GLOBAL batch, shared by the ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = parser.add_argument_group("model and data")
    model.add_argument("--model", default="vgg11", metavar="NAME",
                       help=f"network to train, one of: {', '.join(model_names())}")
    model.add_argument("--dataset", default="synthetic", metavar="NAME",
                       help=f"data set, one of: {', '.join(dataset_names())}")
    model.add_argument("--data-dir", default=None, help="directory of file-based data sets")
    model.add_argument("--random-crop", type=int, default=0, metavar="PAD",
                       help="augment training images: pad PAD pixels of zeros on each side, then crop a random "
                            "window of the original size (0: off)")
    model.add_argument("--random-flip", action="store_true",
                       help="augment training images: flip each horizontally with probability 1/2")
    model.add_argument("--summary", action="store_true", help="print the model's layers and FLOPs, then exit")

    schedule = parser.add_argument_group("batches and schedule")
    schedule.add_argument("--batch-size", type=int, default=64, help="global batch size (all ranks together)")
    schedule.add_argument("--local-batch-size", type=int, default=None,
                          help="per-rank batch instead: the global batch becomes this times the ranks")
    schedule.add_argument("--epochs", type=int, default=1)
    schedule.add_argument("--steps-per-epoch", type=int, default=None,
                          help="stop each epoch after this many steps (default: the whole training split)")
    schedule.add_argument("--eval-steps", type=int, default=None,
                          help="validation batches after each epoch (default: the whole test split; 0: none)")

    optim = parser.add_argument_group("optimizer")
    optim.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    optim.add_argument("--lr", type=float, default=0.003, help="base learning rate")
    optim.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0: plain SGD)")
    optim.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    optim.add_argument("--weight-decay", type=float, default=0.0, help="L2 penalty")
    optim.add_argument("--warmup-epochs", type=float, default=0.0, help="linear learning-rate warm-up")
    optim.add_argument("--lr-decay-epochs", type=int, nargs="*", default=[],
                       help="epochs at which the learning rate is multiplied by --lr-decay-factor")
    optim.add_argument("--lr-decay-factor", type=float, default=0.1)

    system = parser.add_argument_group("device and parallelism")
    system.add_argument("--device", default="cpu", metavar="DEVICE[,DEVICE...]",
                        help="cpu, gpu or auto (gpu when CuPy sees one), for every rank or one per rank "
                             "(e.g. cpu,gpu,gpu); under MPMD each program gives its own")
    system.add_argument("--comm", choices=STRATEGIES, default="auto",
                        help="how gradients are summed: mpi (GPU arrays staged through host memory), nccl (GPU "
                             "ranks only), hierarchical (inside nodes, then between them), gpu-side (CPU ranks' "
                             "gradients to a GPU rank, NCCL among GPU ranks); auto: mpi for CPU jobs, nccl for "
                             "GPU jobs, the faster of mpi and gpu-side for mixed jobs")
    system.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    system.add_argument("--seed", type=int, default=0, help="seeds weights, shuffles and dropout")
    system.add_argument("--blas-threads", type=int, default=None,
                        help="BLAS threads per rank (default: the node's cores divided by its ranks)")
    system.add_argument("--partition", default=None, metavar="W,W,...",
                        help="fixed shares of the global batch, one weight per rank (e.g. 1,3 gives rank 1 three "
                             "times rank 0's samples); default equal")
    system.add_argument("--balance", nargs="?", choices=("on", "off", "auto"), const="on", default="auto",
                        help="make the shares follow each rank's measured speed, re-weighted while training; "
                             "auto: on when the job mixes CPU and GPU ranks and --partition is not given")
    system.add_argument("--balance-warmup", type=int, default=3, metavar="N",
                        help="steps measured before the first re-weighting (default 3)")
    system.add_argument("--balance-every", type=int, default=10, metavar="N",
                        help="steps between re-weightings after the warm-up (default 10)")
    system.add_argument("--bucket-mb", type=float, default=4.0, help="gradient Allreduce bucket size, MiB")
    system.add_argument("--no-overlap", action="store_true",
                        help="reduce gradients after backward instead of overlapping with it")
    system.add_argument("--collective-timeout", type=float, default=300.0,
                        help="seconds a rank waits for the others at a step's end before reporting "
                             "the missing ranks and aborting (0: wait forever)")

    output = parser.add_argument_group("output")
    output.add_argument("--run-dir", default="runs", help="where the history file of each run goes")
    output.add_argument("--checkpoint-dir", default=None, help="write checkpoints here")
    output.add_argument("--checkpoint-every", type=int, default=0,
                        help="checkpoint every N steps (0: at the end of each epoch)")
    output.add_argument("--resume", nargs="?", const="", default=None, metavar="PATH",
                        help="continue from a checkpoint (default: the one in --checkpoint-dir)")
    output.add_argument("--load-weights", default=None, help="start from weights saved with --save-weights")
    output.add_argument("--save-weights", default=None, help="write the final weights to this .npz file")
    output.add_argument("--no-progress", action="store_true", help="no progress bar, epoch lines only")

    tracing = parser.add_argument_group("tracing (see docs/tracing.md)")
    tracing.add_argument("--trace", default=None, metavar="DIR",
                         help="record every kernel of every rank; write a Chrome trace, CSV records and a summary here")
    tracing.add_argument("--trace-skip", type=int, default=1, metavar="N",
                         help="warm-up: do not trace the first N training steps of the run (default 1)")
    tracing.add_argument("--trace-steps", type=int, default=None, metavar="M",
                         help="trace at most M training steps (default: all after the warm-up)")
    tracing.add_argument("--validate", default=None, metavar="CALIBRATION",
                         help="after the run, set the trace against the performance model of this calibration file "
                              "(python -m pydtnn_lite.calibrate); needs --trace")

    testing = parser.add_argument_group("fault injection (for testing the job's failure handling)")
    testing.add_argument("--inject-failure", default=None, metavar="RANK:STEP",
                         help="raise an exception on rank RANK after global step STEP")
    testing.add_argument("--inject-delay", default=None, metavar="RANK:MS",
                         help="make rank RANK load each sample MS milliseconds slower (a slower rank, for --balance)")
    testing.add_argument("--inject-stall", default=None, metavar="RANK:STEP",
                         help="make rank RANK hang (sleep) after global step STEP, to test --collective-timeout")
    return parser


def parse_injection(text: Optional[str], flag: str) -> Optional[tuple[int, int]]:
    """'RANK:STEP' as two integers (None when not given)."""
    if text is None:
        return None
    try:
        rank, step = (int(part) for part in text.split(":"))
    except ValueError:
        raise UserError(f"{flag} takes RANK:STEP, e.g. 1:3, got {text!r}") from None
    return rank, step


def parse_partition(text: Optional[str], ranks: int) -> Optional[list[float]]:
    """--partition as one positive weight per rank (None when not given)."""
    if text is None:
        return None
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"--partition takes one number per rank, e.g. 1,3, got {text!r}") from None
    if len(weights) != ranks or min(weights) < 0 or sum(weights) <= 0:
        raise UserError(f"--partition needs {ranks} non-negative weights (one per rank) with a positive sum, "
                        f"got {text!r}")
    return weights


def device_of_rank(text: str, rank: int, size: int) -> str:
    """This rank's entry of --device: the one value given, or the rank's item of a per-rank list."""
    devices = text.split(",")
    if len(devices) not in (1, size) or any(device not in ("cpu", "gpu", "auto") for device in devices):
        raise UserError(f"--device takes cpu, gpu or auto, once or once per rank ({size} here), got {text!r}")
    return devices[0] if len(devices) == 1 else devices[rank]


def parse_delay(text: Optional[str]) -> Optional[tuple[int, float]]:
    """--inject-delay RANK:MS as (rank, seconds per sample)."""
    if text is None:
        return None
    try:
        rank, milliseconds = text.split(":")
        return int(rank), float(milliseconds) / 1e3
    except ValueError:
        raise UserError(f"--inject-delay takes RANK:MS, e.g. 1:2.5, got {text!r}") from None


@dataclass
class Job:
    """Everything one rank needs to train."""

    network: Network
    trainer: Trainer
    optimizer: Optimizer
    test_data: Optional[Dataset]
    history: Optional[History]
    global_batch: int
    blas_threads: int
    reported_shares: Optional[list[int]] = None
    communication: str = ""  # the communicator and the strategy it was chosen by


def check_arguments(args: argparse.Namespace, comm: Communicator) -> int:
    """Validate flag values that need no data; return the global batch size."""
    if args.local_batch_size is not None:
        if args.local_batch_size < 1:
            raise UserError(f"--local-batch-size must be at least 1, got {args.local_batch_size}")
        global_batch = args.local_batch_size * comm.size
    else:
        global_batch = args.batch_size
    if global_batch < comm.size:
        raise UserError(f"the global batch of {global_batch} is smaller than the {comm.size} ranks: "
                        f"use --batch-size {comm.size} or more")
    for flag in ("epochs", "steps_per_epoch", "blas_threads", "checkpoint_every", "eval_steps", "trace_skip",
                 "trace_steps", "balance_warmup", "balance_every"):
        value = getattr(args, flag)
        minimum = 0 if flag in ("checkpoint_every", "eval_steps", "trace_skip") else 1
        if value is not None and value < minimum:
            raise UserError(f"--{flag.replace('_', '-')} must be at least {minimum}, got {value}")
    if args.bucket_mb <= 0:
        raise UserError(f"--bucket-mb must be positive, got {args.bucket_mb}")
    parse_injection(args.inject_failure, "--inject-failure")
    parse_injection(args.inject_stall, "--inject-stall")
    parse_delay(args.inject_delay)
    parse_partition(args.partition, comm.size)
    if args.resume is not None and args.resume == "" and not args.checkpoint_dir:
        raise UserError("--resume without a path needs --checkpoint-dir")
    if args.validate and not args.trace:
        raise UserError("--validate sets a trace against the model: add --trace DIR")
    return global_batch


def check_writable(directory: str, flag: str) -> None:
    """Create ``directory`` and prove a file can be written there."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.unlink(probe)
    except OSError as error:
        raise UserError(f"cannot write to {flag} {directory} ({error.strerror}): choose a writable directory") from None


def prepare_device(args: argparse.Namespace, comm: Communicator) -> tuple[int, Backend]:
    """Check the flags and pick this rank's device: (global batch, backend). No collectives."""
    global_batch = check_arguments(args, comm)
    backend = make_backend(device_of_rank(args.device, comm.rank, comm.size), args.dtype, gpu_id=comm.local_rank)
    return global_batch, backend


def build_job(args: argparse.Namespace, comm: Communicator, backend: Backend, global_batch: int,
              mixed_devices: bool) -> Job:
    """Build the model, data, optimizer and trainer of this rank; raise UserError on bad input.

    No collective may run in here: a rank that fails early would leave the others waiting
    in it instead of in the agreement of :func:`collectively`.
    """
    augmentation = Augmentation(args.random_crop, args.random_flip)
    blas_threads = set_blas_threads(args.blas_threads or default_blas_threads(comm))
    train_data = open_dataset(args.dataset, "train", args.data_dir, seed=args.seed)
    test_data = None if args.eval_steps == 0 else open_dataset(args.dataset, "test", args.data_dir, seed=args.seed)
    try:
        network = create_model(args.model, train_data.input_shape, train_data.num_classes).build(backend, args.seed)
    except UserError:
        raise
    except ValueError as error:
        raise UserError(f"{args.model} does not fit {args.dataset}'s {train_data.input_shape} images: {error}") from None
    if args.optimizer == "sgd":
        optimizer: Optimizer = SGD(network, args.momentum, args.nesterov, args.weight_decay)
    else:
        optimizer = Adam(network, weight_decay=args.weight_decay)
    schedule = LearningRateSchedule(args.lr, args.warmup_epochs, tuple(args.lr_decay_epochs), args.lr_decay_factor)
    synchronizer = make_gradient_synchronizer(network, comm, args.bucket_mb, overlap=not args.no_overlap)
    delay = parse_delay(args.inject_delay)
    if delay is not None and delay[0] == comm.rank:
        train_data = SlowedDataset(train_data, delay[1])
    balance = args.balance == "on" or (args.balance == "auto" and mixed_devices and args.partition is None)
    balancer = LoadBalancer(comm.size, args.balance_warmup, args.balance_every) if balance else None
    trainer = Trainer(network, optimizer, schedule, comm, synchronizer, train_data, global_batch,
                      seed=args.seed, steps_per_epoch=args.steps_per_epoch, augmentation=augmentation,
                      share_weights=parse_partition(args.partition, comm.size), balancer=balancer)
    history = None
    if comm.rank == 0:
        check_writable(args.run_dir, "--run-dir")
        if args.checkpoint_dir:
            check_writable(args.checkpoint_dir, "--checkpoint-dir")
        if args.trace:
            check_writable(args.trace, "--trace")
        if args.validate:
            calibrated_machine(args.validate)  # a bad file is a set-up error, found before training
        if args.save_weights:
            check_writable(os.path.dirname(os.path.abspath(args.save_weights)), "--save-weights")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        history = History(os.path.join(args.run_dir, f"{args.model}-{args.dataset}-{stamp}", "history.jsonl"))
    if args.load_weights:
        try:
            network.load(args.load_weights)
        except (OSError, ValueError) as error:
            raise UserError(f"cannot load --load-weights {args.load_weights}: {error}") from None
    if args.resume is not None:
        trainer.global_step, _ = load_checkpoint(args.resume or args.checkpoint_dir, network, optimizer)
    return Job(network, trainer, optimizer, test_data, history, global_batch, blas_threads)


def collectively(comm: Communicator, action: Callable[[], T]) -> T:
    """Run ``action`` on every rank; if it raised UserError on any, every rank raises the first one."""
    result, message = None, None
    try:
        result = action()
    except UserError as error:
        message = str(error)
    failures = [(rank, m) for rank, m in enumerate(comm.allgather_object(message)) if m is not None]
    if failures:
        rank, first = failures[0]
        prefix = f"rank {rank}: " if comm.size > 1 and len(failures) < comm.size else ""
        raise UserError(prefix + first)
    return result


def say(comm: Communicator, text: str) -> None:
    """Print on rank 0 only."""
    if comm.rank == 0:
        print(text, flush=True)


def train(args: argparse.Namespace, job: Job, comm: Communicator) -> StepResult:
    """The epoch loop: progress, validation, history, checkpoints. Returns the last epoch's training figures."""
    trainer, network = job.trainer, job.network
    shares = job.reported_shares = partition(job.global_batch, trainer.share_weights)
    say(comm, f"{network.name} on {args.dataset} {network.input_shape}: {network.param_count:,} parameters, "
              f"{job.communication}, {job.blas_threads} BLAS threads per rank, device {network.backend.device}")
    say(comm, f"global batch {job.global_batch}, per-rank shares {shares}; {trainer.steps_per_epoch} steps per "
              f"epoch; augmentation: {trainer.augmentation.describe()}; gradients: {trainer.synchronizer.describe()}")
    start_epoch = trainer.global_step // trainer.steps_per_epoch
    if trainer.global_step:
        say(comm, f"resumed at step {trainer.global_step} (epoch {start_epoch + 1})")
    failure = parse_injection(args.inject_failure, "--inject-failure")
    stall = parse_injection(args.inject_stall, "--inject-stall")
    last = StepResult(float("nan"), 0.0, 0)
    started = time.perf_counter()
    total_samples = 0
    for epoch in range(start_epoch, args.epochs):
        bar = make_progress(comm, args, epoch, trainer)
        def on_step(global_step: int, result: StepResult) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{result.loss:.4f}", acc=f"{result.accuracy:.1%}",
                                img_s=f"{result.samples / max(result.seconds, 1e-9):.1f}")
            if args.checkpoint_dir and args.checkpoint_every and global_step % args.checkpoint_every == 0:
                checkpoint(args, job, comm)
            if trainer.rebalanced_at == global_step:
                report_shares(comm, job, global_step)
            if failure == (comm.rank, global_step):
                raise RuntimeError(f"failure injected by --inject-failure after step {global_step}")
            if stall == (comm.rank, global_step):
                time.sleep(STALL_SECONDS)
        last = trainer.train_epoch(epoch, on_step)
        if bar is not None:
            bar.close()
        total_samples += last.samples
        validation = trainer.evaluate(job.test_data, job.global_batch, args.eval_steps) if job.test_data else None
        rate = last.samples / max(last.seconds, 1e-9)
        line = (f"epoch {epoch + 1}/{args.epochs}: loss {last.loss:.4f}, accuracy {last.accuracy:.2%}")
        if validation is not None:
            line += f", validation loss {validation.loss:.4f}, accuracy {validation.accuracy:.2%}"
        line += f"; {rate:.1f} img/s ({rate / comm.size:.1f} per rank), {last.seconds:.2f} s"
        say(comm, line)
        if job.history is not None:
            job.history.append({"epoch": epoch + 1, "step": trainer.global_step, "loss": last.loss,
                                "accuracy": last.accuracy, "seconds": last.seconds, "images_per_second": rate,
                                "validation_loss": validation.loss if validation else None,
                                "validation_accuracy": validation.accuracy if validation else None,
                                "ranks": comm.size, "global_batch": job.global_batch})
        if args.checkpoint_dir and not args.checkpoint_every:
            checkpoint(args, job, comm)
    elapsed = time.perf_counter() - started
    if args.save_weights and comm.rank == 0:
        network.save(args.save_weights)
    say(comm, f"done: {total_samples} samples in {elapsed:.2f} s = {total_samples / max(elapsed, 1e-9):.1f} img/s "
              f"on {comm.size} rank(s); final training loss {last.loss:.4f}, accuracy {last.accuracy:.2%}")
    return last


def checkpoint(args: argparse.Namespace, job: Job, comm: Communicator) -> None:
    if comm.rank == 0:
        save_checkpoint(args.checkpoint_dir, job.network, job.optimizer, job.trainer.global_step,
                        {"model": args.model, "dataset": args.dataset, "global_batch": job.global_batch})


def report_shares(comm: Communicator, job: Job, global_step: int) -> None:
    """Say the per-rank shares after a re-weighting that moved samples between ranks."""
    shares = partition(job.global_batch, job.trainer.share_weights)
    if shares != job.reported_shares:
        speeds = ", ".join(f"{v:.1f}" for v in job.trainer.balancer.speeds)
        say(comm, f"step {global_step}: per-rank shares now {shares} (measured speeds {speeds} img/s per rank)")
        job.reported_shares = shares


def write_trace(args: argparse.Namespace, job: Job, comm: Communicator, tracer: Tracer) -> None:
    """Gather the trace of every rank into ``--trace``, with the description of the run."""
    trainer = job.trainer
    meta = {"model": args.model, "dataset": args.dataset, "global_batch": job.global_batch,
            "shares": partition(job.global_batch, trainer.share_weights), "ranks": comm.size,
            "communicator": comm.describe(), "device": job.network.backend.device, "dtype": args.dtype,
            "blas_threads": job.blas_threads, "optimizer": args.optimizer, "bucket_mb": args.bucket_mb,
            "overlap": not args.no_overlap, "trace_skip": args.trace_skip, "host": platform.node(),
            "processor": platform.processor() or platform.machine(), "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    tracer.save(args.trace, meta)
    say(comm, f"trace of {len(tracer.steps)} step(s) per rank written to {args.trace}: open trace.json in "
              f"https://ui.perfetto.dev; summary: python -m pydtnn_lite.trace summarize {args.trace}")
    if args.validate and comm.rank == 0:
        print(validate_trace(args.trace, load_trace(args.trace), calibrated_machine(args.validate),
                             f"calibration {args.validate}"), flush=True)


def make_progress(comm: Communicator, args: argparse.Namespace, epoch: int, trainer: Trainer):
    if comm.rank != 0 or args.no_progress:
        return None
    from tqdm import tqdm

    done = trainer.global_step % trainer.steps_per_epoch
    return tqdm(total=trainer.steps_per_epoch, initial=done, desc=f"epoch {epoch + 1}/{args.epochs}",
                unit="step", dynamic_ncols=True, file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    comm = make_communicator(timeout=args.collective_timeout)
    install_job_abort(comm, PROGRAM)
    keep_freed_memory()
    if args.summary:
        return print_summary(args, comm)
    try:
        global_batch, backend = collectively(comm, lambda: prepare_device(args, comm))
        bucket_elements = int(args.bucket_mb * (1 << 20)) // np.dtype(backend.dtype).itemsize
        comm, placement, strategy = connect(comm, backend, args.comm, bucket_elements, platform.node(),
                                            args.collective_timeout)
        mixed = bool(placement.cpu_ranks and placement.gpu_ranks)
        job = collectively(comm, lambda: build_job(args, comm, backend, global_batch, mixed))
    except UserError as error:  # every rank raises it: after agreeing in collectively(), or from the same placement
        say(comm, f"{PROGRAM}: error: {error}")
        return SETUP_ERROR_EXIT
    except Exception as error:  # e.g. NCCL failing to start on one rank
        report_and_abort(comm, PROGRAM, error)
    job.communication = strategy
    # Rank 0's weights are everyone's, whatever a rank's RNG, weight file or checkpoint gave.
    comm.broadcast(job.network.flat_params)
    try:
        tracer = Tracer(job.trainer, args.trace_skip, args.trace_steps).attach() if args.trace else None
        train(args, job, comm)
        if tracer is not None:
            tracer.detach()
            write_trace(args, job, comm, tracer)
    except TrainingError as error:  # the loss is global, so every rank raises it at the same step
        say(comm, f"{PROGRAM}: error: {error}")
        return TRAINING_ERROR_EXIT
    except Exception as error:  # on this rank alone: the others would wait forever, so end the job
        report_and_abort(comm, PROGRAM, error)
    return 0


def print_summary(args: argparse.Namespace, comm: Communicator) -> int:
    if comm.rank == 0:
        try:
            data = open_dataset(args.dataset, "train", args.data_dir)
            network = create_model(args.model, data.input_shape, data.num_classes).build(make_backend())
        except UserError as error:
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
            return SETUP_ERROR_EXIT
        print(network.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
