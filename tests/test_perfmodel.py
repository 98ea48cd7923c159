"""Performance model: the formulas against hand-computed cases, the step prediction, and the CLIs end to end."""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.gradients import MIB, plan_buckets
from pydtnn_lite.costs import ALLREDUCE, KERNEL_REVISIONS, KernelCost, Stage
from pydtnn_lite.layers import BatchNorm, Conv2D, Dense, Flatten, GlobalAvgPool2D
from pydtnn_lite.network import Network
from pydtnn_lite.optim import SGD
from pydtnn_lite.perfmodel.measuring.allreduce_timing import FULL_SIZES, KIB, log_spaced_sizes
from pydtnn_lite.perfmodel.measuring.host import blas_info, this_processor
from pydtnn_lite.perfmodel.modelling.allreduce import (
    TERMS,
    AllreduceModel,
    InterpolatedAllreduce,
    Link,
    RangeFits,
    allreduce_seconds,
    fit_allreduce,
)
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.channel import TransferCost
from pydtnn_lite.perfmodel.modelling.clusters import PRESETS
from pydtnn_lite.perfmodel.modelling.machines import (
    CalibratedMachine,
    adjusted_machine,
    calibrated_machine,
    cluster_machine,
)
from pydtnn_lite.perfmodel.modelling.outside_kernels import AffineCost
from pydtnn_lite.perfmodel.modelling.prediction import PredictedKernel, StepPrediction, balanced_shares, predict_step
from pydtnn_lite.perfmodel.modelling.processors import Processor, blas_kernels
from pydtnn_lite.perfmodel.modelling.report import MAX_BARS, StageBars, stage_bars, summary_text, validation_figures
from pydtnn_lite.perfmodel.modelling.roofline import Roofline, gemm_intensity
from pydtnn_lite.perfmodel.modelling.scalability import BASELINE_BATCH, study
from pydtnn_lite.perfmodel.modelling.synchronization import expected_maximum, fit_sync_wait
from pydtnn_lite.perfmodel.modelling.trace_validation import processor_warnings
from pydtnn_lite.perfmodel.modelling.validation import Comparison, KernelComparison, Validation, typical, validate
from pydtnn_lite.perfmodel.modelling.workload import build_workload
from pydtnn_lite.step_costs import step_costs
from pydtnn_lite.tracing import load_trace
from pydtnn_lite.tracing.records import KernelRecord, StepRecord

from mpi import REPO, train_cli

LINK = Link(alpha=1e-6, beta=1e-9, gamma=1e-10)
REFERENCE_CALIBRATION = os.path.join(REPO, "calibration", "dev-2core.json")
MB = 1e6


@pytest.mark.parametrize("algorithm,procs,expected", [
    # 2(P-1)a + 2(P-1)/P n b + (P-1)/P n g
    ("ring", 4, 6e-6 + 1.5e-3 + 7.5e-5),
    # 2 ceil(log2 P)(a + n b) + ceil(log2 P) n g, ceil(log2 5) = 3
    ("mst", 5, 6 * (1e-6 + 1e-3) + 3e-4),
    # 2 P a + 2(P-1)/P n b + (P-1)/P n g
    ("bkt", 4, 8e-6 + 1.5e-3 + 7.5e-5),
])
def test_allreduce_formulas(algorithm, procs, expected):
    assert allreduce_seconds(algorithm, procs, MB, LINK) == pytest.approx(expected, rel=1e-12)
    assert allreduce_seconds(algorithm, 1, MB, LINK) == 0.0


def test_fit_recovers_two_bandwidth_regimes():
    truth = AllreduceModel("ring", (Link(3e-6, 0.2e-9, 0.05e-9), Link(20e-6, 0.5e-9, 0.1e-9)), (2 ** 22,))
    sizes = [2 ** k for k in range(10, 29, 2)]
    samples = [(p, n, truth.seconds(n, p)) for p in (2, 3, 4) for n in sizes]
    fitted = fit_allreduce(samples, algorithm="ring", gamma=0.1e-9)
    assert max(abs((fitted.seconds(n, p) - t) / t) for p, n, t in samples) < 0.01
    assert fitted.thresholds == (2 ** 22,)  # a third regime would not pay
    assert fitted.links[1].beta == pytest.approx(0.5e-9, rel=0.01)
    assert fitted.links[0].alpha == pytest.approx(3e-6, rel=0.05)
    assert fitted.link(2 ** 22) == fitted.links[1] and fitted.link(2 ** 22 - 1) == fitted.links[0]
    assert AllreduceModel.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted


def brute_force_fit(samples: list[tuple[int, float, float]], gamma: float) -> tuple[Link, float]:
    """Non-negative least squares of relative error by trying every subset of (alpha, beta)
    with numpy's lstsq: the reference the fit's normal equations must agree with."""
    terms = np.array([TERMS["ring"](p, n) for p, n, _ in samples])
    times = np.array([t for _, _, t in samples])
    best, best_error = Link(0.0, 0.0, gamma), float(np.sum(((times - terms[:, 2] * gamma) / times) ** 2))
    for subset in ([0], [1], [0, 1]):
        columns = terms[:, subset] / times[:, None]
        solution = np.linalg.lstsq(columns, (times - terms[:, 2] * gamma) / times, rcond=None)[0]
        error = float(np.sum((columns @ solution - (times - terms[:, 2] * gamma) / times) ** 2))
        if (solution >= 0).all() and error < best_error:
            full = dict(zip(subset, solution, strict=True))
            best, best_error = Link(full.get(0, 0.0), full.get(1, 0.0), gamma), error
    predicted = terms @ np.array([best.alpha, best.beta, gamma])
    return best, float(np.sum(np.abs(predicted - times) / times))


def test_fit_of_every_size_range_is_the_least_squares_fit_of_its_samples():
    """Ranges of noisy samples, among them ones whose unconstrained fit has a negative alpha
    (a steep bandwidth term), each fitted as a brute-force NNLS of that range alone finds."""
    rng = np.random.default_rng(3)
    sizes = [2.0 ** k for k in range(8, 27)]
    truth = AllreduceModel("ring", (Link(5e-6, 0.3e-9), Link(0.0, 0.8e-9)), (2.0 ** 18,))
    samples = [(p, n, truth.seconds(n, p) * rng.uniform(0.8, 1.25)) for p in (2, 4) for n in sizes]
    ranges = RangeFits("ring", samples, gamma=0.05e-9)
    bounds = [0.0, *sizes[1:], math.inf]
    for low, high in itertools.combinations(bounds, 2):
        within = [s for s in samples if low <= s[1] < high]
        link, error = ranges.fit(low, high)
        expected, expected_error = brute_force_fit(within, 0.05e-9)
        assert link.alpha == pytest.approx(expected.alpha, rel=1e-6, abs=1e-15)
        assert link.beta == pytest.approx(expected.beta, rel=1e-6, abs=1e-20)
        assert error == pytest.approx(expected_error, rel=1e-6, abs=1e-6)


def test_fit_picks_the_algorithm_that_generated_the_samples():
    truth = AllreduceModel("mst", (LINK,))
    samples = [(p, n, truth.seconds(n, p)) for p in (2, 4, 8) for n in (1e3, 1e5, 1e7)]
    assert fit_allreduce(samples).algorithm == "mst"
    with pytest.raises(ValueError, match="mpiexec"):
        fit_allreduce([(1, 1e3, 1e-6)])


def test_interpolation_is_a_power_law_between_samples_and_the_fit_beyond_them():
    fit = AllreduceModel("ring", (Link(1e-6, 1e-9),))
    model = InterpolatedAllreduce.from_samples([(2, 1e6, 1e-4), (2, 4e6, 2e-4), (2, 16e6, 1e-3)], fit)
    assert model.seconds(1e6, 2) == pytest.approx(1e-4, rel=1e-12)  # a sample is its own prediction
    assert model.seconds(2e6, 2) == pytest.approx(math.sqrt(1e-4 * 2e-4), rel=1e-12)  # halfway in log-log
    assert model.seconds(8e6, 2) == pytest.approx(math.sqrt(2e-4 * 1e-3), rel=1e-12)
    # Outside the sampled sizes, and for rank counts not sampled, the fitted model.
    assert model.seconds(32e6, 2) == fit.seconds(32e6, 2) == pytest.approx(2e-6 + 32e6 * 1e-9)
    assert model.seconds(1e3, 2) == fit.seconds(1e3, 2)
    assert model.seconds(2e6, 4) == fit.seconds(2e6, 4)
    assert model.seconds(2e6, 1) == 0.0 and model.algorithm == "ring"


def test_interpolation_never_predicts_less_for_a_larger_message():
    fit = AllreduceModel("ring", (Link(1e-6, 1e-9),))
    # 2 MB measured faster than 1 MB: noise. The two are pooled into their geometric mean.
    # A size measured twice counts with its median.
    samples = [(2, 1e6, 3e-4), (2, 2e6, 2e-4), (2, 4e6, 4e-4), (2, 4e6, 5e-4), (2, 4e6, 6e-4)]
    model = InterpolatedAllreduce.from_samples(samples, fit)
    pooled = math.sqrt(3e-4 * 2e-4)
    assert model.seconds(1e6, 2) == pytest.approx(pooled) and model.seconds(1.5e6, 2) == pytest.approx(pooled)
    assert model.seconds(4e6, 2) == pytest.approx(5e-4)
    times = [model.seconds(n, 2) for n in np.geomspace(1e6, 4e6, 50)]
    assert times == sorted(times)


def test_a_calibration_predicts_allreduce_from_its_samples_unless_told_to_fit():
    path = os.path.join(REPO, "calibration", "dev-2core.json")
    interpolated = calibrated_machine(path)
    fitted = calibrated_machine(path, allreduce="fit")
    assert isinstance(fitted.allreduce, AllreduceModel)
    samples = interpolated.calibration.allreduce_samples
    for procs in {p for p, _, _ in samples}:
        times = [interpolated.allreduce_seconds(n, p) for p, n, _ in sorted(samples) if p == procs]
        assert times == sorted(times), procs
    sizes = sorted(n for _, n, _ in samples)
    assert interpolated.allreduce_seconds(2 * sizes[-1], 2) == fitted.allreduce_seconds(2 * sizes[-1], 2)


def test_the_calibration_samples_allreduce_every_quarter_octave_from_64_kib():
    assert log_spaced_sizes(64 * KIB, 256 * KIB, 2) == tuple(k * KIB for k in (64, 91, 128, 181, 256))
    dense = [n for n in FULL_SIZES if n >= 64 * KIB]
    assert FULL_SIZES[:6] == tuple(KIB << i for i in range(6)) and dense[-1] == 256 << 20
    assert all(b / a == pytest.approx(2 ** 0.25, rel=0.01) for a, b in itertools.pairwise(dense))


