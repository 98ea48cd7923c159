"""Command line: ``[mpirun -np N] python -m pydtnn_lite.train --model vgg11 [options]``.

Every rank parses the same arguments and builds the same job. Set-up errors (bad
flags, data, paths) are gathered from all ranks and reported once by rank 0 as one
line, and every rank exits with status 2; an unexpected exception on any rank aborts
the whole job (status 1) within seconds; divergence ends every rank with status 3,
SIGTERM or SIGUSR1 with a checkpoint and status 75 (to be requeued), and Ctrl-C with
status 130 (docs/runs.md).
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TypeVar

import numpy as np

from pydtnn_lite import flags
from pydtnn_lite.backend import Backend, make_backend
from pydtnn_lite.cli import command_parser, parse_command_line
from pydtnn_lite.comm import Communicator, make_communicator
from pydtnn_lite.comm.nodes import node_name
from pydtnn_lite.comm.strategy import STRATEGIES, Placement, connect
from pydtnn_lite.data import Dataset, check_test_matches_train, dataset_names, open_dataset, partition
from pydtnn_lite.errors import TrainingError, UserError
from pydtnn_lite.interruption import end_interrupted, interrupt_outside_compilers
from pydtnn_lite.logs import LOGGER, setup_logging
from pydtnn_lite.models import build_model, model_names
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD, Adam, Optimizer
from pydtnn_lite.paths import check_writable, check_writable_file
from pydtnn_lite.perfmodel.measuring.host import blas_info, this_blas_kernels, this_processor
from pydtnn_lite.perfmodel.measuring.kernel_probe import probe_kernels
from pydtnn_lite.perfmodel.measuring.machine_state import StateWatch
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine, faster_strategy
from pydtnn_lite.perfmodel.modelling.placement import Placement as RankPlacement
from pydtnn_lite.perfmodel.modelling.trace_validation import validate_trace
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.progress import ProgressBar, StepLines, make_progress
from pydtnn_lite.resume import resume
from pydtnn_lite.run_config import RunConfig
from pydtnn_lite.run_outputs import open_outputs
from pydtnn_lite.run_record import agree_on_job, flag_values
from pydtnn_lite.runtime import (
    blas_threads_origin,
    default_blas_threads,
    install_job_abort,
    keep_freed_memory,
    report_and_abort,
    set_blas_threads,
    usable_cores,
)
from pydtnn_lite.tracing import Tracer, load_trace
from pydtnn_lite.training import (
    History,
    StepCallback,
    StepResult,
    Trainer,
    TrainerSettings,
    build_trainer,
    save_checkpoint,
)
from pydtnn_lite.training.balance import LoadBalancer
from pydtnn_lite.training.checkpoint import check_finite_weights, read_npz
from pydtnn_lite.training.evaluation import describe_evaluation, evaluation_steps
from pydtnn_lite.training.metrics import StepMetrics
from pydtnn_lite.training.retention import retain
from pydtnn_lite.training.stopping import REQUEUE_EXIT, SignalStop, StopRequested

PROGRAM = "pydtnn_lite.train"
SETUP_ERROR_EXIT = 2
TRAINING_ERROR_EXIT = 3
T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "pydtnn-train",
        "Data-parallel CNN training on NumPy (CPU) or CuPy (GPU); run it under "
        "mpirun for several ranks. --batch-size is the GLOBAL batch, shared by the ranks.",
        logs=True, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = parser.add_argument_group("model and data")
    model.add_argument("--model", default="vgg11", metavar="NAME",
                       help=f"network to train, one of: {', '.join(model_names())}")
    model.add_argument("--dataset", default="synthetic", metavar="NAME",
                       help=f"data set, one of: {', '.join(dataset_names())}")
    model.add_argument("--data-dir", default=None, help="directory of file-based data sets")
    model.add_argument("--random-crop", type=flags.integer(0, 1024), default=0, metavar="PAD",
                       help="augment training images: pad PAD pixels of zeros on each side, then crop a random "
                            "window of the original size (0: off)")
    model.add_argument("--random-flip", action="store_true",
                       help="augment training images: flip each horizontally with probability 1/2")
    model.add_argument("--prefetch", type=flags.integer(0, 1024), default=2, metavar="N",
                       help="read and augment up to N training batches ahead on a background thread while "
                            "a step computes (0: inside the step); the batches are the same for any N")
    model.add_argument("--evaluate-only", action="store_true",
                       help="evaluate the weights of --load-weights or --resume on the test split, then exit")
    model.add_argument("--summary", action="store_true", help="print the model's layers and FLOPs, then exit")

    schedule = parser.add_argument_group("batches and schedule")
    schedule.add_argument("--batch-size", type=flags.COUNT, default=64, help="global batch size (all ranks together)")
    schedule.add_argument("--local-batch-size", type=flags.COUNT, default=None,
                          help="per-rank batch instead: the global batch becomes this times the ranks")
    schedule.add_argument("--accumulate", type=flags.COUNT, default=1, metavar="K",
                          help="sum the gradients of K batches of --batch-size before each update: the same update "
                               "as a batch K times larger (batch-norm statistics excepted), in the memory of one")
    schedule.add_argument("--epochs", type=flags.COUNT, default=1)
    schedule.add_argument("--steps-per-epoch", type=flags.COUNT, default=None,
                          help="stop each epoch after this many steps (default: the whole training split)")
    schedule.add_argument("--eval-steps", type=flags.OPTIONAL_COUNT, default=None,
                          help="validation batches after each epoch (default: the share of the test split that an "
                               "epoch trains of the training split, so all of it unless --steps-per-epoch cuts "
                               "epochs short; 0: none)")

    optim = parser.add_argument_group("optimizer")
    optim.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    optim.add_argument("--lr", type=flags.real(0.0, 1e6, above=True), default=0.003, help="base learning rate")
    optim.add_argument("--momentum", type=flags.real(0.0, 1.0), default=0.9, help="SGD momentum (0: plain SGD)")
    optim.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    optim.add_argument("--weight-decay", type=flags.real(0.0, 1.0), default=0.0, help="L2 penalty")
    optim.add_argument("--warmup-epochs", type=flags.real(0.0, 1e6), default=0.0, help="linear learning-rate warm-up")
    optim.add_argument("--lr-decay-epochs", type=flags.COUNT, nargs="*", default=[],
                       help="epochs at which the learning rate is multiplied by --lr-decay-factor")
    optim.add_argument("--lr-decay-factor", type=flags.real(0.0, 1.0, above=True), default=0.1)
    optim.add_argument("--lr-schedule", choices=("step", "cosine"), default="step",
                       help="after the warm-up: step (multiply by --lr-decay-factor at --lr-decay-epochs) or cosine "
                            "(half a cosine from --lr down to --min-lr at the end of the last epoch)")
    optim.add_argument("--min-lr", type=flags.real(0.0, 1e6), default=0.0,
                       help="the learning rate cosine decay ends at")
    optim.add_argument("--clip-grad-norm", type=flags.real(0.0, 1e12, above=True), default=None, metavar="MAX",
                       help="scale the gradient (summed over the ranks) down to this global L2 norm when larger")

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
    system.add_argument("--seed", type=flags.SEED, default=0, help="seeds weights, shuffles and dropout")
    system.add_argument("--blas-threads", type=flags.integer(1, 4096), default=None,
                        help="BLAS threads per rank (default: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS when set, "
                             "else the node's cores divided by its ranks)")
    system.add_argument("--partition", type=flags.weights(), default=None, metavar="W,W,...",
                        help="fixed shares of the global batch, one weight per rank (e.g. 1,3 gives rank 1 three "
                             "times rank 0's samples); default equal")
    system.add_argument("--balance", nargs="?", choices=("on", "off", "auto"), const="on", default="auto",
                        help="make the shares follow each rank's measured speed, re-weighted while training; "
                             "auto: on when the job mixes CPU and GPU ranks and --partition is not given")
    system.add_argument("--balance-warmup", type=flags.COUNT, default=3, metavar="N",
                        help="steps measured before the first re-weighting (default 3)")
    system.add_argument("--balance-every", type=flags.COUNT, default=10, metavar="N",
                        help="steps between re-weightings after the warm-up (default 10)")
    system.add_argument("--bucket-mb", type=flags.BUCKET_MIB, default=4.0, help="gradient Allreduce bucket size, MiB")
    system.add_argument("--no-overlap", action="store_true",
                        help="reduce gradients after backward instead of overlapping with it")
    system.add_argument("--collective-timeout", type=flags.real(0.0, 1e6), default=300.0,
                        help="seconds a rank waits for the others at a step's end before reporting "
                             "the missing ranks and aborting (0: wait forever)")

    output = parser.add_argument_group("output")
    output.add_argument("--run-dir", default="runs", help="where the history file of each run goes")
    output.add_argument("--tensorboard", action="store_true",
                        help="also write each step's figures as TensorBoard event files into the run directory "
                             "(needs pip install 'pydtnn_lite[tensorboard]')")
    output.add_argument("--checkpoint-dir", default=None, help="write checkpoints here")
    output.add_argument("--checkpoint-every", type=flags.OPTIONAL_COUNT, default=0,
                        help="checkpoint every N steps (0: at the end of each epoch)")
    output.add_argument("--keep-checkpoints", type=flags.COUNT, default=1, metavar="K",
                        help="keep the last K checkpoints as checkpoint-step<N>.npz beside checkpoint.npz (the "
                             "newest); the best by validation accuracy stays as checkpoint-best.npz")
    output.add_argument("--resume", nargs="?", const="", default=None, metavar="PATH",
                        help="continue from a checkpoint (default: the one in --checkpoint-dir); auto: from "
                             "--checkpoint-dir's when one is there, else start fresh (one script for the first run "
                             "and every requeue)")
    output.add_argument("--resume-override", action="append", default=[], metavar="FLAG[,FLAG...]",
                        help="on --resume, continue with these training flags changed from the checkpoint's "
                             "(e.g. lr,seed); any other difference is refused")
    output.add_argument("--load-weights", default=None, help="start from weights saved with --save-weights")
    output.add_argument("--save-weights", default=None, help="write the final weights to this .npz file")
    output.add_argument("--no-progress", action="store_true", help="no progress bar or step lines, epoch lines only")
    output.add_argument("--log-every", type=flags.COUNT, default=50, metavar="N",
                        help="when stdout is not a terminal: a line every N steps in place of the progress bar")

    tracing = parser.add_argument_group("tracing (see docs/tracing.md)")
    tracing.add_argument("--trace", default=None, metavar="DIR",
                         help="record every kernel of every rank; write a Chrome trace, CSV records and a summary here")
    tracing.add_argument("--trace-skip", type=flags.OPTIONAL_COUNT, default=1, metavar="N",
                         help="warm-up: do not trace the first N training steps of the run (default 1)")
    tracing.add_argument("--trace-steps", type=flags.COUNT, default=None, metavar="M",
                         help="trace at most M training steps (default: all after the warm-up)")
    tracing.add_argument("--validate", default=None, metavar="CALIBRATION",
                         help="after the run, set the trace against the performance model of this calibration file "
                              "(python -m pydtnn_lite.calibrate), or of a folder's file measured on this processor; "
                              "needs --trace")

    testing = parser.add_argument_group("fault injection (for testing the job's failure handling)")
    testing.add_argument("--inject-failure", metavar="RANK:STEP",
                         type=flags.rank_value(flags.OPTIONAL_COUNT, "1:3"), default=None,
                         help="raise an exception on rank RANK after global step STEP")
    testing.add_argument("--inject-delay", metavar="RANK:MS",
                         type=flags.rank_value(flags.real(0.0, 1e6), "1:2.5"), default=None,
                         help="make rank RANK load each sample MS milliseconds slower (a slower rank, for --balance)")
    testing.add_argument("--inject-stall", metavar="RANK:STEP",
                         type=flags.rank_value(flags.OPTIONAL_COUNT, "1:3"), default=None,
                         help="make rank RANK hang (sleep) after global step STEP, to test --collective-timeout")
    return parser


@dataclass
class Job:
    """Everything one rank needs to train."""

    config: RunConfig
    network: Network
    trainer: Trainer
    optimizer: Optimizer
    test_data: Dataset | None
    history: History | None
    blas_threads: int
    run_id: str
    reported_shares: list[int] | None = None
    metrics: StepMetrics | None = None  # rank 0's metrics.csv (and TensorBoard events)
    stop: SignalStop | None = None  # ends the run after a step when SIGTERM or SIGUSR1 came
    communication: str = ""  # the communicator and the strategy it was chosen by
    watch: StateWatch | None = None  # the machine's state over a traced run


def check_outputs(config: RunConfig) -> None:
    """Refuse unwritable output paths, and a bad --validate file, before training (rank 0 writes them)."""
    check_writable(config.run_dir, "--run-dir")
    if config.checkpoint_dir:
        check_writable(config.checkpoint_dir, "--checkpoint-dir")
    if config.trace:
        check_writable(config.trace, "--trace")
    if config.validate:
        calibrated_machine(config.validate)
    if config.save_weights:
        check_writable_file(config.save_weights, "--save-weights")


def model_preference(config: RunConfig, world: Communicator) -> Callable[[Placement], str | None] | None:
    """With ``--comm auto`` and a --validate calibration that timed Allreduce between nodes, the
    strategy its model predicts the shorter step for on the job's nodes (flat or two-level,
    each with its overlap); else None. Only ``auto`` consults it: no other run reads the
    file on every rank at start-up."""
    if not config.validate or config.comm != "auto":
        return None
    machine = calibrated_machine(config.validate)
    if machine.calibration.network is None or machine.allreduce is None:
        return None
    ranks = RankPlacement(world.size, world.local_size, usable_cores(),
                          config.blas_threads or default_blas_threads(world))
    batch = max(1, config.global_batch // world.size)

    def prefer(placement: Placement) -> str | None:
        # The model's network is built here, only for a job that spans nodes of several ranks.
        network, optimizer = build_workload(config.model, config.dataset, config.dtype, config.optimizer)
        return faster_strategy(machine, network, optimizer, batch, ranks, placement.nodes, config.bucket_mb)
    return prefer


def make_optimizer(config: RunConfig, network: Network) -> Optimizer:
    if config.optimizer == "sgd":
        return SGD(network, config.momentum, config.nesterov, config.weight_decay)
    return Adam(network, weight_decay=config.weight_decay)


def configure(args: argparse.Namespace, comm: Communicator) -> tuple[RunConfig, Backend]:
    """This rank's run configuration and backend (its entry of --device); UserError on bad flags. No collectives.
    A --validate folder is replaced by its file of this rank's processor and device."""
    config = RunConfig.from_arguments(args, comm.size, comm.rank)
    backend = make_backend(config.device, config.dtype, gpu_id=comm.local_rank)
    if config.validate:
        config = replace(config, validate=calibration_file(config.validate, this_processor(), backend.device,
                                                           this_blas_kernels()))
    return config, backend


