"""The tracer: complete, correctly attributed and annotated records; valid outputs; no trace when off."""
from __future__ import annotations

import importlib
import itertools
import json
import math
import re
import subprocess
import sys
from collections import Counter

import pytest

from pydtnn_lite import kernels
from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm import Request, SerialCommunicator
from pydtnn_lite.costs import ALLREDUCE, BUCKET_CALLS, FUSED_KERNELS, NO_LAYER, Stage
from pydtnn_lite.data import SyntheticDataset, open_dataset
from pydtnn_lite.kernels import blas
from pydtnn_lite.layers import Conv2D, Dense, Flatten, ReLU
from pydtnn_lite.models import create_model
from pydtnn_lite.network import Network
from pydtnn_lite.step_costs import step_costs
from pydtnn_lite.tracing import Tracer, load_trace
from pydtnn_lite.tracing.communicator import TracedRequest
from pydtnn_lite.tracing.records import COMMUNICATION, COMPUTE, EVAL, TRAIN
from pydtnn_lite.training import TrainerSettings, build_trainer
from pydtnn_lite.training.observer import NO_OBSERVER

from helpers import every_layer_network
from mpi import train_cli


def traced_trainer(network: Network, dataset: str = "digits", batch: int = 8, steps: int = 3, skip: int = 1,
                   max_steps=None):
    data = open_dataset(dataset)
    network.build(make_backend(), seed=0)
    trainer = build_trainer(network, data, TrainerSettings(batch, steps_per_epoch=steps))
    tracer = Tracer(trainer, skip_steps=skip, max_steps=max_steps).attach()
    trainer.train_epoch(0)
    trainer.evaluate(open_dataset(dataset, "test"), batch, max_steps=2)
    tracer.detach()
    return trainer, tracer


def zoo(name: str, dataset: str = "digits") -> Network:
    data = open_dataset(dataset)
    return create_model(name, data.input_shape, data.num_classes)


@pytest.mark.parametrize("make", [lambda: every_layer_network((8, 8, 1), 10), lambda: zoo("resnet18"),
                                  lambda: zoo("densenet121")], ids=["every-layer", "resnet18", "densenet121"])
def test_each_step_records_exactly_the_kernels_the_cost_model_lists(make):
    trainer, tracer = traced_trainer(make(), batch=6)
    costs = step_costs(trainer.network, trainer.optimizer, 6)
    expected = Counter((layer, cost.stage, cost.kernel) for layer, cost in costs if cost.kernel != ALLREDUCE)
    # Batch-norm layers reduce their sums over the ranks (a no-op call on one rank), timed as communication.
    reductions = [(layer, cost) for layer, cost in costs if cost.kernel == ALLREDUCE]
    assert [s.step for s in tracer.steps] == [1, 2]
    for step in (1, 2):
        traced = Counter((k.layer, k.stage, k.kernel) for k in tracer.kernels
                         if k.step == step and k.phase == TRAIN and k.thread == COMPUTE and k.stage != Stage.DATA)
        assert traced == expected
        reduced = [k for k in tracer.kernels
                   if k.step == step and k.phase == TRAIN and k.thread == COMMUNICATION and k.layer != NO_LAYER]
        assert reductions and sorted((k.layer, k.stage, k.kernel, k.bytes) for k in reduced) == sorted(
            (layer, cost.stage, cost.kernel, cost.bytes) for layer, cost in reductions)
        annotated = [k for k in tracer.kernels if k.step == step and k.phase == TRAIN and k.stage != Stage.DATA]
        assert not any(math.isnan(k.flops) or math.isnan(k.bytes) for k in annotated)


def test_resnet_trains_fused_and_the_tracer_records_the_fused_kernels():
    """Batch norm then ReLU runs, and is traced, as the fused kernels."""
    network = zoo("resnet18")
    assert not any(isinstance(layer, ReLU) for layer in network.layers[:4])  # conv, bn+relu, pool, ...
    _, tracer = traced_trainer(network, batch=4, steps=2)
    traced = {k.kernel for k in tracer.kernels}
    assert set(FUSED_KERNELS) <= traced  # a block's last batch norm feeds the residual add, unfused