def test_expected_maximum_of_normal_draws_and_the_fitted_wait():
    assert expected_maximum(1) == 0.0
    assert expected_maximum(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_maximum(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-9)
    assert expected_maximum(5) == pytest.approx(1.1629644736, rel=1e-9)
    model = fit_sync_wait([(t, 0.012 * t ** 0.7) for t in (1e-3, 1e-2, 1e-1)], ranks=2)
    assert model.coefficient == pytest.approx(0.012) and model.exponent == pytest.approx(0.7)
    assert model.seconds(0.4, 2) == pytest.approx(0.012 * 0.4 ** 0.7)
    assert model.seconds(0.4, 8) == pytest.approx(0.012 * 0.4 ** 0.7 * expected_maximum(8) / expected_maximum(2))
    assert model.seconds(0.4, 1) == 0.0
    assert fit_sync_wait([(0.1, 0.01), (0.2, 0.02)], ranks=1).seconds(0.4, 8) == 0.0  # one rank measures no wait


def test_the_fitted_wait_grows_at_most_as_the_work_and_at_least_as_its_square_root():
    # Waits that grow as T ** 2 over the probes' range: held at T ** 1, with the coefficient
    # that gives the samples' total wait under that exponent.
    segments = (0.05, 0.1, 0.2)
    model = fit_sync_wait([(t, 0.3 * t ** 2) for t in segments], ranks=2)
    assert model.exponent == 1.0
    assert model.coefficient == pytest.approx(0.3 * sum(t ** 2 for t in segments) / sum(segments))
    flat = fit_sync_wait([(t, 0.002 * t ** 0.1) for t in (0.1, 1.0, 10.0)], ranks=2)
    assert flat.exponent == 0.5
    assert flat.coefficient == pytest.approx(0.002 * (0.1 ** 0.1 + 1 + 10 ** 0.1) / (0.1 ** 0.5 + 1 + 10 ** 0.5))


def test_the_fitted_wait_is_the_mean_of_skewed_waits_not_their_geometric_mean():
    # Most stretches end with a short wait and one in four with a long one, in proportion to
    # the stretch: a step pays the mean, 3 % of its work here, where the geometric mean of
    # the waits (what a line in log-log gives) is 1.7 %. A wait of 0 counts in the mean.
    waits = (0.01, 0.01, 0.01, 0.09)
    samples = [(t, share * t) for t in (0.1, 0.2) for share in waits]
    model = fit_sync_wait(samples, ranks=2)
    assert model.exponent == pytest.approx(1.0)
    assert model.seconds(0.3, 2) == pytest.approx(0.03 * 0.3)
    assert fit_sync_wait(samples + [(0.1, 0.0), (0.2, 0.0)], ranks=2).seconds(0.3, 2) == pytest.approx(0.024 * 0.3)


def test_a_calibration_file_s_wait_is_fitted_again_from_its_samples_as_it_loads(tmp_path):
    path = tmp_path / "calibration.json"
    data = json.loads(open(REFERENCE_CALIBRATION, encoding="utf-8").read())
    data["synchronization"] = {"model": {"coefficient": 0.33, "exponent": 2.1, "ranks": 2},
                               "samples": [[t, 0.3 * t ** 2] for t in (0.05, 0.1, 0.2)]}
    path.write_text(json.dumps(data))
    assert Calibration.load(str(path)).sync_wait == fit_sync_wait([(t, 0.3 * t ** 2) for t in (0.05, 0.1, 0.2)], 2)


def test_roofline_bounds():
    roof = Roofline(peak_flops=100e9, memory_bandwidth=10e9)
    assert roof.seconds(1e9, 1e6) == pytest.approx(1e-2)  # compute bound
    assert roof.seconds(1e6, 1e9) == pytest.approx(1e-1)  # memory bound
    assert roof.attainable_flops(2.0) == 20e9
    assert gemm_intensity(100, 100, 100, 4) == pytest.approx(2e6 / (3e4 * 4))


class ConstantMachine:
    """Every kernel ``kernel`` seconds, every Allreduce ``reduce`` seconds, a wait of
    ``wait`` times the work since the last synchronisation, ``outside`` seconds outside
    the kernels per kernel call, ``load`` seconds per sample loaded, ``background`` the
    share of reading ahead that the step waits for, ``during`` seconds for a reduction
    that runs while ranks compute (default ``reduce``), whether a reduction's phases begin
    only inside an MPI call (``starts_inside_calls``) and the CPU seconds per byte of a
    bucket moved in the tests (``transfer``, ``in_tests`` of it inside them), the bytes that
    move between two tests (``window``), the seconds of posting a bucket (``post``) and of
    starting its later collectives (``start``; hand-checkable steps), and the factor
    ``in_cache`` of a call whose data a rank moved at most ``cache`` bytes past, and the
    share ``left`` of a bucket's reduction that its own calls do where blocking reductions
    follow it on one node. Its channel is flat (no pipeline whose blocking calls carry only
    the started buckets)."""

    pipelines_in_tests = False

    def __init__(self, kernel: float, reduce: float, overlaps_communication: bool = True, wait: float = 0.0,
                 outside: float = 0.0, load: float = 0.0, background: float = 1.0,
                 during: float | None = None, starts_inside_calls: bool = False, transfer: float = 0.0,
                 window: float = math.inf, post: float = 0.0, in_tests: float = 1.0, start: float = 0.0,
                 cache: float = 0.0, in_cache: float = 1.0, left: float = 1.0, post_test: float = 0.0) -> None:
        self.kernel, self.reduce, self.overlaps_communication = kernel, reduce, overlaps_communication
        self.starts_inside_calls, self.transfer, self.window = starts_inside_calls, transfer, window
        self.post, self.in_tests, self.start, self.post_test = post, in_tests, start, post_test
        self.wait, self.outside, self.load, self.background = wait, outside, load, background
        self.during = reduce if during is None else during
        self.cache, self.in_cache, self.left = cache, in_cache, left
        self.since_use: list[tuple[str, float]] = []  # each cache_factor call's kernel and time since the data's use

    def overhead_seconds(self, calls: int, network: str = "", batch: int = 0, dataset: str | None = None) -> float:
        return self.outside * calls

    def data_load_seconds(self, dataset: str, samples: int) -> float:
        return self.load * samples

    def background_seconds(self, seconds: float) -> float:
        return self.background * seconds

    def sync_wait_seconds(self, segment: float, procs: int) -> float:
        return self.wait * segment if procs > 1 else 0.0

    def kernel_seconds(self, kernel: str, cost: KernelCost) -> float:
        return self.kernel

    def kernel_seconds_of(self, kernel: str, costs: list[KernelCost]) -> list[float]:
        return [self.kernel] * len(costs)

    def allreduce_seconds(self, nbytes: float, procs: int) -> float:
        return self.reduce if procs > 1 else 0.0

    def link_seconds(self, nbytes: float, procs: int) -> float:
        return self.allreduce_seconds(nbytes, procs)

    def allreduce_during_compute_seconds(self, nbytes: float, procs: int) -> float:
        return self.during if procs > 1 else 0.0

    @property
    def transfer_cost(self) -> TransferCost:
        return TransferCost(self.transfer, self.window, self.post, self.in_tests, self.start, self.post_test)

    def cache_factor(self, kernel: str, nbytes: float, moved: float, since_use: float = 0.0) -> float:
        self.since_use.append((kernel, since_use))
        return self.in_cache if moved <= self.cache else 1.0

    def bucket_share_left(self, nbytes: float, procs: int) -> float:
        return self.left


def test_a_step_that_fits_in_the_cache_runs_its_bucket_reductions_and_updates_resident():
    """MLP on 2 ranks, every kernel 1 ms, every reduction 10 ms, a resident call half its
    time. A bucket's data was last used as backward wrote it; an update's state a whole
    step before, its parameter and gradient by its layer's backward and the reductions: a
    cache that holds the step's bytes halves them all, one a byte short of them the
    reductions and the updates' parameter and gradient (their bytes' share), none nothing."""
    network, optimizer = build_workload("mlp", "cifar10")
    costs = step_costs(network, optimizer, 8)
    step_bytes = sum(cost.bytes for _, cost in costs if cost.kernel != ALLREDUCE) + network.param_count * 4

    def predicted(cache: float) -> tuple[list[float], list[float], float]:
        machine = ConstantMachine(1e-3, 10e-3, overlaps_communication=False, cache=cache, in_cache=0.5)
        step = predict_step(network, optimizer, 8, 2, machine)
        updates = [k.seconds for k in step.kernels if k.kernel == optimizer.kernel]
        return updates, step.bucket_seconds, step.step_without_overlap

    evicted, evicted_buckets, evicted_step = predicted(0.0)
    assert evicted == [1e-3] * len(network.segments) and evicted_buckets == [10e-3] * len(evicted_buckets)
    updates, buckets, step = predicted(step_bytes)
    assert updates == [0.5e-3] * len(network.segments) and buckets == [5e-3] * len(buckets)
    saved = 0.5e-3 * len(updates) + 5e-3 * len(buckets)  # every bucket's reduction adds its duration here
    assert step == pytest.approx(evicted_step - saved)
    updates, buckets, _ = predicted(step_bytes - 1)
    assert optimizer.state_byte_share == pytest.approx(2 / 5)  # SGD's velocity, read and written, of 5 arrays
    assert updates == pytest.approx([1e-3 * (0.4 + 0.6 * 0.5)] * len(network.segments))
    assert buckets == [5e-3] * len(buckets)


def test_an_update_s_data_has_two_ages_and_a_bucket_s_was_last_used_as_its_backward_began():
    """MLP on 2 ranks (dense layers 1, 3 and 5 between ReLUs 2 and 4, the loss 6), every
    kernel 1 ms and 0.1 ms outside each. An update's state was last used a whole step of
    kernels before. Its parameter and gradient by its layer's last backward kernel: the
    step runs backward from the loss to layer 1, then the updates of layers 1, 3 and 5, so
    layer 1's update follows its backward, layer 3's comes 4 calls later (ReLU 2's, layer
    1's two and layer 1's update) and layer 5's 9 (ReLU 4's, layer 3's three, ReLU 2's,
    layer 1's two, two updates). A bucket's data was last used from the start of the
    backward of its last layer to its reduction (the BP kernels of the layers it holds)."""
    network, optimizer = build_workload("mlp", "cifar10")
    costs = step_costs(network, optimizer, 8)
    machine = ConstantMachine(1e-3, 10e-3, outside=0.1e-3)
    step = predict_step(network, optimizer, 8, 2, machine)
    calls = sum(cost.kernel != ALLREDUCE for _, cost in costs)
    assert {kernel for kernel, _ in machine.since_use} == {optimizer.kernel, ALLREDUCE}
    assert [s.layer for s in network.segments] == [1, 3, 5]
    updates = [since for kernel, since in machine.since_use if kernel == optimizer.kernel]
    whole_step = calls * 1.1e-3
    assert updates == pytest.approx([whole_step, 0.0, whole_step, 4 * 1.1e-3, whole_step, 9 * 1.1e-3])
    backward = Counter(layer for layer, cost in costs if cost.stage == Stage.BP and cost.kernel != ALLREDUCE)
    buckets = plan_buckets(network, 4 * MIB)
    expected = []
    for bucket in buckets:
        last = max(s.layer for s in network.segments if s.start < bucket.stop and s.stop > bucket.start)
        expected.append(1e-3 * sum(backward[layer] for layer in range(bucket.first_layer, last + 1)))
    assert [since for kernel, since in machine.since_use if kernel == ALLREDUCE] == pytest.approx(expected)
    assert len(step.bucket_seconds) == len(buckets) > 1


def test_prediction_adds_up_and_overlap_hides_communication_behind_backward():
    network, optimizer = build_workload("vgg11", "cifar10")
    single = predict_step(network, optimizer, 16, 1, ConstantMachine(1e-3, 1.0))
    assert single.bucket_bytes == [] and single.stage_seconds["COMM"] == 0.0
    assert single.step_without_overlap == pytest.approx(1e-3 * len(single.kernels))
    assert single.step_with_overlap == pytest.approx(single.step_without_overlap)

    slow_network = predict_step(network, optimizer, 16, 4, ConstantMachine(1e-3, 0.5), bucket_mb=4.0)
    buckets = len(slow_network.bucket_bytes)
    assert buckets > 3 and sum(slow_network.bucket_bytes) == pytest.approx(network.param_count * 4)
    compute = sum(slow_network.stage_seconds[s] for s in ("FP", "BP", "WU"))
    assert slow_network.step_without_overlap == pytest.approx(compute + 0.5 * (buckets + 1))
    # Communication far longer than backward: at most the backward after the first bucket is hidden.
    hidden = slow_network.step_without_overlap - slow_network.step_with_overlap
    assert 0 < hidden < slow_network.stage_seconds["BP"]

    fast_network = predict_step(network, optimizer, 16, 4, ConstantMachine(1e-3, 1e-9), bucket_mb=4.0)
    # Communication negligible: only the last bucket (started after the first layer) is exposed.
    assert fast_network.step_with_overlap == pytest.approx(compute + 2e-9, abs=1e-12)

    host_mpi = predict_step(network, optimizer, 16, 4, ConstantMachine(1e-3, 0.5, overlaps_communication=False))
    assert host_mpi.step_with_overlap == pytest.approx(host_mpi.step_without_overlap)


@pytest.mark.parametrize("overlaps", [True, False])
def test_a_step_that_accumulates_computes_each_micro_batch_and_reduces_after_the_last(overlaps):
    network, optimizer = build_workload("vgg11", "cifar10")
    machine = ConstantMachine(1e-3, 0.5, overlaps_communication=overlaps, wait=0.1)
    one = predict_step(network, optimizer, 8, 2, machine)
    three = predict_step(network, optimizer, 8, 2, machine, accumulate=3)

    def calls(prediction, stage):
        return Counter((k.layer, k.kernel) for k in prediction.kernels if k.stage == stage)
    summing = [k for k in three.kernels if k.kernel in ("start_gradient_sum", "accumulate_gradients")]
    assert calls(three, "FP") == {key: 3 * n for key, n in calls(one, "FP").items()}
    assert calls(three, "BP") - Counter({(-1, "start_gradient_sum"): 1, (-1, "accumulate_gradients"): 2}) == {
        key: 3 * n for key, n in calls(one, "BP").items()}
    assert calls(three, "WU") == calls(one, "WU") and three.accumulate == 3
    # The first micro-batch's gradients are copied (read, written), the later ones added (read twice, written).
    gradient = network.param_count * 4
    assert [(k.kernel, k.occurrence, k.micro_batch, k.bytes) for k in summing] == [
        ("start_gradient_sum", 0, 0, 2 * gradient), ("accumulate_gradients", 0, 1, 3 * gradient),
        ("accumulate_gradients", 1, 2, 3 * gradient)]
    # Nothing overlaps: every bucket and the loss reduced after backward, then the wait for the
    # slowest rank after all the compute since the last update (no batch norm in VGG11).
    compute = 1e-3 * sum(k.stage in ("FP", "BP", "WU") for k in three.kernels)
    reductions = 0.5 * (len(three.bucket_bytes) + 1)
    assert three.step_with_overlap == pytest.approx(three.step_without_overlap)
    assert three.step_without_overlap == pytest.approx(1.1 * compute + reductions)


def test_each_micro_batch_waits_for_the_slowest_rank_at_its_own_batch_norm_reductions():
    network, optimizer = _two_batch_norms()
    machine = ConstantMachine(1e-3, 0.5, overlaps_communication=False, wait=0.1)
    one = predict_step(network, optimizer, 4, 2, machine)
    two = predict_step(network, optimizer, 4, 2, machine, accumulate=2)
    reductions = [k for k in two.kernels if k.kernel == ALLREDUCE and k.stage != "COMM"]
    assert len(reductions) == 2 * sum(k.kernel == ALLREDUCE and k.stage != "COMM" for k in one.kernels)
    assert {k.micro_batch for k in reductions} == {0, 1}
    # Two batch-norm reductions in FP and two in BP per micro-batch, and the end of the step.
    assert two.synchronisations == 2 * (one.synchronisations - 1) + 1
    # Every piece of work lies between two synchronisations: the waits add up to a tenth of it.
    compute = 1e-3 * sum(k.stage in ("FP", "BP", "WU") and k.kernel != ALLREDUCE for k in two.kernels)
    assert two.wait_seconds == pytest.approx(0.1 * compute)
    # The first micro-batch's first reduction follows the previous step's update, the first
    # convolution and the batch norm's sums; the second's follows the first's input gradient of
    # that batch norm, backward of the convolution and the sum of the gradients, then the same
    # convolution and sums.
    first, second = (next(k for k in reductions if k.stage == "FP" and k.micro_batch == i) for i in (0, 1))
    update = sum(k.stage == "WU" for k in one.kernels)
    conv_backward = sum(k.stage == "BP" and k.layer == 0 for k in one.kernels)
    assert second.seconds - first.seconds == pytest.approx(0.1 * 1e-3 * (1 + conv_backward + 1 - update))


def test_where_the_link_is_the_bottleneck_the_wait_for_the_slowest_rank_hides_behind_it():
    """Conv - Conv - pool - Flatten - Dense, its first bucket the Dense layer's gradient
    alone, the second the rest. A bucket ends only once the slowest rank has posted it,
    and that rank runs its work a fraction ``wait`` slower. On an idle link the others wait
    for it at the end, the whole ``wait`` of the step's work; on a link busy until long
    after backward the buckets end when it has moved them, and the wait adds only how
    much later the slowest rank posted the first bucket."""
    net = Network("lag", (6, 6, 3), 4)
    for layer in (Conv2D(5, 3, padding=1), Conv2D(7, 3, padding=1), GlobalAvgPool2D(), Flatten(), Dense(4)):
        net.add(layer)
    network = net.build(make_backend("cpu", "float32"), seed=0)
    optimizer = SGD(network, momentum=0.0)
    dense = len(network.layers) - 1
    first_bucket_mb = network.layers[dense].param_count * 4 / MIB
    kernel, wait = 1e-3, 0.1

    def step(reduce: float, lag: float, outside: float = 0.0) -> StepPrediction:
        return predict_step(network, optimizer, 8, 2, ConstantMachine(kernel, reduce, wait=lag, outside=outside),
                            bucket_mb=64.0, first_bucket_mb=first_bucket_mb)

    idle, idle_lagging = step(1e-9, 0.0), step(1e-9, wait)
    assert len(idle.bucket_bytes) == 2
    work = kernel * sum(k.stage in ("FP", "BP", "WU") for k in idle.kernels)
    assert idle_lagging.step_with_overlap - idle.step_with_overlap == pytest.approx(wait * work)

    busy, busy_lagging = step(1.0, 0.0), step(1.0, wait)
    # The first bucket is posted once the loss's and the Dense layer's backward are done.
    before_first_post = kernel * sum(k.stage in ("FP", "WU") or (k.stage == "BP" and k.layer >= dense)
                                     for k in busy.kernels)
    assert busy.step_with_overlap - work > 1.0  # the buckets outlast backward
    assert busy_lagging.step_with_overlap - busy.step_with_overlap == pytest.approx(wait * before_first_post)
    assert next(k for k in busy_lagging.kernels if k.kernel == "sync_wait").seconds == pytest.approx(wait * work)
    # The interpreter's time between backward's calls passes beside the link too: of the
    # calls after the first post, it hides.
    outside = 1e-4
    calls = sum(k.stage in ("FP", "BP", "WU") for k in busy.kernels)
    after_first_post = sum(k.stage == "BP" and k.layer < dense for k in busy.kernels)
    assert step(1.0, 0.0, outside).step_with_overlap - busy.step_with_overlap == pytest.approx(
        outside * (calls - after_first_post))


def _two_batch_norms() -> tuple[Network, SGD]:
    """Conv - BN - Conv - BN - pool - Flatten - Dense on 6x6x3 inputs, and SGD without momentum."""
    net = Network("queue", (6, 6, 3), 4)
    for filters in (5, 7):
        net.add(Conv2D(filters, 3, padding=1, use_bias=False))
        net.add(BatchNorm())
    for layer in (GlobalAvgPool2D(), Flatten(), Dense(4)):
        net.add(layer)
    network = net.build(make_backend("cpu", "float32"), seed=0)
    return network, SGD(network, momentum=0.0)


def test_a_batch_norm_reduction_of_backward_waits_for_the_buckets_ahead_of_it_on_the_channel():
    """Conv - BN - Conv - BN - pool - Flatten - Dense, its first bucket the Dense layer's
    gradient alone, the second the rest (ready only when backward is done). The second BN's
    reduction in backward goes out behind the first bucket, and waits for it."""
    network, optimizer = _two_batch_norms()
    dense, second_bn = len(network.layers) - 1, 3
    first_bucket_mb = network.layers[dense].param_count * 4 / MIB
    kernel, reduce = 1e-3, 0.5

    def bn_reductions(overlaps: bool) -> tuple[dict[int, float], StepPrediction]:
        step = predict_step(network, optimizer, 8, 2, ConstantMachine(kernel, reduce, overlaps_communication=overlaps),
                            bucket_mb=1.0, first_bucket_mb=first_bucket_mb)
        assert [b / 4 for b in step.bucket_bytes] == [network.layers[dense].param_count,
                                                       network.param_count - network.layers[dense].param_count]
        return {k.layer: k.seconds for k in step.kernels if k.kernel == "allreduce" and k.stage == "BP"}, step

    queued, step = bn_reductions(True)
    # The bucket starts when the Dense layer's backward is done; the BN's reduction comes after
    # the backward of the layers between them and its own first kernel (the sums).
    between = sum(k.stage == "BP" and second_bn < k.layer < dense for k in step.kernels) + 1
    assert queued[second_bn] == pytest.approx(reduce + (reduce - between * kernel))
    assert queued[1] == pytest.approx(reduce)  # the channel is free again by then
    unqueued, _ = bn_reductions(False)  # reductions that move no data beside the compute queue for nothing
    assert unqueued == {1: pytest.approx(reduce), second_bn: pytest.approx(reduce)}


def test_on_one_node_a_batch_norm_reduction_of_backward_finishes_the_buckets_posted_before_it():
    """The network above on one node, where a bucket moves only inside MPI calls and its own
    calls do a quarter of it where blocking reductions follow its post. The Dense layer's
    bucket is posted before the second BN's reduction, which takes the other three
    quarters; the rest of the gradient is ready only as backward ends, after every
    reduction, and stays whole in its calls. The step's time moves from COMM to BP: its
    totals are those of buckets left whole. Where the ranks wait for the slowest there,
    the bucket's work runs inside the wait, and only what outlasts it lengthens the step."""
    network, optimizer = _two_batch_norms()
    dense, second_bn = len(network.layers) - 1, 3
    first_bucket_mb = network.layers[dense].param_count * 4 / MIB
    kernel, reduce = 1e-3, 0.5

    def step(left: float, wait: float = 0.0) -> StepPrediction:
        machine = ConstantMachine(kernel, reduce, overlaps_communication=False, wait=wait, left=left)
        return predict_step(network, optimizer, 8, 2, machine, bucket_mb=1.0, first_bucket_mb=first_bucket_mb)

    def bn_reductions(prediction: StepPrediction) -> dict[int, float]:
        return {k.layer: k.seconds for k in prediction.kernels if k.kernel == "allreduce" and k.stage == "BP"}

    whole, quarter = step(1.0), step(0.25)
    assert bn_reductions(quarter) == {1: pytest.approx(reduce), second_bn: pytest.approx(reduce + 0.75 * reduce)}
    buckets = [k.seconds for k in quarter.kernels if k.kernel == "allreduce" and k.stage == "COMM"][:-1]
    assert buckets == [pytest.approx(0.25 * reduce), pytest.approx(reduce)]
    assert quarter.bucket_seconds == whole.bucket_seconds == [reduce, reduce]
    assert quarter.stage_seconds["BP"] - whole.stage_seconds["BP"] == pytest.approx(0.75 * reduce)
    assert whole.stage_seconds["COMM"] - quarter.stage_seconds["COMM"] == pytest.approx(0.75 * reduce)
    for overlap in (True, False):
        assert quarter.step_seconds(overlap) == pytest.approx(whole.step_seconds(overlap))

    waiting, waiting_quarter = step(1.0, wait=10.0), step(0.25, wait=10.0)
    waited = bn_reductions(waiting)[second_bn] - reduce  # the wait for the slowest in the second BN's reduction
    assert 0 < waited < 0.75 * reduce
    assert bn_reductions(waiting_quarter)[second_bn] == pytest.approx(reduce + max(waited, 0.75 * reduce))
    assert waiting.step_with_overlap - waiting_quarter.step_with_overlap == pytest.approx(waited)

    # Without overlap backward posts no bucket: the reductions do none of them, each bucket is
    # whole in its own calls after backward, and the step is the same either way.
    machine = ConstantMachine(kernel, reduce, overlaps_communication=False, left=0.25)
    blocking = predict_step(network, optimizer, 8, 2, machine, bucket_mb=1.0, first_bucket_mb=first_bucket_mb,
                            overlap=False)
    assert bn_reductions(blocking) == {1: pytest.approx(reduce), second_bn: pytest.approx(reduce)}
    assert [k.seconds for k in blocking.kernels if k.kernel == "allreduce" and k.stage == "COMM"] == [
        pytest.approx(reduce)] * 3
    assert blocking.step_with_overlap == pytest.approx(blocking.step_without_overlap)
    assert blocking.step_without_overlap == pytest.approx(whole.step_without_overlap)


def test_over_mpi_a_reduction_phase_begins_only_at_a_test_once_the_one_before_it_has_arrived():
    """Three Dense layers, a bucket each, reduced by 2 ranks in two phases of 1.5 kernels.
    Backward runs the loss's kernel, then 3, 3 and 2 kernels for layers 2, 1 and 0; the
    tests come between kernels. With a kernel of 1, NCCL runs bucket A (layer 2) over 4-7,
    B over 7-10 and C over 10-13: 4 after backward ends at 9. Over MPI, A's second phase
    waits for the test at 6 (its first arrived at 5.5), B's first goes out behind it at
    7.5-9 and its second, C's two at the end: 13.5, half a kernel more. The data the tests'
    phases move while the rank computes costs it their CPU time, which lengthens backward
    and counts as communication (what the link moves inside the final wait costs nothing
    more)."""
    net = Network("calls", (4,), 3)
    for width in (8, 8, 3):
        net.add(Dense(width))
    network = net.build(make_backend("cpu", "float32"), seed=0)
    optimizer = SGD(network, momentum=0.0)
    sizes = [layer.param_count for layer in network.layers]
    kernel = 1e-3
    assert [sum(cost.stage == "BP" for layer, cost in network.costs(8) if layer == index)
            for index in range(3)] == [2, 3, 3]

    def predicted(starts_inside_calls: bool, transfer: float = 0.0,
                  in_tests: float = 1.0) -> tuple[float, StepPrediction]:
        machine = ConstantMachine(kernel, 3 * kernel, starts_inside_calls=starts_inside_calls, transfer=transfer,
                                  in_tests=in_tests)
        step = predict_step(network, optimizer, 8, 2, machine, bucket_mb=max(sizes) * 4 / MIB,
                            first_bucket_mb=sizes[2] * 4 / MIB)
        assert [n / 4 for n in step.bucket_bytes] == [sizes[2], sizes[1], sizes[0]]
        compute = sum(step.stage_seconds[stage] for stage in ("FP", "BP", "WU"))
        return step.step_with_overlap - compute - 3 * kernel, step  # less the loss reduction

    assert predicted(False)[0] == pytest.approx(4 * kernel)
    assert predicted(True)[0] == pytest.approx(4.5 * kernel)
    transfer = 1e-6  # seconds per byte: a few hundredths of a kernel per phase
    exposed, step = predicted(True, transfer)
    cpu = {k.layer: k.seconds for k in step.kernels if k.kernel == "transfer_cpu"}
    # A moves during the backward of layers 1 and 0, B's first phase during layer 0's.
    assert set(cpu) == {0, 1}
    assert sum(cpu.values()) == pytest.approx(transfer * 4 * (sizes[2] + sizes[1] / 2))
    # The tests' CPU time is communication the step pays, as the trace counts the tests.
    assert {k.stage for k in step.kernels if k.kernel == "transfer_cpu"} == {"COMM"}
    assert exposed == pytest.approx(4.5 * kernel + sum(cpu.values()))
    untransferred = predicted(True)[1]
    assert step.step_with_overlap == pytest.approx(untransferred.step_with_overlap + sum(cpu.values()))
    assert step.step_without_overlap == pytest.approx(untransferred.step_without_overlap)  # no tests to pay
    # A quarter inside the tests, the rest in the kernels the network stack slows: the same step.
    exposed, split = predicted(True, transfer, in_tests=0.25)
    by_stage = {stage: sum(k.seconds for k in split.kernels if k.kernel == "transfer_cpu" and k.stage == stage)
                for stage in ("COMM", "BP")}
    assert by_stage == pytest.approx({"COMM": sum(cpu.values()) / 4, "BP": 3 * sum(cpu.values()) / 4})
    assert exposed == pytest.approx(4.5 * kernel + sum(cpu.values()) / 4)
    assert split.step_with_overlap == pytest.approx(step.step_with_overlap)


def test_over_mpi_posting_each_bucket_costs_the_step_its_time_as_communication():
    """MPICH over TCP starts sending inside the call that posts a bucket: with reductions that
    take no time, each of VGG11's buckets adds its post to the step, as a COMM entry."""
    network, optimizer = build_workload("vgg11", "cifar10")

    def step(post: float, start: float = 0.0, post_test: float = 0.0) -> StepPrediction:
        return predict_step(network, optimizer, 16, 2, ConstantMachine(1e-3, 1e-9, starts_inside_calls=True,
                                                                       post=post, start=start, post_test=post_test),
                            bucket_mb=4.0)

    bare, posted = step(0.0), step(2e-4)
    buckets = len(posted.bucket_bytes)
    assert buckets > 3
    assert [k.seconds for k in posted.kernels if k.kernel == "allreduce_start"] == [2e-4] * buckets
    assert posted.step_with_overlap == pytest.approx(bare.step_with_overlap + buckets * 2e-4)
    assert posted.step_without_overlap == pytest.approx(bare.step_without_overlap)  # blocking calls post nothing
    # A pipeline's later starts, made in the tests, cost each bucket as much again, in COMM.
    started = step(2e-4, start=3e-4)
    assert [k.seconds for k in started.kernels if k.kernel == "allreduce_progress"] == [3e-4] * buckets
    assert started.stage_seconds["COMM"] == pytest.approx(posted.stage_seconds["COMM"] + buckets * 3e-4)
    assert started.step_with_overlap == pytest.approx(posted.step_with_overlap + buckets * 3e-4)
    assert started.step_without_overlap == pytest.approx(bare.step_without_overlap)
    # The test right after each post is a test as the trace has it: with the starts, in one
    # progress entry a bucket, and the step as long as with the post timed with it.
    tested = step(2e-4, start=3e-4, post_test=1e-4)
    assert [k.seconds for k in tested.kernels if k.kernel == "allreduce_progress"] == pytest.approx([4e-4] * buckets)
    assert [k.seconds for k in tested.kernels if k.kernel == "allreduce_start"] == [2e-4] * buckets
    assert tested.step_with_overlap == pytest.approx(step(3e-4, start=3e-4).step_with_overlap)


def test_reductions_among_ranks_that_share_cores_cost_their_cpu_time_but_the_last():
    """MPI on the host hides no reduction; where ranks time-share the cores, every bucket
    but the last costs the step what it takes from the cores, the last its duration."""
    network, optimizer = build_workload("vgg11", "cifar10")
    shared = predict_step(network, optimizer, 16, 8,
                          ConstantMachine(1e-3, 0.5, overlaps_communication=False, during=0.125), bucket_mb=4.0)
    buckets = len(shared.bucket_bytes)
    assert buckets > 3
    assert shared.step_without_overlap - shared.step_with_overlap == pytest.approx((buckets - 1) * (0.5 - 0.125))


def test_the_step_adds_the_batch_s_loading_and_the_time_outside_the_kernels():
    network, optimizer = build_workload("lenet", "synthetic")
    bare = predict_step(network, optimizer, 16, 1, ConstantMachine(1e-3, 0.0))
    full = predict_step(network, optimizer, 16, 1, ConstantMachine(1e-3, 0.0, outside=1e-5, load=2e-4),
                        dataset="synthetic")
    calls = len(bare.kernels)
    assert full.overhead_seconds == pytest.approx(1e-5 * calls)
    assert full.stage_seconds["DATA"] == pytest.approx(16 * 2e-4 + 1e-3)  # loading, then the copy to the device
    assert full.step_with_overlap == pytest.approx(bare.step_with_overlap + 1e-5 * calls + 16 * 2e-4 + 1e-3)


def test_a_network_sampled_whole_keeps_its_own_time_outside_the_kernels():
    """The grid's fit gives 10 us a call; LeNet, sampled whole at 8 and 32 samples a rank on
    the synthetic set, took 2 and 4 ms outside its kernels: its steps on images of that
    shape (CIFAR-10's too) are predicted from those, in proportion between them and held
    beyond them; other networks and shapes from the fit."""
    calibration = Calibration(machine={}, peak_flops=1e11, memory_bandwidth=1e10, kernel_models={},
                              allreduce_samples=[], settings={"jobs": ["lenet:8:synthetic", "lenet:32:synthetic"]},
                              overhead_samples=[(10.0, 1e-4), (46.0, 2e-3), (46.0, 4e-3)],
                              overhead=AffineCost(0.0, 1e-5))
    assert calibration.overhead_seconds(46, "lenet", 8, "synthetic") == pytest.approx(2e-3)
    assert calibration.overhead_seconds(46, "lenet", 14, "synthetic") == pytest.approx(2.5e-3)
    assert calibration.overhead_seconds(46, "lenet", 64, "cifar10") == pytest.approx(4e-3)
    for other in (("lenet", 8, "digits"), ("mlp", 8, "synthetic"), ("", 0, None)):
        assert calibration.overhead_seconds(46, *other) == pytest.approx(46e-5)
    network, optimizer = build_workload("lenet", "synthetic")
    machine = CalibratedMachine(calibration, None)
    assert predict_step(network, optimizer, 8, 1, machine, dataset="synthetic").overhead_seconds == pytest.approx(2e-3)


def test_a_batch_read_ahead_costs_the_step_only_what_it_takes_from_its_cores_or_the_wait_for_it():
    network, optimizer = build_workload("lenet", "synthetic")
    bare = predict_step(network, optimizer, 16, 1, ConstantMachine(1e-3, 0.0))
    load, copy = 16 * 2e-4, 1e-3

    def ahead(background: float, per_sample: float = 2e-4) -> StepPrediction:
        machine = ConstantMachine(1e-3, 0.0, load=per_sample, background=background)
        return predict_step(network, optimizer, 16, 1, machine, dataset="synthetic", prefetch=True)

    spare_core, busy_cores = ahead(0.0), ahead(0.5)
    assert spare_core.stage_seconds["DATA"] == pytest.approx(load + copy)  # the reading itself, as without prefetch
    assert spare_core.step_with_overlap == pytest.approx(bare.step_with_overlap + copy)  # hidden: only the copy
    assert busy_cores.step_with_overlap == pytest.approx(bare.step_with_overlap + copy + 0.5 * load)
    assert busy_cores.data_in_step(True) == pytest.approx(copy)
    # What the reading takes lands on the step's first kernels, each at most doubled.
    first_kernels = sorted((k for k in busy_cores.kernels if k.stage == "FP"), key=lambda k: k.layer)[:3]
    assert [k.seconds for k in first_kernels] == pytest.approx([2e-3, 1e-3 + (0.5 * load - 1e-3), 1e-3])
    # Reading slower than the step's own work: the step lasts as long as the reading.
    slow = ahead(0.0, per_sample=1.0)
    assert slow.step_with_overlap == pytest.approx(16.0) and slow.step_without_overlap == pytest.approx(16.0)


def test_every_synchronisation_waits_for_the_slowest_rank_after_the_work_since_the_last():
    network, optimizer = build_workload("resnet18", "cifar10")
    machine = ConstantMachine(1e-3, 0.0, overlaps_communication=False, wait=0.1)
    step = predict_step(network, optimizer, 16, 2, machine)
    reductions = [k for k in step.kernels if k.kernel == "allreduce" and k.stage in ("FP", "BP")]
    compute = [k for k in step.kernels if k.stage in ("FP", "BP", "WU") and k.kernel != "allreduce"]
    end_wait = next(k for k in step.kernels if k.kernel == "sync_wait")
    assert len(reductions) == 2 * sum(layer.kind == "bn" for layer in network.layers)  # one in FP, one in BP
    # The waits split the step's work into segments: together they wait 0.1 of all of it.
    assert sum(k.seconds for k in reductions) + end_wait.seconds == pytest.approx(0.1 * 1e-3 * len(compute))
    # The first batch-norm reduction follows the previous step's update, the layers before
    # the batch norm and its own sums.
    first = min((k for k in reductions if k.stage == "FP"), key=lambda k: k.layer)
    before = sum(k.stage == "WU" or (k.stage == "FP" and k.layer < first.layer) for k in compute)
    assert first.seconds == pytest.approx(0.1 * 1e-3 * (before + 1))
    assert step.step_without_overlap == pytest.approx(step.step_with_overlap)
    assert step.step_without_overlap == pytest.approx(1.1e-3 * len(compute))

    plain, plain_optimizer = build_workload("vgg11", "cifar10")
    vgg = predict_step(plain, plain_optimizer, 16, 2, machine)
    vgg_compute = sum(k.seconds for k in vgg.kernels if k.stage in ("FP", "BP", "WU"))
    assert next(k for k in vgg.kernels if k.kernel == "sync_wait").seconds == pytest.approx(0.1 * vgg_compute)
    assert predict_step(plain, plain_optimizer, 16, 1, machine).step_without_overlap == pytest.approx(vgg_compute)


def test_a_batch_norm_reduction_finds_mpich_s_buffers_where_the_reduction_before_it_left_them():
    """ResNet18 on 2 ranks, every kernel 1 ms, every reduction 10 ms, a resident call half
    its time, a wait of 0.1 of the work. A batch-norm reduction's buffers were last used by
    the synchronisation before it, a segment of work before: resident where what the
    segment moved fits in the cache, evicted where not; its wait comes on top either way
    (the first one's segment holds the updates, resident too, so it waits less)."""
    network, optimizer = build_workload("resnet18", "cifar10")

    def reductions(cache: float) -> tuple[dict[tuple[int, str], float], ConstantMachine]:
        machine = ConstantMachine(1e-3, 10e-3, overlaps_communication=False, wait=0.1, cache=cache, in_cache=0.5)
        step = predict_step(network, optimizer, 16, 2, machine)
        return {(k.layer, k.stage): k.seconds for k in step.kernels
                if k.kernel == ALLREDUCE and k.stage in ("FP", "BP")}, machine

    evicted, _ = reductions(0.0)
    resident, machine = reductions(math.inf)
    assert len(resident) == 2 * sum(layer.kind == "bn" for layer in network.layers)
    first = (min(layer for layer, stage in resident if stage == "FP"), "FP")
    updates_saved = 0.5e-3 * len(network.segments)
    assert {key: evicted[key] - resident[key] for key in resident} == pytest.approx(
        {key: 5e-3 + (0.1 * updates_saved if key == first else 0.0) for key in resident})
    # Asked of the cache at their segments' ages (each wait is 0.1 of its segment).
    since = [since for kernel, since in machine.since_use if kernel == ALLREDUCE][:len(resident)]
    assert sorted(since) == pytest.approx(sorted((seconds - 5e-3) / 0.1 for seconds in resident.values()))


def test_predict_and_validate_with_the_reference_calibration(tmp_path):
    calibration = os.path.join(REPO, "calibration", "dev-2core.json")
    document = json.loads(run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--procs", "2",
                              "--calibration", calibration, "--json").stdout)
    assert document["procs"] == 2 and document["step_seconds_with_overlap"] > 0
    assert document["step_seconds_with_overlap"] == pytest.approx(document["step_seconds_without_overlap"])
    # VGG11 has no batch norm: its ranks synchronise once, at the end of the step, and wait there.
    assert document["synchronisations"] == 1 and document["wait_seconds"] > 0
    assert [k["seconds"] for k in document["kernels"] if k["kernel"] == "sync_wait"] == [document["wait_seconds"]]
    # Its two warnings: it timed the max pool's gradient before its gather, and its cache
    # residency timed its evicted updates as the first call after an eviction.
    older_kernel, older_residency = document["warnings"]
    assert "timed older code of maxpool_grad" in older_kernel
    assert "first call after an eviction" in older_residency and "--allreduce-only" in older_residency
    # One process on both cores: the shipped file measured how its threads scale.
    one_process = json.loads(run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--procs", "1",
                                 "--calibration", calibration, "--json").stdout)
    assert "2 BLAS thread(s)" in one_process["machine"] and one_process["warnings"] == document["warnings"]
    fit = json.loads(run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--procs", "2",
                         "--calibration", calibration, "--allreduce-model", "fit", "--json").stdout)
    assert fit["stage_seconds"]["FP"] == document["stage_seconds"]["FP"]
    assert fit["stage_seconds"]["COMM"] != document["stage_seconds"]["COMM"]
    no_mpi = run("pydtnn_lite.predict", "--model", "vgg11", "--procs", "4", "--calibration", str(tmp_path / "x.json"))
    assert no_mpi.returncode == 2 and "cannot read calibration file" in no_mpi.stderr