def build_job(config: RunConfig, comm: Communicator, backend: Backend, mixed_devices: bool, run_id: str) -> Job:
    """Build the model, data, optimizer and trainer of this rank, resumed or as the new run ``run_id``;
    raise UserError on bad input. Rank 0 takes the run's output directories.

    No collective may run in here: a rank that fails early would leave the others waiting
    in it instead of in the agreement of :func:`collectively`.
    """
    blas_threads = set_blas_threads(config.blas_threads or default_blas_threads(comm))
    train_data = open_dataset(config.dataset, "train", config.data_dir, seed=config.seed)
    test_data = (None if config.eval_steps == 0
                 else open_dataset(config.dataset, "test", config.data_dir, seed=config.seed))
    if test_data is not None:
        check_test_matches_train(train_data, test_data)
    if config.global_batch > len(train_data):
        raise UserError(f"the global batch of {config.global_batch} is more than the {len(train_data)} training "
                        f"samples of {config.dataset}: use --batch-size {len(train_data)} or less")
    network = build_network(config.model, train_data, backend, config.seed)
    optimizer = make_optimizer(config, network)
    balancer = (LoadBalancer(comm.size, config.balance_warmup, config.balance_every)
                if config.balances(mixed_devices) else None)
    settings = TrainerSettings(config.global_batch, config.seed, config.steps_per_epoch, config.share_weights,
                               config.augmentation, config.prefetch, config.accumulate, config.clip_grad_norm)
    trainer = build_trainer(network, config.faults.slowed(train_data, comm.rank), settings, comm=comm,
                            optimizer=optimizer, schedule=config.schedule, bucket_mb=config.bucket_mb,
                            overlap=config.overlap, balancer=balancer)
    if config.load_weights:
        try:
            network.load_state_dict(read_npz(config.load_weights, "--load-weights"))
        except ValueError as error:
            raise UserError(f"cannot load --load-weights {config.load_weights}: {error}") from None
    if config.resume is not None:
        run_id = resume(config, trainer, optimizer).run_id or run_id
    history, metrics = None, None
    if comm.rank == 0:
        check_outputs(config)
        history, notes = open_outputs(config, run_id)
        for note in notes:
            LOGGER.info(note)
        metrics = StepMetrics(os.path.dirname(history.path), config.tensorboard, run_id)
    return Job(config, network, trainer, optimizer, test_data, history, blas_threads, run_id, metrics=metrics)


