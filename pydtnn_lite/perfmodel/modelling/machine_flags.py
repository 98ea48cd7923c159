"""The command-line flags that describe a machine, shared by ``predict`` and ``validate`` (and the
machine they describe)."""
from __future__ import annotations

import argparse
from collections.abc import Set

from pydtnn_lite import flags
from pydtnn_lite.perfmodel.modelling.calibration_folder import calibration_file
from pydtnn_lite.perfmodel.modelling.clusters import PRESETS
from pydtnn_lite.perfmodel.modelling.machines import (
    ALLREDUCE_MODELS,
    calibrated_machine,
    cluster_machine,
    described_cluster,
)
from pydtnn_lite.perfmodel.modelling.prediction import Machine
from pydtnn_lite.perfmodel.modelling.processors import Processor

FIGURES = ("peak_flops", "mem_bw", "link_bw", "latency")  # the flags that change a preset's figures


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--calibration``, ``--preset``, the figures that change a preset, ``--algorithm``
    and ``--allreduce-model`` to ``parser``."""
    machine = parser.add_argument_group("machine: a calibration file, or a preset changed by any of the figures")
    machine.add_argument("--calibration", default=None, metavar="FILE",
                         help="kernel and Allreduce models from python -m pydtnn_lite.calibrate; a folder of such "
                              "files: the one measured on the run's processor")
    machine.add_argument("--preset", choices=sorted(PRESETS), default=None, help="cluster preset (default ampere)")
    machine.add_argument("--peak-flops",
                         type=flags.real(0.0, 1e21, above=True), default=None, help="peak FLOP/s per node")
    machine.add_argument("--mem-bw",
                         type=flags.real(0.0, 1e18, above=True), default=None,
                         help="memory bandwidth per node, bytes/s")
    machine.add_argument("--link-bw",
                         type=flags.real(0.0, 1e18, above=True), default=None, help="link bandwidth, bytes/s")
    machine.add_argument("--latency", type=flags.real(0.0, 1e3), default=None, help="link latency, seconds")
    machine.add_argument("--algorithm", choices=("ring", "mst", "bkt"), default=None,
                         help="Allreduce algorithm of the model (default: ring for a preset, the best fit for "
                              "a calibration)")
    machine.add_argument("--allreduce-model", choices=ALLREDUCE_MODELS, default="interpolate",
                         help="with a calibration: interpolate its Allreduce times (the fitted model beyond them), "
                              "or the fitted model for every message")


def names_a_machine(args: argparse.Namespace) -> bool:
    """Whether the flags describe a machine: a calibration, a preset, or figures of one."""
    return bool(args.calibration or args.preset or any(getattr(args, figure) is not None for figure in FIGURES))


def machine_from_arguments(args: argparse.Namespace, itemsize: int, processor: Processor,
                           device: str = "cpu", blas: Set[str] = frozenset()) -> tuple[Machine, str, int]:
    """The machine the flags describe, its name, and its nodes (the default number of ranks),
    for a run on ``processor`` and ``device`` whose BLAS runs ``blas`` kernels (which file of
    a calibration folder).
    Without a calibration it is a preset (default ampere) with the figures given replaced."""
    if args.calibration:
        path = calibration_file(args.calibration, processor, device, blas)
        machine = calibrated_machine(path, args.algorithm, args.allreduce_model)
        return machine, f"calibration {path}", machine.calibration.allreduce_ranks
    cluster = described_cluster(args.preset, args.peak_flops, args.mem_bw, args.link_bw, args.latency)
    return cluster_machine(cluster, args.algorithm or "ring", itemsize), cluster.name, cluster.nodes