def edited_reference(tmp_path, edit, name: str = "edited.json") -> str:
    """A copy of the reference calibration file with ``edit`` (a function of its JSON) applied, as ``name``."""
    with open(REFERENCE_CALIBRATION, encoding="utf-8") as handle:
        document = json.load(handle)
    edit(document)
    path = tmp_path / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def test_predict_warns_of_kernels_its_calibration_never_sampled(tmp_path):
    def older(document: dict) -> None:
        for section in ("kernel_models", "kernel_samples"):
            document[section].pop("winograd_filter", None)
    result = run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--procs", "2",
                 "--calibration", edited_reference(tmp_path, older))
    assert result.returncode == 0, result.stderr
    assert ("warning: the calibration holds no samples of winograd_filter (a file older than these kernels)"
            in result.stdout)


def test_predict_warns_where_the_calibration_timed_another_dtype():
    for dtype, warned in (("float64", True), ("float32", False)):
        result = run("pydtnn_lite.predict", "--model", "lenet", "--procs", "2", "--dtype", dtype,
                     "--calibration", REFERENCE_CALIBRATION)
        assert result.returncode == 0, result.stderr
        line = "warning: the calibration timed float32 kernels, the step's are float64"
        assert (line in result.stdout) == warned and ("calibrate with --dtype float64" in result.stdout) == warned