def build_network(model: str, data: Dataset, backend: Backend, seed: int = 0) -> Network:
    """``model`` built for ``data``'s images; UserError when it does not fit them."""
    return build_model(model, data.input_shape, data.num_classes, backend, seed, images=f"{data.name}'s")


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
    return result  # type: ignore[return-value]  # set whenever no rank failed


def say(comm: Communicator, text: str, level: int = logging.INFO) -> None:
    """Log on rank 0 only."""
    if comm.rank == 0:
        LOGGER.log(level, text)


def train(job: Job, comm: Communicator) -> StepResult:
    """The epoch loop: progress, validation, history, checkpoints. Returns the last epoch's training figures."""
    config, trainer, network = job.config, job.trainer, job.network
    shares = job.reported_shares = partition(config.global_batch, trainer.share_weights)
    say(comm, f"{network.name} on {config.dataset} {network.input_shape}: {network.param_count:,} parameters, "
              f"{job.communication}, {job.blas_threads} BLAS threads per rank (from "
              f"{blas_threads_origin(config.blas_threads)}), device {network.backend.device}")
    batch = (f"global batch {config.global_batch}" if config.accumulate == 1 else
             f"global batch {config.global_batch} x {config.accumulate} accumulated = "
             f"{config.global_batch * config.accumulate} per update")
    eval_steps, test_samples = 0, len(job.test_data) if job.test_data else 0
    if job.test_data:
        eval_steps = evaluation_steps(config.eval_steps, trainer.steps_per_epoch, trainer.sampler.steps_per_epoch,
                                      test_samples, config.global_batch)
    say(comm, f"{batch}, per-rank shares {shares}; {trainer.steps_per_epoch} steps per "
              f"epoch; {describe_evaluation(eval_steps, test_samples, config.global_batch)}; "
              f"augmentation: {trainer.augmentation.describe()}; gradients: {trainer.synchronizer.describe()}")
    LOGGER.debug(f"this rank: device {network.backend.device}, {shares[comm.rank]} of each batch's samples, "
                 f"{job.blas_threads} BLAS threads, {config.prefetch} batch(es) read ahead")
    start_epoch = trainer.global_step // trainer.steps_per_epoch
    if trainer.global_step:
        say(comm, f"resumed at step {trainer.global_step} (epoch {start_epoch + 1})")
    callbacks: list[StepCallback] = [functools.partial(report_shares, job, comm),
                                     functools.partial(config.faults.after_step, comm.rank)]
    if config.checkpoint_dir and config.checkpoint_every:
        callbacks.insert(0, functools.partial(checkpoint_every, job, comm))
    if job.metrics is not None:
        callbacks.insert(0, functools.partial(record_metrics, job.metrics, trainer))
    if job.watch is not None:
        callbacks.append(job.watch.after_step)
    if job.stop is not None:
        callbacks.append(job.stop.after_step)
    first_step = FirstStep()
    callbacks.append(first_step.after_step)
    last = StepResult(float("nan"), 0.0, 0)
    started = time.perf_counter()
    total_samples, training_seconds = 0, 0.0
    for epoch in range(start_epoch, config.epochs):
        bar = progress_of(comm, config, epoch, trainer)
        last = trainer.train_epoch(epoch, callbacks if bar is None else [bar.after_step, *callbacks])
        if bar is not None:
            bar.close()
        total_samples, training_seconds = total_samples + last.samples, training_seconds + last.seconds
        validation = (trainer.evaluate(job.test_data, config.global_batch, eval_steps)
                      if job.test_data and eval_steps else None)
        rate = last.samples / max(last.seconds, 1e-9)
        line = f"epoch {epoch + 1}/{config.epochs}: loss {last.loss:.4f}, accuracy {last.accuracy:.2%}"
        if validation is not None:
            line += f", validation loss {validation.loss:.4f}, accuracy {validation.accuracy:.2%}"
        line += f"; {rate:.1f} img/s ({rate / comm.size:.1f} per rank), {last.seconds:.2f} s"
        say(comm, line)
        if job.metrics is not None and validation is not None:
            job.metrics.validation(trainer.global_step, validation)
        if job.history is not None:
            job.history.append({"epoch": epoch + 1, "step": trainer.global_step, "loss": last.loss,
                                "accuracy": last.accuracy, "seconds": last.seconds, "images_per_second": rate,
                                "validation_loss": validation.loss if validation else None,
                                "validation_accuracy": validation.accuracy if validation else None,
                                "ranks": comm.size, "global_batch": config.global_batch})
        if config.checkpoint_dir and not config.checkpoint_every:
            checkpoint(job, comm, validation.accuracy if validation else None)
    elapsed = time.perf_counter() - started
    if job.metrics is not None:
        job.metrics.close()
    if config.save_weights and comm.rank == 0:
        network.save(config.save_weights)
    after_first = first_step.rate_after(total_samples, training_seconds)
    steady = "" if after_first is None else f", {after_first:.1f} img/s after the first step"
    say(comm, f"done: {total_samples} samples in {training_seconds:.2f} s of training = "
              f"{total_samples / max(training_seconds, 1e-9):.1f} img/s on {comm.size} rank(s){steady} "
              f"({elapsed:.2f} s with evaluation and checkpoints); final training loss {last.loss:.4f}, "
              f"accuracy {last.accuracy:.2%}")
    return last


