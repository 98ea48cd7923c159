"""Command line: ``[mpiexec -n P] python -m pydtnn_lite.calibrate [--out FILE] [--quick] [options]``.

Measures every kernel of a training step over a grid of layer shapes, the GEMM peak,
the memory bandwidth and (with P >= 2 ranks) Allreduce, fits a run-time model per
kernel, writes the calibration file (rank 0) and prints each model's held-out error.
The ranks measure at the same time, each with its share of the cores, as the ranks of a
training job on this machine compute; run it with the ranks per node you will train
with. ``--refit FILE`` fits the models again from the samples a file holds, measuring
nothing; ``--merge FILE FILE ...`` pools the samples of calibrations of one machine taken
at different times and fits the models on them; ``--allreduce-only FILE`` times Allreduce
again into a file, keeping its kernels. ``--fit-later`` measures and writes the samples
without fitting, for ``--refit`` on another machine: fitting takes minutes of CPU that a
lent GPU machine's time need not pay.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence

from pydtnn_lite import flags
from pydtnn_lite.backend import make_backend
from pydtnn_lite.cli import command_parser, parse_command_line
from pydtnn_lite.comm import make_communicator
from pydtnn_lite.comm.gradients import MIB
from pydtnn_lite.comm.nodes import emulated_link_gbit
from pydtnn_lite.errors import UserError
from pydtnn_lite.paths import check_writable_file
from pydtnn_lite.perfmodel.measuring.allreduce_timing import QUICK_SIZES
from pydtnn_lite.perfmodel.measuring.cache_residency import QUICK_SIZES as QUICK_RESIDENCY_SIZES
from pydtnn_lite.perfmodel.measuring.calibrate import (
    CalibrationSettings,
    calibrate,
    check_allreduce_ranks,
    fit_models,
    remeasure_allreduce,
)
from pydtnn_lite.perfmodel.measuring.data_loading import read_ahead_share
from pydtnn_lite.perfmodel.measuring.gradient_passes import QUICK_LENGTHS
from pydtnn_lite.perfmodel.measuring.probes import QUICK, job_probes
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.merging import merge_calibrations
from pydtnn_lite.perfmodel.modelling.outside_kernels import fit_affine
from pydtnn_lite.perfmodel.modelling.processors import Processor
from pydtnn_lite.perfmodel.modelling.synchronization import fit_sync_wait
from pydtnn_lite.runtime import (
    default_blas_threads,
    install_job_abort,
    keep_freed_memory,
    set_blas_threads,
    usable_cores,
)
from pydtnn_lite.textable import format_table

PROGRAM = "pydtnn_lite.calibrate"
SETUP_ERROR_EXIT = 2
DEFAULT_OUT = "calibration.json"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-calibrate", __doc__.split("\n\n")[1],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=None,
                        help=f"calibration file to write (default {DEFAULT_OUT}; with --refit or --allreduce-only, "
                             "the file read)")
    parser.add_argument("--quick", action="store_true",
                        help="a few probes, one step each, Allreduce up to 4 MiB: seconds, for a smoke test")
    parser.add_argument("--batch-sizes", type=flags.COUNT, nargs="+", default=list(CalibrationSettings.batch_sizes),
                        help="batch sizes of the probe networks")
    parser.add_argument("--repeats", type=flags.COUNT, default=None,
                        help="traced steps per probe, at least (default 3; 1 with --quick)")
    parser.add_argument("--blas-threads", "--threads", type=flags.COUNT, default=None, dest="blas_threads",
                        help="BLAS threads per rank (default: the node's cores divided by its ranks)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=flags.SEED, default=0, help="seeds the grid's sampling and the MLPs")
    parser.add_argument("--no-oversubscribed", action="store_true",
                        help="time Allreduce on this job's ranks only, not (in child jobs) at every process count "
                             "up to four per core (a job of more ranks than cores is then predicted from the fit, "
                             "with a warning); --quick and --device gpu imply it")
    parser.add_argument("--models", type=flags.MODEL_BATCH, nargs="+", default=[], metavar="MODEL:BATCH[:DATASET]",
                        help="also sample these zoo networks whole, BATCH images per rank (DATASET: synthetic, "
                             "synthetic-imagenet or digits; default synthetic): their calls are then predicted "
                             "from their own timings, not from the grid's model")
    parser.add_argument("--model-rounds", type=flags.COUNT, default=None,
                        help="rounds of the --models networks, spread along the kernel sampling: a machine that "
                             "moves from one minute to the next is sampled at several (default "
                             f"{CalibrationSettings.job_rounds}; 1 with --quick)")
    # What the calibration starts from: a measurement (fitted now, or --fit-later), or a file.
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--fit-later", action="store_true",
                        help="measure and write the samples without fitting the kernel models; the file predicts "
                             "nothing until python -m pydtnn_lite.calibrate --refit FILE fits them (on any machine)")
    source.add_argument("--refit", metavar="FILE", default=None,
                        help="fit the kernel models again from the samples FILE holds; measure nothing")
    source.add_argument("--merge", metavar="FILE", nargs="+", default=None,
                        help="pool the samples of these calibrations of this machine (taken at different times) "
                             "and fit the models on them; measure nothing")
    source.add_argument("--allreduce-only", metavar="FILE", default=None,
                        help="time Allreduce again into FILE (under mpiexec with 2 or more ranks, e.g. on an "
                             "emulated cluster); its kernel samples and models are kept, with the placement they "
                             "were measured in")
    return parser


def settings_from(args: argparse.Namespace) -> CalibrationSettings:
    """The measurement settings the flags ask for (each in range, checked as it was parsed)."""
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else CalibrationSettings.repeats)
    jobs = tuple(args.models)
    job_probes(jobs)  # refuses an unknown model or data set before anything is measured
    if args.quick:
        return CalibrationSettings(tuple(args.batch_sizes), repeats, 0.0, QUICK, QUICK_SIZES, QUICK_RESIDENCY_SIZES,
                                   1, args.seed, False, jobs, read_ahead_rounds=2, read_ahead_steps=10, kernel_probes=2,
                                   job_rounds=args.model_rounds or 1, fit=not args.fit_later,
                                   gradient_lengths=QUICK_LENGTHS)
    # GPU ranks do not share cores: their job's Allreduce is the one to time (on a 16-core GPU
    # machine the child jobs of 2 to 64 ranks outlasted four minutes of its time).
    return CalibrationSettings(batch_sizes=tuple(args.batch_sizes), repeats=repeats, seed=args.seed,
                               beyond_job=not args.no_oversubscribed and args.device == "cpu", jobs=jobs,
                               job_rounds=args.model_rounds or CalibrationSettings.job_rounds,
                               fit=not args.fit_later)


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}"


def _waits(calibration: Calibration) -> str:
    model = calibration.sync_wait
    if not model.coefficient:
        return "no waits for the slowest rank measured (one rank)"
    return (f"wait for the slowest rank at a synchronisation, mean over {model.ranks} ranks: "
            f"{model.coefficient * 1e3:.3g} ms x (seconds of work since the last one) ^ {model.exponent:.2f}")


def _overhead(calibration: Calibration) -> str:
    model = calibration.overhead
    loads = "; ".join(f"loading {name}: {cost.fixed * 1e6:.0f} us + {cost.per_unit * 1e6:.1f} us per sample"
                      for name, cost in sorted(calibration.data_load.items()))
    return (f"time outside the kernels: {model.fixed * 1e6:.0f} us per step + {model.per_unit * 1e6:.1f} us per "
            f"kernel call ({len(calibration.overhead_samples)} probes); {loads or 'no data set timed'}")


def _state(calibration: Calibration) -> str:
    state = calibration.machine_state
    if state is None:
        return "no machine-state probe"
    allreduce = (f", Allreduce of {state.allreduce_bytes >> 10} KiB on {state.allreduce_ranks} ranks "
                 f"{state.allreduce_seconds * 1e6:.0f} us" if state.allreduce_seconds else "")
    return (f"machine state ({state.probes} probes of {state.cores} cores at once): one-thread GEMM "
            f"{state.gemm_flops / 1e9:.1f} GFLOP/s, copy "
            f"{state.copy_bytes_per_second / 1e9:.1f} GB/s{allreduce}")


def _network(calibration: Calibration) -> str:
    network = calibration.network
    if network is None:
        progress = calibration.bucket_progress
        return "one node: no Allreduce between nodes timed" + (
            f"; a bucket's own calls with blocking reductions after its post, over its blocking Allreduce: "
            f"{progress.summary()}" if progress else "")
    link = f" over links of {network.link_gbit:g} Gbit/s (emulated)" if network.link_gbit else ""
    intra = (f", Reduce and Bcast among the {network.ranks_per_node} ranks of each node"
             if network.intra_node else "")
    cost = network.transfer
    window = "" if math.isinf(cost.window_bytes) else f", at most {cost.window_bytes / MIB:.1f} MiB between two calls"
    moving = (f"; a bucket moving beside backward costs {cost.cpu_per_byte * MIB * 1e3:.2f} ms of CPU per MiB "
              f"({100 * cost.in_tests:.0f} % of it inside the tests), posting one {cost.post_seconds * 1e3:.2f} ms"
              f" and testing it right after {cost.post_test_seconds * 1e3:.2f} ms"
              f"{window}") if cost.cpu_per_byte else ""
    shared = network.straggler_wait
    waits = (f"; its {network.ranks} ranks, sharing the cores, wait for the slowest "
             f"{shared.coefficient * 1e3:.3g} ms x (seconds of work) ^ {shared.exponent:.2f}") if shared else ""
    return f"{network.nodes} nodes{link}: Allreduce timed among one rank per node{intra}{moving}{waits}"


def report(calibration: Calibration) -> str:
    """The roofs, and per kernel: samples, model, held-out errors and best achieved rates."""
    machine = calibration.machine
    lines = [f"{str(Processor.of(machine)) or '?'}, {machine.get('ranks', '?')} rank(s) x "
             f"{machine.get('blas_threads', '?')} BLAS thread(s), {machine.get('dtype', '?')} on "
             f"{machine.get('device', '?')}: GEMM peak {calibration.peak_flops / 1e9:.1f} GFLOP/s, memory "
             f"bandwidth {calibration.memory_bandwidth / 1e9:.1f} GB/s per rank; "
             f"{len(calibration.allreduce_samples)} Allreduce samples on "
             f"{', '.join(map(str, sorted({p for p, _, _ in calibration.allreduce_samples}))) or 'no'} ranks",
             _waits(calibration), _overhead(calibration), _state(calibration), _network(calibration), "",
             "held-out error: median |predicted - measured| / measured, and total |error| / total time"]
    header = ("kernel", "samples", "model", "median %", "time %", "best GFLOP/s", "best GB/s")
    rows = []
    for name, model in sorted(calibration.kernel_models.items()):
        rates = calibration.kernel_rates.get(name, {})
        rows.append((name, len(calibration.kernel_samples.get(name, ())), model.kind,
                     _percent(model.held_out_error), _percent(model.held_out_time_error),
                     f"{rates.get('flops_per_second', 0.0) / 1e9:.1f}",
                     f"{rates.get('bytes_per_second', 0.0) / 1e9:.1f}"))
    return "\n".join(lines + [format_table(header, rows)])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    comm = make_communicator()
    install_job_abort(comm, PROGRAM)
    keep_freed_memory()
    # Every rank checks the same flags and reads the same file, so all of them fail alike
    # here, before the first collective.
    source = args.refit or args.allreduce_only
    out = args.out or source or DEFAULT_OUT
    try:
        settings = settings_from(args)
        if emulated_link_gbit() is not None:  # child jobs would run outside the emulated nodes' placement
            settings = dataclasses.replace(settings, beyond_job=False)
        if settings.jobs and comm.oversubscribed:
            # A grid probe's calls are shorter than the scheduler's time slice and run as on a core
            # of their own; a whole network's are not, and predictions time-share the cores again.
            raise UserError(f"--models with {comm.local_size} ranks on {usable_cores()} cores here: the networks' "
                            "kernels would be timed sharing the cores and predicted sharing them twice; "
                            "calibrate --models with at most one rank per core")
        previous = Calibration.load(source) if source else None
        if args.merge:
            previous = merge_calibrations([Calibration.load(path) for path in args.merge])
        if args.allreduce_only:
            check_allreduce_ranks(comm.size)
        backend = make_backend(args.device, args.dtype)
        check_writable_file(out, "--out")
        threads = set_blas_threads(args.blas_threads or default_blas_threads(comm))
    except (UserError, OSError, ValueError) as error:
        if comm.rank == 0:
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    log = (lambda line: print(line, flush=True)) if comm.rank == 0 else (lambda line: None)
    calibration: Calibration | None
    if args.allreduce_only and previous is not None:
        calibration = remeasure_allreduce(previous, comm, settings.allreduce_sizes, settings.beyond_job,
                                          settings.residency_sizes)
    elif previous is not None:
        previous.kernel_models = fit_models(previous.kernel_samples, comm, args.seed, threads)
        previous.sync_wait = fit_sync_wait(previous.sync_samples, previous.allreduce_ranks)
        previous.overhead = fit_affine(previous.overhead_samples)
        previous.data_load = {name: fit_affine(rows) for name, rows in previous.data_load_samples.items()}
        if previous.read_ahead_samples:
            previous.read_ahead_share = read_ahead_share(previous.read_ahead_samples)
        calibration = previous
    else:
        log(f"calibrating: {comm.size} rank(s) x {threads} BLAS thread(s), {args.dtype} on {backend.device}"
            f"{', quick' if args.quick else ''}")
        calibration = calibrate(backend, comm, settings, threads, log)
    if comm.rank == 0 and calibration is not None:
        calibration.save(out)
        print(report(calibration))
        print(f"wrote {out}" + ("" if calibration.kernel_models else
                                f"; no kernel models yet: fit them with python -m {PROGRAM} --refit {out}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