def test_validate_warns_of_a_run_on_another_processor_than_the_calibration_s():
    machine = calibrated_machine(REFERENCE_CALIBRATION)
    calibrated_on = machine.calibration.machine["cpu_model"]
    [line] = processor_warnings(machine, {"device": "cpu", "cpu_model": "Other Processor 9000"})
    assert f"(Other Processor 9000) is not the calibration's ({Processor.of(machine.calibration.machine)})" in line
    assert "calibrate on this processor" in line
    assert processor_warnings(adjusted_machine(machine), {"device": "cpu", "cpu_model": "Other"}) != []
    assert processor_warnings(machine, {"device": "cpu", "cpu_model": calibrated_on}) == []
    assert processor_warnings(machine, {"device": "cpu"}) == []  # a trace from before runs named it
    assert processor_warnings(machine, {"device": "gpu", "cpu_model": "Other"}) == []  # its kernels ran on the GPU
    assert processor_warnings(PRESETS["altec"], {"device": "cpu", "cpu_model": "Other"}) == []
    # One name, another vector unit: another processor (a virtual machine's "AMD EPYC" with and without AVX-512).
    units = {"AVX2", "AVX-512"} - {Processor.of(machine.calibration.machine).vector_unit}
    [line] = processor_warnings(machine, {"device": "cpu", "cpu_model": calibrated_on, "vector_unit": min(units)})
    assert f"({calibrated_on}, {min(units)}) is not the calibration's ({calibrated_on}, " in line
    # The same processor running other BLAS kernels (OPENBLAS_CORETYPE): the GEMMs of another machine.
    same = {"device": "cpu", **Processor.of(machine.calibration.machine).record()}
    ran = sorted(blas_kernels(machine.calibration.machine))
    assert ran and processor_warnings(machine, {**same, "blas": [{"architecture": name} for name in ran]}) == []
    [line] = processor_warnings(machine, {**same, "blas": [{"architecture": "Excavator"}]})
    assert line == (f"the run's BLAS ran Excavator kernels, the calibration's {', '.join(ran)}: its GEMMs are "
                    "predicted at another machine's speed; calibrate with the run's OPENBLAS_CORETYPE")