def checkpoint(job: Job, comm: Communicator, validation_accuracy: float | None = None) -> None:
    """Rank 0 writes the weights, optimizer state and step to --checkpoint-dir, and keeps the last
    --keep-checkpoints and the best by ``validation_accuracy`` (when an evaluation just gave one)."""
    config = job.config
    if not config.checkpoint_dir:
        return
    check_finite_weights(job.network, job.trainer.global_step, config.checkpoint_dir)  # every rank stops alike
    if comm.rank == 0:
        step = job.trainer.global_step
        written = save_checkpoint(config.checkpoint_dir, job.network, job.optimizer, step,
                                  {"run_id": job.run_id, "flags": flag_values(config),
                                   "epoch_sums": job.trainer.epoch_sums, "validation_accuracy": validation_accuracy})
        retain(config.checkpoint_dir, written, step, config.keep_checkpoints, validation_accuracy)


@dataclass
class FirstStep:
    """The samples and seconds of this run's first step, which the throughput "after the first
    step" leaves out: a fresh install compiles its host kernels in it (about 12 s for VGG11 on
    2 cores), and every run warms its caches and memory pools there."""

    samples: int = 0
    seconds: float = 0.0

    def after_step(self, global_step: int, result: StepResult) -> None:
        """The step callback: keep the first step's figures."""
        if not self.samples:
            self.samples, self.seconds = result.samples, result.seconds

    def rate_after(self, samples: int, seconds: float) -> float | None:
        """Images a second over ``samples`` trained in ``seconds`` less the first step; None
        where the run trained no step after it."""
        if samples <= self.samples or seconds <= self.seconds:
            return None
        return (samples - self.samples) / (seconds - self.seconds)


