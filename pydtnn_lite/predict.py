"""Command line: ``python -m pydtnn_lite.predict --model vgg11 --batch-size 128 --procs 8``.

Predicts one data-parallel training step, kernel by kernel: the FP, BP and WU time of
every layer, the Allreduce of every gradient bucket, and the step time with and without
overlapping the reductions with backward. The machine is a preset cluster (the paper's
ALTEC and AMPERE), a preset with figures replaced by flags, or a calibration file.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from dataclasses import replace

from pydtnn_lite import flags
from pydtnn_lite.cli import command_parser, parse_command_line, print_output
from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.costs import COMPUTE_STAGES
from pydtnn_lite.data import partition
from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.measuring.host import this_blas_kernels, this_processor
from pydtnn_lite.perfmodel.modelling.machine_flags import add_machine_arguments, machine_from_arguments
from pydtnn_lite.perfmodel.modelling.machines import (
    AdjustedMachine,
    CalibratedMachine,
    adjusted_machine,
    calibrated_machine,
    calibration_warnings,
)
from pydtnn_lite.perfmodel.modelling.placement import Placement
from pydtnn_lite.perfmodel.modelling.prediction import STAGES, StepPrediction, balanced_shares, predict_step
from pydtnn_lite.perfmodel.modelling.workload import DATASET_SHAPES, build_workload
from pydtnn_lite.textable import format_table

PROGRAM = "pydtnn_lite.predict"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("pydtnn-predict", __doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--dataset", default="cifar10", choices=sorted(DATASET_SHAPES),
                        help="the image shape to predict for")
    parser.add_argument("--batch-size", type=flags.COUNT, default=128, help="global batch (all ranks together)")
    parser.add_argument("--procs", type=flags.COUNT, default=None, help="ranks (default: the preset's nodes)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--accumulate", type=flags.COUNT, default=1, metavar="K",
                        help="micro-batches of --batch-size whose gradients each step sums before one reduction and "
                             "one update, as train's --accumulate")
    parser.add_argument("--clip-grad-norm", type=flags.real(0.0, 1e12, above=True), default=None, metavar="MAX",
                        help="the step clips the gradient by its global norm, as train's (the time does not "
                             "depend on MAX)")
    parser.add_argument("--bucket-mb", type=flags.BUCKET_MIB, default=4.0, help="gradient bucket size, MiB")
    parser.add_argument("--no-overlap", action="store_true",
                        help="the kernels of a step that reduces the gradient after backward, as train's flag "
                             "(default: those of the overlapped step)")
    parser.add_argument("--prefetch", type=flags.integer(0, 1024), default=2, metavar="N",
                        help="batches read ahead on a background thread, as train's --prefetch (0: read in the step)")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument("--rank-calibrations", nargs="+", default=None, metavar="FILE",
                        help="a heterogeneous job: one calibration per rank (e.g. cpu.json gpu.json); predicts the "
                             "balanced shares and each rank's step")
    add_machine_arguments(parser)
    placement = parser.add_argument_group("placement and state, with --calibration (default: as calibrated)")
    placement.add_argument("--ranks-per-node", type=flags.COUNT, default=None,
                           help="ranks on each node (default: every rank on one node)")
    placement.add_argument("--cores-per-node", type=flags.COUNT, default=None,
                           help="cores of a node (default: the calibration's)")
    placement.add_argument("--blas-threads", "--threads", type=flags.COUNT, default=None, dest="blas_threads",
                           help="BLAS threads per rank (default: a node's cores divided by its ranks, as training "
                                "does)")
    placement.add_argument("--probe", action="store_true",
                           help="measure the machine's state now (a few seconds) and correct for its drift since the "
                                "calibration")
    return parser


def placed(machine: CalibratedMachine, args: argparse.Namespace, procs: int) -> AdjustedMachine:
    """``machine`` with ``procs`` ranks placed as the flags say, corrected for drift with ``--probe``."""
    calibrated = machine.calibration.placement
    per_node = args.ranks_per_node or procs
    cores = args.cores_per_node or calibrated.cores_per_node
    threads = args.blas_threads or max(1, cores // per_node)
    if per_node > procs:
        raise UserError(f"--ranks-per-node {per_node} is more than the job's {procs} ranks: lower it or raise --procs")
    now, probed, processor = None, None, None
    if args.probe:
        # Measuring code, loaded only to measure: a prediction alone needs no communicator.
        from pydtnn_lite.perfmodel.measuring.kernel_probe import probe_kernels
        from pydtnn_lite.perfmodel.measuring.machine_state import probe_machine_state
        from pydtnn_lite.runtime import keep_freed_memory

        # As calibrating and training keep it: a fresh process otherwise maps the probes' large
        # temporaries anew and faults their pages in (its first probe's im2col 3x, ReLU 4x).
        keep_freed_memory()
        now = probe_machine_state(SerialCommunicator())
        probed = probe_kernels(SerialCommunicator(), args.dataset)
        processor = this_processor()
    return adjusted_machine(machine, Placement(procs, per_node, cores, threads), now, probed, processor)


def prediction_json(prediction: StepPrediction, model: str, dataset: str, machine_name: str,
                    global_batch: int, warnings: Sequence[str] = ()) -> dict:
    """One JSON object: the run and machine, the step (``step_seconds``: with overlap, as
    training runs by default), the stages, the waits, what loading adds to the step (with
    batches read ahead, less than the DATA stage), every bucket and every kernel, and the
    ``warnings`` (what the calibration lacks for this job: its kernels, its threads)."""
    return {"model": model, "dataset": dataset, "global_batch": global_batch, "procs": prediction.procs,
            "local_batch": prediction.batch, "accumulate": prediction.accumulate, "machine": machine_name,
            "step_seconds": prediction.step_with_overlap,
            "step_seconds_with_overlap": prediction.step_with_overlap,
            "step_seconds_without_overlap": prediction.step_without_overlap,
            "stage_seconds": prediction.stage_seconds, "wait_seconds": prediction.wait_seconds,
            "synchronisations": prediction.synchronisations, "overhead_seconds": prediction.overhead_seconds,
            "data_in_step_seconds": prediction.data_in_step_with_overlap,
            "buckets": [{"bytes": n, "seconds": s}
                        for n, s in zip(prediction.bucket_bytes, prediction.bucket_seconds, strict=True)],
            "kernels": [k.__dict__ for k in prediction.kernels], "warnings": list(warnings)}


def prediction_text(prediction: StepPrediction, title: str, global_batch: int, warnings: Sequence[str] = ()) -> str:
    table = format_table(("layer", "FP ms", "BP ms", "WU ms"),
                         [(f"{index} {name}", *(f"{stages.get(s, 0.0) * 1e3:.3f}" for s in COMPUTE_STAGES))
                          for (index, name), stages in sorted(prediction.layer_table().items()) if index >= 0])
    rule = table.split("\n")[1]  # the rule under the header closes the table too
    lines = [title, table, rule]
    lines.append("stages: " + ", ".join(f"{s} {prediction.stage_seconds[s] * 1e3:.3f} ms" for s in STAGES)
                 + f"; outside the kernels {prediction.overhead_seconds * 1e3:.3f} ms; loading in the step "
                 f"{prediction.data_in_step_with_overlap * 1e3:.3f} ms")
    lines.append(f"{len(prediction.bucket_bytes)} gradient buckets, {sum(prediction.bucket_bytes) / 2**20:.1f} MiB, "
                 f"Allreduce {sum(prediction.bucket_seconds) * 1e3:.3f} ms")
    if prediction.synchronisations:
        count = prediction.synchronisations
        lines.append(f"waits for the slowest rank: {prediction.wait_seconds * 1e3:.3f} ms at {count} "
                     f"synchronisation{'s' if count > 1 else ''} (batch-norm reductions, end of the step)")
    for overlap in (False, True):
        step = prediction.step_seconds(overlap)
        lines.append(f"step {'with' if overlap else 'without'} overlap: {step * 1e3:.3f} ms, "
                     f"{global_batch / step:.1f} img/s")
    return "\n".join(lines + [f"warning: {line}" for line in warnings])


def heterogeneous_prediction(args: argparse.Namespace) -> dict:
    """Equal and balanced shares, and each rank's step, of a job whose ranks have the
    calibrations ``--rank-calibrations``, as one JSON object."""
    if args.accumulate > 1:
        raise UserError("--accumulate is not predicted with --rank-calibrations: predict each rank's step alone "
                        "with --calibration FILE --accumulate K")
    machines = [calibrated_machine(path, args.algorithm, args.allreduce_model) for path in args.rank_calibrations]
    allreduce = next((m.allreduce for m in machines if m.allreduce is not None), None)
    machines = [replace(m, allreduce=m.allreduce or allreduce) for m in machines]
    if args.batch_size < len(machines):
        raise UserError(f"--batch-size {args.batch_size} must be at least the {len(machines)} ranks")
    network, optimizer = build_workload(args.model, args.dataset, args.dtype, args.optimizer)
    shares, balanced = balanced_shares(network, optimizer, args.batch_size, machines, args.bucket_mb)
    equal_shares = partition(args.batch_size, [1.0] * len(machines))
    equal = [predict_step(network, optimizer, share, len(machines), machine, args.bucket_mb)
             for share, machine in zip(equal_shares, machines, strict=True)]
    return {"model": args.model, "dataset": args.dataset, "global_batch": args.batch_size, "procs": len(machines),
            "machines": [f"calibration {path}" for path in args.rank_calibrations],
            **{name: {"shares": chosen, "step_seconds": max(p.step_with_overlap for p in steps),
                      "rank_step_seconds": [p.step_with_overlap for p in steps]}
               for name, chosen, steps in (("equal_shares", equal_shares, equal),
                                           ("balanced_shares", shares, balanced))}}


def heterogeneous_text(result: dict) -> str:
    """:func:`heterogeneous_prediction` as text: the step with each choice of shares."""
    lines = [f"{result['model']} on {result['dataset']}, global batch {result['global_batch']}, "
             f"{result['procs']} ranks"]
    for name in ("equal_shares", "balanced_shares"):
        chosen = result[name]
        per_rank = ", ".join(f"rank {r}: {s} samples, {seconds * 1e3:.1f} ms"
                             for r, (s, seconds) in enumerate(zip(chosen["shares"], chosen["rank_step_seconds"],
                                                                  strict=True)))
        lines.append(f"{name.replace('_', ' ')} {chosen['shares']}: step {chosen['step_seconds'] * 1e3:.1f} ms "
                     f"({per_rank})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    if args.rank_calibrations:
        try:
            result = heterogeneous_prediction(args)
        except UserError as error:
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
            return 2
        print_output(json.dumps(result, indent=1) if args.json else heterogeneous_text(result))
        return 0
    try:
        machine, machine_name, nodes = machine_from_arguments(args, 8 if args.dtype == "float64" else 4,
                                                              this_processor(), blas=this_blas_kernels())
        procs = args.procs or nodes
        if args.batch_size < procs:
            raise UserError(f"--batch-size {args.batch_size} must be at least --procs {procs} (one sample per rank)")
        if isinstance(machine, CalibratedMachine):
            machine = placed(machine, args, procs)
            machine_name += f"; {machine.placement.describe()}" + (f"; drift {machine.drift.describe()}"
                                                                   if args.probe else "")
        elif args.probe or args.ranks_per_node or args.cores_per_node or args.blas_threads:
            raise UserError("--probe, --ranks-per-node, --cores-per-node and --blas-threads need --calibration FILE")
        network, optimizer = build_workload(args.model, args.dataset, args.dtype, args.optimizer)
        local_batch = max(partition(args.batch_size, [1.0] * procs))
        step = functools.partial(predict_step, network, optimizer, local_batch, procs, machine, args.bucket_mb,
                                 dataset=args.dataset, prefetch=args.prefetch > 0, accumulate=args.accumulate,
                                 clip=args.clip_grad_norm is not None)
        prediction = step(overlap=not args.no_overlap)
        # The step without overlap, from a prediction of its own: backward then starts no bucket.
        blocking = prediction if args.no_overlap else step(overlap=False)
        prediction = replace(prediction, step_without_overlap=blocking.step_without_overlap,
                             data_in_step_without_overlap=blocking.data_in_step_without_overlap)
    except UserError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    warnings = calibration_warnings(machine, prediction.kernels, args.dtype)
    if args.json:
        print_output(json.dumps(prediction_json(prediction, args.model, args.dataset, machine_name,
                                                args.batch_size, warnings), indent=1))
    else:
        micro_batches = f" x {args.accumulate} micro-batches a step" if args.accumulate > 1 else ""
        print_output(prediction_text(prediction, f"{args.model} on {args.dataset}, global batch {args.batch_size} "
                                                 f"over {procs} ranks ({local_batch} per rank){micro_batches}, "
                                                 f"{machine_name}", args.batch_size * args.accumulate, warnings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