def test_predict_warns_of_kernels_its_calibration_timed_in_older_code(tmp_path):
    # As written before kernels had revisions: every kernel's first.
    older = edited_reference(tmp_path, lambda document: document.pop("kernel_revisions"), "unrevised.json")
    result = run("pydtnn_lite.predict", "--model", "resnet18", "--batch-size", "16", "--procs", "2",
                 "--calibration", older)
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if "older code" in line]
    assert line.startswith("warning: the calibration timed older code of ") and "calibrate again" in line
    for changed in ("batchnorm_relu_grad_input", "batchnorm_relu_grad_sums", "gemm", "winograd_input_grad"):
        assert changed in line
    # A calibration of this code's revisions (the reference file's models, its record brought up to date).
    measured_now = edited_reference(tmp_path, lambda document: document.update(kernel_revisions=dict(KERNEL_REVISIONS)),
                                    "current.json")
    current = run("pydtnn_lite.predict", "--model", "resnet18", "--batch-size", "16", "--procs", "2",
                  "--calibration", measured_now)
    assert current.returncode == 0 and "older code" not in current.stdout


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


def test_predict_cli_prints_a_table_and_json():
    table = run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "128", "--procs", "8")
    assert table.returncode == 0, table.stderr
    assert "conv1" in table.stdout and "step with overlap" in table.stdout
    document = json.loads(run("pydtnn_lite.predict", "--model", "resnet18", "--preset", "altec", "--json").stdout)
    assert {"model", "dataset", "global_batch", "procs", "local_batch", "machine", "step_seconds",
            "step_seconds_with_overlap", "step_seconds_without_overlap", "stage_seconds", "wait_seconds",
            "synchronisations", "overhead_seconds", "buckets", "kernels", "warnings"} <= set(document)
    assert (document["model"], document["dataset"], document["machine"]) == ("resnet18", "cifar10", "altec")
    assert document["procs"] == 8 and document["local_batch"] == 16 and document["global_batch"] == 128
    assert document["step_seconds"] == document["step_seconds_with_overlap"] > 0
    assert document["step_seconds_with_overlap"] <= document["step_seconds_without_overlap"]
    assert set(document["stage_seconds"]) == {"DATA", "FP", "BP", "WU", "COMM"}
    assert all(math.isfinite(k["seconds"]) and k["seconds"] >= 0 for k in document["kernels"])
    assert {k["stage"] for k in document["kernels"]} == {"DATA", "FP", "BP", "WU", "COMM"}
    # Two micro-batches of 16 images a rank: twice the forward, one update, nothing overlapped.
    accumulating = json.loads(run("pydtnn_lite.predict", "--model", "resnet18", "--preset", "altec", "--json",
                                  "--accumulate", "2").stdout)
    assert accumulating["accumulate"] == 2 and accumulating["local_batch"] == 16
    assert accumulating["stage_seconds"]["FP"] == pytest.approx(2 * document["stage_seconds"]["FP"], rel=0.02)
    assert accumulating["stage_seconds"]["WU"] == pytest.approx(document["stage_seconds"]["WU"])
    assert accumulating["step_seconds_with_overlap"] == pytest.approx(accumulating["step_seconds_without_overlap"])
    assert "x 2 micro-batches a step" in run("pydtnn_lite.predict", "--model", "lenet", "--accumulate", "2").stdout
    blocking = json.loads(run("pydtnn_lite.predict", "--model", "resnet18", "--preset", "altec", "--json",
                              "--no-overlap").stdout)
    assert blocking["step_seconds"] == pytest.approx(blocking["step_seconds_without_overlap"])
    assert blocking["step_seconds_without_overlap"] == pytest.approx(document["step_seconds_without_overlap"])
    clipping = json.loads(run("pydtnn_lite.predict", "--model", "resnet18", "--preset", "altec", "--json",
                              "--clip-grad-norm", "1").stdout)
    added = [k for k in clipping["kernels"] if k not in document["kernels"]]
    assert [(k["layer"], k["stage"], k["kernel"]) for k in added] == [
        (-1, "WU", "gradient_norm"), (-1, "WU", "scale_gradient")]
    assert clipping["stage_seconds"]["WU"] == pytest.approx(
        document["stage_seconds"]["WU"] + sum(k["seconds"] for k in added))