def test_traced_flops_of_a_tiny_network_are_the_hand_computed_ones():
    """The FLOPs a trace reports for each GEMM and bias call, counted by hand for a batch of 5.

    Convolution: 5 x 6 x 6 = 180 output pixels, 4 filters, patches of 3 x 3 x 2 = 18, so
    2 x 180 x 4 x 18 = 25,920 per GEMM (forward and weight gradient; the first layer needs no
    input gradient) and 180 x 4 = 720 per bias call. Dense: 5 samples, 3 units, 144 inputs,
    2 x 5 x 3 x 144 = 4,320 per GEMM (forward, weight and input gradient), 15 per bias call.
    """
    network = Network("tiny", (6, 6, 2), 3)
    network.add(Conv2D(4, 3, padding=1))
    network.add(ReLU())
    network.add(Flatten())
    network.add(Dense(3))
    network.build(make_backend(), seed=0)
    trainer = build_trainer(network, SyntheticDataset(20, (6, 6, 2), 3), TrainerSettings(5, steps_per_epoch=2))
    tracer = Tracer(trainer, skip_steps=1).attach()
    trainer.train_epoch(0)
    tracer.detach()
    traced: dict[tuple, list] = {}
    for k in tracer.kernels:
        if k.kernel in ("gemm", "bias_add", "bias_grad"):
            traced.setdefault((k.layer_name, k.stage, k.kernel), []).append(k.flops)
    assert traced == {("conv1", "FP", "gemm"): [25_920], ("conv1", "FP", "bias_add"): [720],
                      ("conv1", "BP", "gemm"): [25_920], ("conv1", "BP", "bias_grad"): [720],
                      ("dense1", "FP", "gemm"): [4_320], ("dense1", "FP", "bias_add"): [15],
                      ("dense1", "BP", "gemm"): [4_320, 4_320], ("dense1", "BP", "bias_grad"): [15]}