def record_metrics(metrics: StepMetrics, trainer: Trainer, global_step: int, result: StepResult) -> None:
    """The step callback that writes a step's figures to metrics.csv (and TensorBoard)."""
    step = global_step - 1  # the step just taken, from 0, as the schedule counts
    metrics.step(global_step, step // trainer.steps_per_epoch + 1, result,
                 trainer.schedule(step, trainer.steps_per_epoch))


def checkpoint_every(job: Job, comm: Communicator, global_step: int, result: StepResult) -> None:
    """The step callback of --checkpoint-every N."""
    if global_step % job.config.checkpoint_every == 0:
        checkpoint(job, comm)


def report_shares(job: Job, comm: Communicator, global_step: int, result: StepResult) -> None:
    """The step callback that says the per-rank shares after a re-weighting that moved samples between ranks."""
    trainer = job.trainer
    if trainer.rebalanced_at != global_step or trainer.balancer is None:
        return
    shares = partition(job.config.global_batch, trainer.share_weights)
    if shares != job.reported_shares:
        speeds = ", ".join(f"{v:.1f}" for v in trainer.balancer.speeds)
        say(comm, f"step {global_step}: per-rank shares now {shares} (measured speeds {speeds} img/s per rank)")
        job.reported_shares = shares


def write_trace(job: Job, comm: Communicator, tracer: Tracer, trace: str, watch: StateWatch) -> None:
    """Gather the trace of every rank into ``trace``, with the description of the run: how
    its ranks sat and the machine's state over its traced steps, which a validation reads."""
    config, trainer = job.config, job.trainer
    state = watch.state()
    meta = {"run_id": job.run_id, "model": config.model, "dataset": config.dataset,
            "global_batch": config.global_batch, "accumulate": config.accumulate,
            "clip_grad_norm": config.clip_grad_norm,
            "shares": partition(config.global_batch, trainer.share_weights), "ranks": comm.size,
            "communicator": comm.describe(), "device": job.network.backend.device, "dtype": config.dtype,
            "blas_threads": job.blas_threads, "optimizer": config.optimizer, "bucket_mb": config.bucket_mb,
            "overlap": config.overlap, "prefetch": config.prefetch, "trace_skip": config.trace_skip,
            "host": platform.node(),
            "processor": platform.processor() or platform.machine(), **this_processor().record(),
            "blas": blas_info(), "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "ranks_per_node": max(comm.allgather_object(comm.local_size)),
            "cores_per_node": usable_cores(), "machine_state": state.to_dict(),
            "core_probes": [asdict(instant) for instant in watch.instants], "strategy": comm.name,
            "reduces_during_backward": comm.reduces_during_backward,
            "kernel_probes": [run.to_dict() for run in watch.kernel_runs],
            "nodes": len(set(comm.allgather_object(node_name())))}
    if config.validate:
        meta["calibration"] = os.path.abspath(config.validate)
    tracer.save(trace, meta)
    say(comm, f"trace of {len(tracer.steps)} step(s) per rank written to {trace}: open trace.json in "
              f"https://ui.perfetto.dev; summary: python -m pydtnn_lite.trace summarize {trace}")
    if config.validate and comm.rank == 0:
        print(validate_trace(trace, load_trace(trace), calibrated_machine(config.validate),
                             f"calibration {config.validate}"), flush=True)