def test_predicting_loads_no_trainer_tracer_or_mpi():
    # Prediction is a function of shapes and a calibration: it must run where no MPI job can.
    unwanted = ("mpi4py", "pydtnn_lite.training.trainer", "pydtnn_lite.tracing.tracer", "pydtnn_lite.comm.mpi")
    code = (f"import sys, pydtnn_lite.predict; print(sorted(name for name in sys.modules for unwanted in {unwanted!r} "
            "if name == unwanted or name.startswith(unwanted + '.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("flags,message", [
    (("--batch-size", "4", "--procs", "8"), "at least --procs 8"),
    (("--model", "vgg99"), "error: unknown model 'vgg99': choose one of"),
    (("--model", "vgg11", "--dataset", "digits"), "error: vgg11 does not fit digits's (8, 8, 1) images"),
    (("--peak-flops", "-1"), "argument --peak-flops: must be a finite number above 0"),
])
def test_predict_cli_bad_input(flags, message):
    result = run("pydtnn_lite.predict", *flags)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _record(step: int, stage: str, layer: int, kernel: str, seconds: float) -> KernelRecord:
    return KernelRecord(0, "train", step, stage, layer, f"layer{layer}", "", kernel, "compute", 0.0, seconds, "",
                        0.0, 0.0)


def test_validation_metrics_against_hand_computed_values():
    # FP: a GEMM measured 3, 5, 4, 4 ms over four steps (median 4) and predicted 5; a ReLU
    # measured 2 ms and predicted 1. The stage's mean measured kernel is 3 ms.
    gemm, relu = [3e-3, 5e-3, 4e-3, 4e-3], [2e-3] * 4
    records = ([_record(step, "FP", 0, "gemm", t) for step, t in enumerate(gemm)]
               + [_record(step, "FP", 1, "relu", t) for step, t in enumerate(relu)]
               + [_record(step, "DATA", -1, "data_load", 1e-3) for step in range(4)])
    steps = [StepRecord(0, step, 0.0, seconds, 16) for step, seconds in enumerate([10e-3, 12e-3, 10e-3, 12e-3])]
    kernels = [PredictedKernel(0, "layer0", "FP", "gemm", 0, 5e-3, 0.0, 0.0),
               PredictedKernel(1, "layer1", "FP", "relu", 0, 1e-3, 0.0, 0.0)]
    prediction = StepPrediction(kernels, [], [], 1, 16, {"FP": 6e-3, "BP": 0.0, "WU": 0.0, "COMM": 0.0}, 6e-3, 6e-3)
    result = validate(records, steps, overlap=False, predict=lambda batch: prediction)

    by_kernel = {k.kernel: k for k in result.kernels}
    assert by_kernel["gemm"].measured == pytest.approx(4e-3) and by_kernel["gemm"].relative_error == pytest.approx(0.25)
    assert by_kernel["gemm"].wre == pytest.approx(1 / 3) and by_kernel["relu"].wre == pytest.approx(-1 / 3)
    forward = next(s for s in result.stages if s.name == "FP")
    assert forward.wre == pytest.approx(1 / 3)  # mean of |WRE_k|
    assert forward.measured == pytest.approx(6e-3) and forward.predicted == pytest.approx(6e-3)
    # Halves: steps 0, 2 against 1, 3. GEMM medians 3.5 and 4.5 ms, ReLU 2 and 2 ms.
    assert forward.half_wre == pytest.approx((1.0 / 2) / ((4.5 + 2) / 2))
    assert forward.half_difference == pytest.approx(1 / 6)  # FP totals 5.5 and 6.5 ms a step
    # The step, loading included: 10 and 12 ms, 11 ms on average, against 6 predicted.
    assert result.step.measured == pytest.approx(11e-3) and result.step.relative_error == pytest.approx(-5 / 11)
    assert result.step.half_difference == pytest.approx(2 / 11)

    # A reduction's calls are mostly waits that the slowest rank does not have: compared by their mean.
    assert typical("allreduce", [0.0, 0.0, 6e-3, 0.0]) == pytest.approx(1.5e-3)
    assert typical("gemm", [0.0, 0.0, 6e-3, 0.0]) == 0.0
    # Ranks that time-share the cores pay the other ranks' turns in some calls: every kernel by its mean.
    shared = validate(records, steps, overlap=False, predict=lambda batch: prediction, time_shared=True)
    assert {k.kernel: k.measured for k in shared.kernels}["gemm"] == pytest.approx(4e-3)  # (3 + 5 + 4 + 4) / 4
    assert next(s for s in shared.stages if s.name == "FP").half_wre == pytest.approx((1.0 / 2) / ((4.5 + 2) / 2))
    skewed = [_record(step, "FP", 0, "gemm", t) for step, t in enumerate([1e-3, 1e-3, 1e-3, 9e-3])]
    assert validate(skewed, steps, overlap=False, predict=lambda batch: prediction,
                    time_shared=True).kernels[0].measured == pytest.approx(3e-3)
    assert validate(skewed, steps, overlap=False, predict=lambda batch: prediction).kernels[0].measured == 1e-3

    one_step = validate(records[:1] + records[4:5], steps[:1], overlap=False, predict=lambda batch: prediction)
    assert math.isnan(one_step.step.half_difference) and all(math.isnan(s.half_wre) for s in one_step.stages)