def test_gemm_flops_agree_with_the_operand_shapes_of_each_call():
    _, tracer = traced_trainer(every_layer_network((8, 8, 1), 10))
    gemms = [k for k in tracer.kernels if k.kernel == "gemm" and k.phase == TRAIN]
    assert gemms
    for record in gemms:
        (p, q), (r, s) = (tuple(map(int, shape.split("x"))) for shape in record.shapes.split()[:2])
        # a (p x q) times b (r x s), either transposed: the contracted size appears in both.
        candidates = {2 * p * q * r * s // shared for shared in {p, q} & {r, s}}
        assert record.flops in candidates, record


def test_kernel_records_lie_inside_their_step_and_never_overlap():
    """Records of one rank follow each other in time within their step, so their durations add up.

    How much of the step they cover is a timing figure: benchmarks/tracing_overhead.py prints it."""
    _, tracer = traced_trainer(zoo("vgg11", "synthetic"), dataset="synthetic", batch=8, steps=3)
    for step in tracer.steps:
        events = sorted((k for k in tracer.kernels if k.step == step.step and k.phase == TRAIN),
                        key=lambda k: k.start)
        for before, after in itertools.pairwise(events):
            assert after.start >= before.start + before.duration - 1e-7
        assert events[0].start >= step.start - 1e-7
        assert events[-1].start + events[-1].duration <= step.start + step.duration + 1e-7
        assert sum(k.duration for k in events) <= step.duration + 1e-7


def test_warm_up_limit_and_evaluation_are_kept_apart():
    _, tracer = traced_trainer(every_layer_network((8, 8, 1), 10), steps=5, skip=2, max_steps=2)
    assert [s.step for s in tracer.steps] == [2, 3]
    assert {k.step for k in tracer.kernels if k.phase == TRAIN} == {2, 3}
    evaluation = [k for k in tracer.kernels if k.phase == EVAL]
    assert {k.kernel for k in evaluation} >= {"batchnorm_inference", "gemm", "softmax_cross_entropy"}
    assert not {k.kernel for k in evaluation} & {"batchnorm_sums", "dropout_mask", "sgd_update"}


def test_detaching_restores_the_untraced_code():
    trainer, _ = traced_trainer(every_layer_network((8, 8, 1), 10), steps=2)
    assert kernels.gemm is blas.gemm
    assert trainer.observer is NO_OBSERVER
    assert isinstance(trainer.comm, SerialCommunicator)
    assert trainer.network.scope.__name__ == "no_scope"


def test_two_rank_trace_holds_every_rank_and_valid_chrome_json(tmp_path):
    """--trace-skip 1 --trace-steps 2 of 4 steps traces steps 1 and 2 of both ranks, and the summary's
    per-rank table has a row per rank that agrees with the trace's step records."""
    trace = tmp_path / "trace"
    result = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "4",
                       "--eval-steps", "1", "--run-dir", str(tmp_path), "--trace", str(trace), "--trace-skip", "1",
                       "--trace-steps", "2", "--bucket-mb", "0.01")  # many buckets: tests between kernels
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trace of 2 step(s) per rank" in result.stdout
    records, steps, meta = load_trace(str(trace))
    assert meta["ranks"] == 2 and meta["model"] == "lenet"
    assert sorted((s.rank, s.step) for s in steps) == [(r, s) for r in (0, 1) for s in (1, 2)]
    assert {k.step for k in records if k.phase == TRAIN} == {1, 2}
    assert {k.rank for k in records} == {0, 1}
    assert {k.kernel for k in records} >= {"gemm", "im2col", "allreduce_start", "sgd_update", "data_load"}
    # The buckets' posts, tests and waits are communication the step pays, even between
    # two kernels of backward (a test there keeps the kernel's layer): COMM, as the
    # performance model predicts them.
    assert any(k.kernel == "allreduce_progress" and k.layer != NO_LAYER for k in records)
    assert {k.stage for k in records if k.kernel in BUCKET_CALLS} == {"COMM"}

    document = json.loads((trace / "trace.json").read_text())
    events = document["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 and e["name"] for e in complete)
    assert {e["pid"] for e in complete} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(r, t) for r in (0, 1) for t in ("compute", "communication", "steps")} <= names
    assert len(complete) == len(records) + len(steps)

    summary = subprocess.run([sys.executable, "-m", "pydtnn_lite.trace", "summarize", str(trace)],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "conv1" in summary.stdout and "gemm" in summary.stdout
    # rank, steps, then milliseconds per step: wall, compute, communication, straggler wait
    table = summary.stdout.split("Per rank")[1].splitlines()[3:5]
    rows = {int(cells[0]): (int(cells[1]), *map(float, cells[2:])) for cells in map(str.split, table)}
    assert sorted(rows) == [0, 1]
    for rank, (traced_steps, wall, compute, communication, wait) in rows.items():
        assert traced_steps == 2
        mean_step = sum(s.duration for s in steps if s.rank == rank) / 2 * 1e3
        assert wall == pytest.approx(mean_step, abs=0.006)
        assert compute + communication <= wall + 0.02
        assert wait == pytest.approx(communication - min(row[3] for row in rows.values()), abs=0.011)
    straggler = int(re.search(r"rank (\d+) is the straggler", summary.stdout).group(1))
    assert rows[straggler][4] == 0.0  # the rank every other waits for waits for none


def test_summarize_names_a_directory_that_holds_no_trace(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pydtnn_lite.trace", "summarize", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "is not a trace directory" in result.stderr and "--trace DIR" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("module", ["trace", "predict", "validate", "calibrate", "scalability"])
def test_help_describes_the_program_with_one_paragraph_of_its_docstring(module):
    result = subprocess.run([sys.executable, "-m", f"pydtnn_lite.{module}", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    description = " ".join(result.stdout.split("\n\n")[1].split())
    paragraphs = [" ".join(p.split()) for p in importlib.import_module(f"pydtnn_lite.{module}").__doc__.split("\n\n")]
    assert description in paragraphs
    if module == "trace":
        assert description == "Command line: ``python -m pydtnn_lite.trace summarize DIR`` prints what a trace holds."


def test_a_traced_request_reports_the_collectives_of_the_request_it_times():
    """Calibration tells a pipeline's starts from its other tests by the collectives a request
    has started: a traced request must report its own request's, not the single one of a base."""
    class TwoStages(Request):
        collectives_started = 2

        def test(self) -> bool:
            return True

        def wait(self) -> None:
            """Nothing to wait for."""

    traced = TracedRequest(TwoStages(), lambda kernel, function, args, moved: function(*args))
    assert traced.collectives_started == 2 and traced.test()