def progress_of(comm: Communicator, config: RunConfig, epoch: int, trainer: Trainer) -> ProgressBar | StepLines | None:
    """Rank 0's progress bar or step lines unless --no-progress; None elsewhere."""
    if comm.rank != 0 or not config.progress:
        return None
    return make_progress(f"epoch {epoch + 1}/{config.epochs}", trainer.steps_per_epoch,
                         trainer.global_step % trainer.steps_per_epoch, config.log_every)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    comm = make_communicator(timeout=args.collective_timeout)
    setup_logging(args.log_level, comm.rank, comm.size)
    stop = SignalStop(comm)
    interrupt_outside_compilers()
    install_job_abort(comm, PROGRAM)
    keep_freed_memory()
    np.seterr(over="ignore", invalid="ignore")  # overflow as training diverges: the trainer reports it in one line
    if args.summary:
        return print_summary(args, comm)
    try:
        config, backend = collectively(comm, lambda: configure(args, comm))
        run_id = agree_on_job(comm, config)
        bucket_elements = int(config.bucket_mb * (1 << 20)) // np.dtype(backend.dtype).itemsize
        world = comm  # MPI over all ranks, whatever strategy reduces the gradients
        comm, placement, strategy = connect(world, backend, config.comm, bucket_elements, node_name(),
                                            config.collective_timeout,
                                            model_preference(config, world))
        mixed = bool(placement.cpu_ranks and placement.gpu_ranks)
        job = collectively(comm, lambda: build_job(config, comm, backend, mixed, run_id))
    except UserError as error:  # every rank raises it: after agreeing in collectively(), or from the same placement
        say(comm, f"{PROGRAM}: error: {error}", logging.ERROR)
        return SETUP_ERROR_EXIT
    except KeyboardInterrupt:
        return end_interrupted(comm, PROGRAM, "during set-up")
    except Exception as error:  # e.g. NCCL failing to start on one rank
        report_and_abort(comm, PROGRAM, error)
    job.communication, job.stop = strategy, stop
    # Rank 0's weights are everyone's, whatever a rank's RNG, weight file or checkpoint gave.
    comm.broadcast(job.network.flat_params)
    try:
        if config.evaluate_only:
            evaluate_only(job, comm)
            return 0
        tracer = Tracer(job.trainer, config.trace_skip, config.trace_steps) if config.trace else None
        if tracer is not None:
            # The machine's state over the traced steps: a validation corrects for its drift since
            # calibrating. Probed over MPI, as the calibration's (a two-level communicator with an
            # NCCL level completes its requests only when waited for, which the probe's idle wait never does).
            on_host = job.network.backend.device == "cpu"
            job.watch = StateWatch(world, lambda: len(tracer.steps),
                                   lambda: probe_kernels(world, config.dataset, on_host=on_host))
            tracer.attach()
        train(job, comm)
        if tracer is not None and job.watch is not None and config.trace:
            tracer.detach()
            write_trace(job, comm, tracer, config.trace, job.watch)
    except StopRequested as request:  # every rank agreed on it after the same step
        return stop_for_requeue(job, comm, request)
    except TrainingError as error:  # the loss is global, so every rank raises it at the same step
        say(comm, f"{PROGRAM}: error: {error}", logging.ERROR)
        return TRAINING_ERROR_EXIT
    except KeyboardInterrupt:
        return end_interrupted(comm, PROGRAM, f"at step {job.trainer.global_step}")
    except Exception as error:  # on this rank alone: the others would wait forever, so end the job
        report_and_abort(comm, PROGRAM, error)
    return 0