def test_each_call_of_a_kernel_in_a_layer_is_compared_with_its_own_prediction():
    """A layer's two backward GEMMs (weight gradient first, input gradient second) are told apart by their order
    in the step, on every rank and step: each meets its own prediction, not the other's."""
    records = [KernelRecord(rank, "train", step, "BP", 0, "dense1", "dense", "gemm", "compute", start, seconds, "",
                            0.0, 0.0)
               for rank in (0, 1) for step in (1, 2) for start, seconds in ((0.0, 2e-3), (1.0, 6e-3))]
    steps = [StepRecord(rank, step, 0.0, 10e-3, 16) for rank in (0, 1) for step in (1, 2)]
    kernels = [PredictedKernel(0, "dense1", "BP", "gemm", 0, 2e-3, 0.0, 0.0),
               PredictedKernel(0, "dense1", "BP", "gemm", 1, 6e-3, 0.0, 0.0)]
    prediction = StepPrediction(kernels, [], [], 2, 16, {"FP": 0.0, "BP": 8e-3, "WU": 0.0, "COMM": 0.0}, 8e-3, 8e-3)
    result = validate(records, steps, overlap=False, predict=lambda batch: prediction)
    assert [(k.occurrence, k.measured, k.predicted) for k in result.kernels] == [(0, 2e-3, 2e-3), (1, 6e-3, 6e-3)]
    assert result.unmatched == 0


def test_comm_is_compared_in_posts_tests_and_wait_where_the_model_times_the_bucket_calls():
    """Over a network the model charges the posts of the buckets and the tests between backward's
    kernels apart from the wait at the end: the validation sets each against the trace's calls of
    the same kind, so that two parts that miss in opposite directions show under a right total."""
    def comm(step: int, kernel: str, seconds: float, occurrence_layer: int = -1) -> KernelRecord:
        return KernelRecord(0, "train", step, "COMM", occurrence_layer, "", "", kernel, "communication", 0.0,
                            seconds, "", 0.0, 0.0)
    records = [record for step in range(4) for record in (
        _record(step, "FP", 0, "gemm", 5e-3), _record(step, "BP", 0, "gemm", 5e-3),
        comm(step, "allreduce_start", 1e-3), comm(step, "allreduce_start", 1e-3),
        *(comm(step, "allreduce_progress", 0.5e-3, 0) for _ in range(4)),
        comm(step, "allreduce_wait", 2e-3 if step % 2 == 0 else 4e-3), comm(step, "allreduce", 0.2e-3))]
    steps = [StepRecord(0, step, 0.0, 20e-3, 16) for step in range(4)]
    computing = [PredictedKernel(0, "layer0", "FP", "gemm", 0, 5e-3, 0.0, 0.0),
                 PredictedKernel(0, "layer0", "BP", "gemm", 0, 5e-3, 0.0, 0.0)]
    on_network = [PredictedKernel(-1, "", "COMM", "allreduce_start", i, 1.5e-3, 0.0, 4.0) for i in range(2)] + [
        PredictedKernel(0, "layer0", "COMM", "transfer_cpu", 0, 1e-3, 0.0, 0.0)]
    # The step with overlap: 10 ms of kernels and 5 of COMM, of which 3 posts and 1 of tests.
    prediction = StepPrediction(computing + on_network, [4.0, 4.0], [6e-3, 6e-3], 2, 16,
                                {"FP": 5e-3, "BP": 5e-3, "WU": 0.0, "COMM": 4e-3}, 19e-3, 15e-3)
    result = validate(records, steps, overlap=True, predict=lambda batch: prediction)

    parts = {part.name: part for part in result.comm_parts}
    assert list(parts) == ["posts", "tests", "wait"]
    assert parts["posts"].measured == pytest.approx(2e-3) and parts["posts"].predicted == pytest.approx(3e-3)
    assert parts["tests"].measured == pytest.approx(2e-3) and parts["tests"].predicted == pytest.approx(1e-3)
    # The rest of COMM: the final wait, 2 and 4 ms in alternate steps, and the loss's reduction.
    assert parts["wait"].measured == pytest.approx(3.2e-3) and parts["wait"].predicted == pytest.approx(1e-3)
    assert parts["wait"].half_difference == pytest.approx(2 / 3.2)
    total = next(stage for stage in result.stages if stage.name == "COMM")
    assert sum(p.measured for p in parts.values()) == pytest.approx(total.measured)
    assert sum(p.predicted for p in parts.values()) == pytest.approx(total.predicted)
    figures = validation_figures(result)["comm_parts"]
    assert figures["tests"] == {"measured_seconds": pytest.approx(2e-3), "predicted_seconds": pytest.approx(1e-3),
                                "error": pytest.approx(-0.5)}
    assert "  posts" in summary_text(result) and "  wait" in summary_text(result)

    # Where the model does not time the posts (one node, whose buckets move only in their own
    # calls and in blocking ones), COMM stays one figure.
    one_node = replace(prediction, kernels=computing + [replace(on_network[0], kernel="allreduce")])
    alone = validate(records, steps, overlap=True, predict=lambda batch: one_node)
    assert alone.comm_parts == [] and validation_figures(alone)["comm_parts"] == {}
    assert "  posts" not in summary_text(alone)