def evaluate_only(job: Job, comm: Communicator) -> StepResult:
    """--evaluate-only: the loaded weights' loss and accuracy on the test split."""
    config, trainer = job.config, job.trainer
    source = f"--load-weights {config.load_weights}" if config.load_weights else f"checkpoint {config.resume}"
    assert job.test_data is not None  # RunConfig refuses --evaluate-only with --eval-steps 0
    result = trainer.evaluate(job.test_data, config.global_batch, config.eval_steps)
    say(comm, f"evaluation of {source} (step {trainer.global_step}) on {result.samples} test samples: "
              f"loss {result.loss:.4f}, accuracy {result.accuracy:.2%}")
    if job.history is not None:
        job.history.append({"evaluate_only": source, "step": trainer.global_step, "validation_loss": result.loss,
                            "validation_accuracy": result.accuracy, "ranks": comm.size,
                            "global_batch": config.global_batch})
    return result


def stop_for_requeue(job: Job, comm: Communicator, request: StopRequested) -> int:
    """Checkpoint the step every rank has finished and return the status that asks for a requeue."""
    if job.metrics is not None:
        job.metrics.close()
    checkpoint(job, comm)
    comm.barrier()  # the checkpoint is on disk before any rank exits
    saved = (f"checkpoint of step {request.global_step} in {job.config.checkpoint_dir}"
             if job.config.checkpoint_dir else "no checkpoint (no --checkpoint-dir)")
    say(comm, f"{request}: {saved}; exiting with status {REQUEUE_EXIT} for the scheduler to requeue the job "
              "(--resume auto continues it)", logging.WARNING)
    return REQUEUE_EXIT


def print_summary(args: argparse.Namespace, comm: Communicator) -> int:
    """--summary: rank 0 prints the model's layers and FLOPs; every rank exits 2 when it cannot be built."""
    try:  # every rank builds it, so that every rank knows the exit status
        network = build_network(args.model, open_dataset(args.dataset, "train", args.data_dir), make_backend())
    except UserError as error:
        say(comm, f"{PROGRAM}: error: {error}", logging.ERROR)
        return SETUP_ERROR_EXIT
    if comm.rank == 0:
        print(network.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