def calibration_folder(folder) -> str:
    """A folder of two copies of the reference calibration: ``here.json`` measured on this
    machine's processor, and ``elsewhere.json`` on another one, measured later."""
    with open(REFERENCE_CALIBRATION, encoding="utf-8") as handle:
        document = json.load(handle)
    folder.mkdir()
    for name, processor, date in (("here", this_processor(), "2026-01-01T00:00:00+00:00"),
                                  ("elsewhere", Processor("Another CPU"), "2026-12-31T00:00:00+00:00")):
        document["machine"].update(**processor.record(), date=date)
        (folder / f"{name}.json").write_text(json.dumps(document), encoding="utf-8")
    return str(folder)


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """A short 2-rank run traced and validated against the reference calibration, named by
    a folder of calibrations (:func:`calibration_folder`): (trace directory, stdout). Tests
    that change the trace work on a copy."""
    directory = tmp_path_factory.mktemp("traced")
    trace = directory / "trace"
    trained = train_cli(2, "--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--steps-per-epoch", "4",
                        "--eval-steps", "0", "--run-dir", str(directory), "--trace", str(trace),
                        "--validate", calibration_folder(directory / "calibrations"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    return trace, trained.stdout


def test_a_calibration_folder_gives_each_run_the_file_of_its_processor(traced_run, tmp_path):
    trace, trained = traced_run
    folder = trace.parent / "calibrations"
    here, elsewhere = str(folder / "here.json"), str(folder / "elsewhere.json")
    meta = json.loads((trace / "meta.json").read_text())
    assert meta["calibration"] == os.path.abspath(here)
    # The trace names the BLAS kernels that ran, as a calibration on this machine does.
    assert blas_kernels(meta) == blas_kernels({"blas": blas_info()}) != set()
    assert f"measured against predicted (calibration {here})" in trained
    validated = run("pydtnn_lite.validate", str(trace), "--calibration", str(folder), "--out", str(tmp_path / "v"))
    assert validated.returncode == 0, validated.stderr
    assert f"(calibration {here})" in validated.stdout
    # A run on another processor takes that one's file, however old the other is.
    moved = tmp_path / "trace"
    shutil.copytree(trace, moved)
    (moved / "meta.json").write_text(json.dumps({**meta, "cpu_model": "Another CPU"}))
    validated = run("pydtnn_lite.validate", str(moved), "--calibration", str(folder))
    assert validated.returncode == 0, validated.stderr
    assert f"(calibration {elsewhere})" in validated.stdout
    predicted = run("pydtnn_lite.predict", "--model", "lenet", "--procs", "2", "--calibration", str(folder))
    assert predicted.returncode == 0, predicted.stderr
    assert f"calibration {here};" in predicted.stdout.splitlines()[0]


def test_validate_a_short_traced_run_end_to_end(traced_run, tmp_path):
    trace, trained = traced_run
    assert "measured against predicted (calibration" in trained and "WRE" in trained
    result = run("pydtnn_lite.validate", str(trace), "--peak-flops", "50e9", "--mem-bw", "10e9",
                 "--link-bw", "5e9", "--latency", "5e-6")
    assert result.returncode == 0, result.stderr
    for name in ("validation.csv", "stage-FP.png", "stage-BP.png", "stage-WU.png", "report.html"):
        assert (trace / "validation" / name).stat().st_size > 0
    rows = (trace / "validation" / "validation.csv").read_text().splitlines()
    assert len(rows) > 20 and rows[0].startswith("layer,layer_name,stage,kernel")
    assert "gemm" in (trace / "validation" / "report.html").read_text()
    assert "step" in result.stdout and "WRE" in result.stdout
    # A few LeNet steps on 8x8 digits span milliseconds: too short to stand for the model.
    assert "warning: the traced steps span" in result.stdout and "raise --steps-per-epoch" in result.stdout
    missing = run("pydtnn_lite.validate", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "is not a trace directory" in missing.stderr


def test_a_stage_of_many_calls_is_plotted_by_layer_or_by_kernel_with_their_totals():
    def calls(layers: int, products: int = 1) -> list[KernelComparison]:
        return [KernelComparison(i, f"conv{i}", "BP", kernel, occurrence, measured, predicted, 0.0)
                for i in range(layers) for kernel, count, measured, predicted in
                (("gemm", products, 2e-3, 3e-3), ("col2im", 1, 1e-3, 1e-3)) for occurrence in range(count)]

    def bars(kernels: list[KernelComparison], stage: str = "BP") -> StageBars:
        return stage_bars(Validation(kernels, [], Comparison("step", 1.0, 1.0), 0), stage)
    few = bars(calls(3, products=2))  # a bar pair a call, in execution order
    assert few.grouping == "call" and [b.name for b in few.bars[:3]] == ["conv0 gemm", "conv0 gemm#1", "conv0 col2im"]
    assert few.bars[0].measured == 2e-3 and few.bars[0].relative_error == pytest.approx(0.5) and len(few.bars) == 9
    products = MAX_BARS  # each layer's products summed: Winograd's 36 a layer
    by_layer = bars(calls(2, products))
    assert by_layer.grouping == "layer"
    assert [b.name for b in by_layer.bars] == [f"conv0 gemm ({products} calls)", "conv0 col2im",
                                               f"conv1 gemm ({products} calls)", "conv1 col2im"]
    assert [b.measured for b in by_layer.bars] == pytest.approx([2e-3 * products, 1e-3] * 2)
    assert [b.relative_error for b in by_layer.bars] == pytest.approx([0.5, 0.0] * 2)
    layers = MAX_BARS // 2 + 1  # one pair a layer and kernel too many: each kernel's calls, the longest first
    by_kernel = bars(calls(layers)[::-1])
    assert by_kernel.grouping == "kernel"
    assert [b.name for b in by_kernel.bars] == [f"gemm ({layers} calls)", f"col2im ({layers} calls)"]
    assert [b.measured for b in by_kernel.bars] == pytest.approx([2e-3 * layers, 1e-3 * layers])
    assert [b.predicted for b in by_kernel.bars] == pytest.approx([3e-3 * layers, 1e-3 * layers])
    assert bars(calls(layers), "FP").bars == []


def test_validate_prints_its_figures_as_one_json_object(traced_run, tmp_path):
    trace = traced_run[0]
    result = run("pydtnn_lite.validate", str(trace), "--calibration", REFERENCE_CALIBRATION, "--json",
                 "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["model"], document["dataset"], document["procs"], document["global_batch"]) == (
        "lenet", "digits", 2, 16)
    assert document["machine"] == f"calibration {REFERENCE_CALIBRATION}"
    assert all(isinstance(document[key], float) and document[key] > 0
               for key in ("measured_step_seconds", "predicted_step_seconds"))
    measured, predicted = document["measured_step_seconds"], document["predicted_step_seconds"]
    assert document["step_error"] == pytest.approx((predicted - measured) / measured)
    spans: dict[int, float] = {}
    for step in load_trace(str(trace))[1]:
        spans[step.rank] = spans.get(step.rank, 0.0) + step.duration
    assert document["traced_seconds"] == pytest.approx(max(spans.values()))
    # The run probed the machine's state, and so did the calibration: the error before the
    # correction is the one of the prediction divided by the drift factor.
    drift = document["drift_factor"]
    assert isinstance(drift, float) and drift > 0
    assert document["raw_step_error"] == pytest.approx((predicted / drift - measured) / measured)
    assert set(document["drift"]) == {"compute", "memory", "communication", "noise", "measured", "peak_flops",
                                      "kernels", "imbalance", "probed_gemm", "other_processor", "probes_apart"}
    assert document["drift"]["kernels"]["batchnorm_sums"] > 0  # the kernel probe's own ratios
    assert set(document["wre"]) == {"FP", "BP", "WU"} and all(isinstance(v, float) for v in document["wre"].values())
    for key in ("measured_stage_seconds", "predicted_stage_seconds", "stage_errors"):
        assert set(document[key]) == {"DATA", "FP", "BP", "WU", "COMM"}
    assert set(document["split_half"]) == {"step_difference", "stage_differences", "wre"}
    assert document["comm_parts"] == {}  # on one node the model has no posts and tests apart from the wait
    assert isinstance(document["unmatched_calls"], int)
    # One-thread ranks, as calibrated; a line only where this machine's processor is not the
    # file's, and one where its BLAS runs other kernels (OPENBLAS_CORETYPE unset or set otherwise).
    calibrated = calibrated_machine(REFERENCE_CALIBRATION).calibration.machine
    other_processor = not this_processor().same_as(Processor.of(calibrated))
    other_kernels = blas_kernels({"blas": blas_info()}) != blas_kernels(calibrated)
    # And one because the file's cache residency timed its evicted updates the old way, one
    # because it timed the max pool's gradient before its gather, one because its kernel
    # probes ran their ranks apart where the run's met.
    older = [line for line in document["warnings"]
             if "first call after an eviction" in line or "timed older code of maxpool_grad" in line
             or "ran their ranks apart" in line]
    others = [line for line in document["warnings"] if line not in older]
    assert len(older) == 3
    assert [line.startswith("the run's processor") for line in others] == (
        [True] * other_processor + [False] * other_kernels)
    assert all(f"the run's processor ({this_processor()})" in line or "calibrate with the run's OPENBLAS_CORETYPE"
               in line for line in others)
    assert document["report"] and all(os.path.isfile(path) for path in document["report"])


def test_validate_without_a_machine_takes_the_calibration_the_trace_names(traced_run, tmp_path):
    trace = tmp_path / "trace"
    shutil.copytree(traced_run[0], trace)
    meta = json.loads((trace / "meta.json").read_text())
    (trace / "meta.json").write_text(json.dumps({**meta, "calibration": REFERENCE_CALIBRATION}))
    named = run("pydtnn_lite.validate", str(trace))
    assert named.returncode == 0, named.stderr
    assert f"measured against predicted (calibration {REFERENCE_CALIBRATION})" in named.stdout

    meta.pop("calibration", None)
    (trace / "meta.json").write_text(json.dumps(meta))
    unnamed = run("pydtnn_lite.validate", str(trace))
    assert unnamed.returncode == 2 and unnamed.stdout == ""
    assert len(unnamed.stderr.strip().splitlines()) == 1
    assert "--calibration" in unnamed.stderr and "--preset" in unnamed.stderr


def slower_copy(trace, to, factor: float):
    """A copy of the trace directory ``trace`` whose every step and kernel call took ``factor`` times as long."""
    shutil.copytree(trace, to)
    for name in ("events.csv", "steps.csv"):
        with open(to / name, newline="") as handle:
            rows = list(csv.DictReader(handle))
        for row in rows:
            row["duration"] = repr(float(row["duration"]) * factor)
        with open(to / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return to


def test_validate_sets_several_runs_beside_how_far_they_differ(traced_run, tmp_path):
    trace = traced_run[0]
    slower = slower_copy(trace, tmp_path / "slower", 1.1)
    result = run("pydtnn_lite.validate", str(trace), str(slower), "--calibration", REFERENCE_CALIBRATION, "--json",
                 "--out", str(tmp_path / "reports"))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [run_["trace"] for run_ in document["traces"]] == [str(trace), str(slower)]
    assert all(os.path.isfile(path) for run_ in document["traces"] for path in run_["report"])
    assert [os.path.dirname(run_["report"][0]) for run_ in document["traces"]] == [
        str(tmp_path / "reports" / "run-1"), str(tmp_path / "reports" / "run-2")]
    # Each run against the other: 10 % longer one way, 1/11 shorter the other; the median of the two.
    floor = document["between_runs_median"]
    for key in ("step_error", "wre_fp", "wre_bp", "wre_wu"):
        assert floor[key] == pytest.approx((0.1 + 1 / 11) / 2, rel=1e-6), key
    errors = [run_["step_error"] for run_ in document["traces"]]
    assert document["runs"] == 2 and document["model_median"]["step_error"] == pytest.approx(
        (abs(errors[0]) + abs(errors[1])) / 2)
    table = run("pydtnn_lite.validate", str(trace), str(slower), "--calibration", REFERENCE_CALIBRATION,
                "--out", str(tmp_path / "reports"))
    assert table.returncode == 0 and "between runs, median" in table.stdout and table.stdout.startswith("run 1: ")
    other = tmp_path / "other"
    shutil.copytree(trace, other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "global_batch": 32}))
    refused = run("pydtnn_lite.validate", str(trace), str(other), "--calibration", REFERENCE_CALIBRATION)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "trained global_batch 32 where" in refused.stderr


def test_scalability_study_writes_csv_and_plots_with_the_expected_trends(tmp_path):
    result = run("pydtnn_lite.scalability", "--models", "resnet18", "--datasets", "cifar10", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "scalability-cifar10.png").stat().st_size > 0
    with open(tmp_path / "scalability.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    series = {name: [row for row in rows if row["parameter"] == name] for name in {row["parameter"] for row in rows}}
    link = [float(r["communication"]) for r in series["link_bandwidth_gbps"]]
    assert link == sorted(link, reverse=True) and link[0] > 10 * link[-1]
    nodes = series["nodes"]
    assert float(nodes[0]["communication"]) == 0.0  # one node reduces nothing
    computation = [float(r["computation"]) for r in nodes]
    assert max(computation) == pytest.approx(min(computation), rel=1e-9)  # the per-node batch is fixed
    memory = [float(r["computation"]) for r in series["memory_bandwidth"]]
    assert memory == sorted(memory, reverse=True)
    batch = [float(r["computation"]) for r in series["batch"]]
    assert batch == sorted(batch)


def test_scalability_splits_each_point_as_a_step_without_overlap_takes_it():
    # ResNet-50 on ALTEC: its batch norms' reductions advance the buckets, so an overlapped
    # prediction's kernels hold part of the reduction; the split must come from a step without overlap.
    cluster = PRESETS["altec"]
    points = [p for p in study(["resnet50"], ["imagenet"], cluster) if p.parameter == "nodes" and p.value == 2]
    network, optimizer = build_workload("resnet50", "imagenet")
    machine = cluster_machine(replace(cluster, nodes=2))
    blocking = predict_step(network, optimizer, BASELINE_BATCH, 2, machine, overlap=False)
    overlapped = predict_step(network, optimizer, BASELINE_BATCH, 2, machine)
    assert overlapped.step_without_overlap > 1.1 * blocking.step_without_overlap  # the case this test is about
    assert points[0].step_without_overlap == pytest.approx(blocking.step_without_overlap, rel=1e-12)
    assert points[0].step_with_overlap == pytest.approx(overlapped.step_with_overlap, rel=1e-12)


def test_balanced_shares_follow_the_predicted_speed_of_each_rank():
    network, optimizer = build_workload("lenet", "digits")
    shares, steps = balanced_shares(network, optimizer, 64, [ConstantMachine(1e-3, 0.0), ConstantMachine(3e-3, 0.0)])
    assert shares == [48, 16] and [s.batch for s in steps] == [48, 16] and all(s.procs == 2 for s in steps)
    calibration = os.path.join(REPO, "calibration", "dev-2core.json")
    same = run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--rank-calibrations", calibration,
               calibration)
    assert same.returncode == 0, same.stderr
    assert "balanced shares [32, 32]" in same.stdout and "equal shares [32, 32]" in same.stdout
    document = json.loads(run("pydtnn_lite.predict", "--model", "vgg11", "--batch-size", "64", "--rank-calibrations",
                              calibration, calibration, "--json").stdout)
    assert document["balanced_shares"]["shares"] == [32, 32] and document["procs"] == 2
    assert document["balanced_shares"]["step_seconds"] == max(document["balanced_shares"]["rank_step_seconds"])
