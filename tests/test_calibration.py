"""Calibration: the kernel regressions, the probe grid, the calibration file and its command line."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from pydtnn_lite.backend import CACHE_VARIABLE, cache_size_bytes, host_last_level_cache_bytes, make_backend
from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.costs import ALLREDUCE, H2D_COPY, KERNEL_REVISIONS, KernelCost, Stage
from pydtnn_lite.errors import UserError
from pydtnn_lite.models import create_model
from pydtnn_lite.optim import SGD, Adam
from pydtnn_lite.perfmodel.measuring import kernel_probe, sampling
from pydtnn_lite.perfmodel.measuring.allreduce_timing import QUICK_SIZES
from pydtnn_lite.perfmodel.measuring.cache_residency import IDLE_WAITS
from pydtnn_lite.perfmodel.measuring.cache_residency import QUICK_SIZES as QUICK_RESIDENCY_SIZES
from pydtnn_lite.perfmodel.measuring.calibrate import CalibrationSettings, _mean_waits, calibrate, in_rounds
from pydtnn_lite.perfmodel.measuring.gradient_passes import QUICK_LENGTHS, gradient_pass_samples
from pydtnn_lite.perfmodel.measuring.host import CacheEvictor
from pydtnn_lite.perfmodel.measuring.kernel_probe import PROBE_STEPS, SAMPLE_EVERY, probe_kernels
from pydtnn_lite.perfmodel.measuring.machine_state import ALLREDUCE_BYTES
from pydtnn_lite.perfmodel.measuring.probes import FULL, QUICK, Probe, calibration_grid
from pydtnn_lite.perfmodel.measuring.sampling import MAX_PERIOD, measure_probe
from pydtnn_lite.perfmodel.modelling.calibration import MIN_UPDATE_SAMPLES, Calibration
from pydtnn_lite.perfmodel.modelling.machines import adjusted_machine, allreduce_models, calibrated_machine
from pydtnn_lite.perfmodel.modelling.merging import merge_calibrations
from pydtnn_lite.perfmodel.modelling.placement import Placement, ThreadScaling
from pydtnn_lite.perfmodel.modelling.regression import (
    MIN_SECONDS,
    KernelSample,
    LogLinearModel,
    MLPEnsemble,
    MLPRegressor,
    fit_kernel_model,
    fit_kernel_models,
    model_from_dict,
)
from pydtnn_lite.runtime import usable_cores
from pydtnn_lite.step_costs import step_costs

from mpi import run

TINY = CalibrationSettings(batch_sizes=(4, 8), repeats=1, min_seconds=0.0, grid=QUICK, roof_repeats=1,
                           read_ahead_rounds=2, read_ahead_steps=10, kernel_probes=2, gradient_lengths=QUICK_LENGTHS)
GRADIENT_PASSES = ("start_gradient_sum", "accumulate_gradients", "gradient_norm", "scale_gradient")


def gemm_like(count: int, seed: int) -> list[KernelSample]:
    """Calls whose seconds are 1e-9 * m * n * k, sizes log-uniform in 16..4096; no FLOPs or
    bytes given, so a model must learn the function from the dims alone."""
    dims = np.exp(np.random.default_rng(seed).uniform(np.log(16), np.log(4096), size=(count, 3))).astype(int)
    return [KernelSample(tuple(int(d) for d in row), 0.0, 0.0, 1e-9 * float(np.prod(row))) for row in dims]


def bumpy(count: int, seed: int) -> list[KernelSample]:
    """Calls of one size whose seconds follow two bumps of its logarithm: no power law and no sum
    of rates fits them, so an MLP ensemble holds out best."""
    sizes = np.exp(np.random.default_rng(seed).uniform(0, np.log(1e5), size=count))
    return [KernelSample((int(n),), n, 4 * n, 1e-6 * np.exp(np.sin(np.log(n)))) for n in sizes]


def median_error(model, samples) -> float:
    predicted = np.array([model.predict(s.dims, s.flops, s.bytes) for s in samples])
    measured = np.array([s.seconds for s in samples])
    return float(np.median(np.abs(predicted - measured) / measured))


def test_mlp_learns_a_product_of_sizes_deterministically():
    train, test = gemm_like(400, seed=1), gemm_like(100, seed=2)
    model = MLPRegressor.fit(train, seed=3)
    assert median_error(model, test) < 0.10
    again = MLPRegressor.fit(train, seed=3)
    restored = model_from_dict(json.loads(json.dumps(model.to_dict())))
    for sample in test[:20]:
        expected = model.predict(sample.dims, 0.0, 0.0)
        assert again.predict(sample.dims, 0.0, 0.0) == expected
        assert restored.predict(sample.dims, 0.0, 0.0) == expected


def test_an_ensemble_averages_its_members_in_log_time_and_reads_back_identically():
    # What is checked is how members combine, not how well they fit: few samples train them quickly.
    train, test = gemm_like(60, seed=1), gemm_like(20, seed=2)
    ensemble = MLPEnsemble.fit(train, seed=3, members=3)
    members = [MLPRegressor.fit(train, seed=seed) for seed in (3, 4, 5)]
    restored = model_from_dict(json.loads(json.dumps(ensemble.to_dict())))
    for sample in test:
        expected = math.exp(np.mean([math.log(m.predict(sample.dims, 0.0, 0.0)) for m in members]))
        assert ensemble.predict(sample.dims, 0.0, 0.0) == pytest.approx(expected, rel=1e-12)
        assert restored.predict(sample.dims, 0.0, 0.0) == ensemble.predict(sample.dims, 0.0, 0.0)


def test_the_mlp_is_kept_only_where_it_predicts_held_out_calls_better():
    # 100 samples (80 to fit, above MLP_MIN_SAMPLES) train the ensemble in seconds.
    assert fit_kernel_model(bumpy(100, seed=0)).kind == "mlp_ensemble"
    sizes = np.exp(np.random.default_rng(0).uniform(0, np.log(1e5), size=100))
    linear = [KernelSample((int(n),), n, 4 * n, 2e-6 + 4 * n / 1e10) for n in sizes]
    model = fit_kernel_model(linear)
    assert model.kind == "rate" and model.held_out_error < 1e-6


def test_worker_processes_fit_the_models_a_serial_fit_does():
    # A kernel with an ensemble and one with too few samples for an MLP.
    samples = {"gemm": bumpy(60, seed=1), "bias_grad": gemm_like(8, seed=3)}
    serial = fit_kernel_models(samples, seed=4)
    parallel = fit_kernel_models(samples, seed=4, workers=2)
    assert serial["gemm"].kind == "mlp_ensemble" and serial["bias_grad"].kind in ("rate", "loglinear")
    assert {name: model.to_dict() for name, model in parallel.items()} == \
        {name: model.to_dict() for name, model in serial.items()}


def test_fallback_fits_a_handful_of_samples():
    sizes = [2 ** i for i in range(6, 18)]  # 12 calls
    samples = [KernelSample((n,), n, 12.0 * n, 3e-6 + 12.0 * n / 2e10) for n in sizes]
    model = fit_kernel_model(samples)
    assert model.kind in ("rate", "loglinear") and model.samples == 12
    assert model.predict((3000,), 3000, 36000) == pytest.approx(3e-6 + 36000 / 2e10, rel=0.02)
    assert model_from_dict(model.to_dict()).predict((3000,), 3000, 36000) == model.predict((3000,), 3000, 36000)
    single = fit_kernel_model(samples[:1])  # nothing to hold out
    assert math.isnan(single.held_out_error) and single.predict((64,), 64, 768) > 0


def test_a_power_law_far_beyond_its_samples_predicts_a_positive_time():
    """Fitted on a tiny grid, col2im's law once gave 0.0 s for a call far larger than its samples."""
    law = LogLinearModel([-50.0, -100.0, 0.0, 0.0])  # exp(-50 - 100 log(1 + n)): underflows to 0
    assert law.predict((16384,), 0, 8 << 20) == MIN_SECONDS


def test_a_power_law_that_overflows_far_beyond_its_samples_gives_way_to_the_roofline():
    """A quick calibration's law for the fused batch-norm gradient once gave inf seconds on DenseNet's maps."""
    law = LogLinearModel([0.0, 200.0, 0.0, 0.0])  # exp(200 log(1 + n)): overflows at n = 65536
    calibration = Calibration(machine={}, peak_flops=1e11, memory_bandwidth=1e10, kernel_models={"relu": law},
                              kernel_samples={}, allreduce_samples=[])
    cost = KernelCost(Stage.FP, "relu", 65536, 1 << 20, (65536,))
    assert calibration.kernel_seconds("relu", cost) == pytest.approx((1 << 20) / 1e10)  # the bytes' roofline
    small = KernelCost(Stage.FP, "relu", 1, 8, (1,))
    assert calibration.kernel_seconds("relu", small) == pytest.approx(2.0 ** 200)  # within range: the law


def test_grid_respects_its_limits_and_samples_both_optimizers_and_every_convolution_form():
    grid = calibration_grid((8, 16), QUICK, seed=0)
    drawn = Counter(p.family for p in grid)
    # The draw, and for conv the cheapest probe of each form the draw missed.
    assert {family: drawn[family] for family in ("dense", "pool", "merge", "residual")} == {
        family: QUICK.points[family] for family in ("dense", "pool", "merge", "residual")}
    assert QUICK.points["conv"] <= drawn["conv"] <= QUICK.points["conv"] + 2

    def form(probe):
        return probe.network().build(make_backend(), seed=0).layers[1].form(probe.batch)
    convs = [p for p in grid if p.family == "conv"]
    added = convs[QUICK.points["conv"]:]
    assert {form(p) for p in convs} == {"direct", "transposed", "winograd"}
    assert {form(p) for p in added}.isdisjoint(form(p) for p in convs[:QUICK.points["conv"]])
    assert all(p.step_flops() <= QUICK.max_step_flops and p.activations() <= QUICK.max_activations
               for p in grid if p not in added)
    assert {p.optimizer for p in grid if p.family == "dense"} == {"sgd", "adam"}
    assert calibration_grid((8, 16), QUICK, seed=0) == grid


def weight_gradient_products(network, batch):
    """The (rows, columns, inner size) of the weight-gradient GEMMs of ``network``'s first convolution."""
    built = network.build(make_backend(), seed=0)
    first = next(index for index, layer in enumerate(built.layers) if layer.kind == "conv")
    return {cost.dims[:3] for layer, cost in step_costs(built, SGD(built), batch)
            if layer == first and cost.kernel == "gemm" and cost.stage == Stage.BP}


def test_the_full_grid_samples_a_first_layers_weight_gradient_at_a_large_batch_and_the_quick_one_does_not():
    # LeNet at 128 images a rank: its first layer's weight gradient, a product of 6 columns,
    # sums over 131072 terms, twice what the grid's maps give at its largest batch.
    ((rows, columns, inner),) = weight_gradient_products(create_model("lenet", (32, 32, 3), 10), 128)
    assert (rows, columns) == (75, 6) and inner == 131072
    first_layers = [p for p in calibration_grid((8, 16, 32, 64), FULL, seed=0)
                    if p.family == "conv" and p.shape[1] == 3 and p.shape[2] == columns]
    sampled = set().union(*(weight_gradient_products(p.network(), p.batch) for p in first_layers))
    assert max(k for m, n, k in sampled if (m, n) == (rows, columns)) >= inner
    assert max(p.shape[0] for p in calibration_grid((8, 16), QUICK, seed=0) if p.family == "conv") <= 32


@pytest.mark.parametrize("probe", [Probe("conv", 4, (8, 3, 4, 3, 2, 1)), Probe("dense", 4, (16, 8, 10), "adam"),
                                   Probe("pool", 4, (8, 4, 3, 2, 1)), Probe("merge", 4, (4, 4)),
                                   Probe("residual", 4, (4, 4)), Probe("model", 4, ("lenet", "digits"))],
                         ids=["conv", "dense", "pool", "merge", "residual", "a job's network"])
def test_every_kernel_call_of_a_probe_step_becomes_one_sample(probe):
    backend = make_backend()
    evictions = []
    measured = measure_probe(probe, backend, SerialCommunicator(), repeats=2, evict=lambda: evictions.append(1))
    assert len(evictions) == 2  # before the update of each sampled step, none in the warm-up
    samples = measured.samples
    network, optimizer = probe.trainable(backend)
    # Reductions are communication, which the calibration times apart (allreduce_timing.py).
    costs = step_costs(network, optimizer, probe.batch)
    meetings = 1 + batch_norm_reductions(probe)  # a wait a step at each batch-norm reduction, and after backward
    assert len(measured.waits) == 2 and all(len(step) == meetings for step in measured.waits)
    assert all(work > 0 and wait >= 0 for step in measured.waits for work, wait in step)
    expected = Counter(cost.kernel for _, cost in costs if cost.kernel != ALLREDUCE)
    expected[H2D_COPY] += 1
    # The step's first update follows the step's other work: it is kept apart, for its cold start.
    assert {name: len(calls) for name, calls in measured.cold_starts.items()} == {optimizer.kernel: 1}
    first_segment = network.segments[0]
    assert measured.cold_starts[optimizer.kernel][0].dims == (first_segment.stop - first_segment.start,)
    expected[optimizer.kernel] -= 1
    assert Counter({name: len(calls) for name, calls in samples.items()}) == expected
    assert all(s.seconds > 0 for calls in [*samples.values(), *measured.cold_starts.values()] for s in calls)
    im2col = samples.get("im2col", [KernelSample((0,) * 6, 0, 0, 1)])[0]
    assert len(im2col.dims) == 6
    # A step's seconds by kernel count every call, the first update among them.
    totals = measured.kernel_seconds()
    assert set(totals) == set(expected) and totals[optimizer.kernel] == pytest.approx(
        sum(s.seconds for s in [*samples.get(optimizer.kernel, []), *measured.cold_starts[optimizer.kernel]]))


def batch_norm_reductions(probe: Probe) -> int:
    """The blocking reductions of ``probe``'s training step: its batch norms' statistics."""
    network, optimizer = probe.trainable(make_backend())
    return sum(cost.kernel == ALLREDUCE for _, cost in step_costs(network, optimizer, probe.batch))


class CountedBarriers(SerialCommunicator):
    """One process that counts the barriers it is asked to wait at."""

    def __init__(self) -> None:
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1


@pytest.mark.parametrize("settle, period", [(0.0, 2), (60.0, MAX_PERIOD)], ids=["a step", "the longest period"])
def test_the_ranks_of_a_probe_meet_at_each_batch_norm_reduction_as_a_jobs_ranks_do(monkeypatch, settle, period):
    """After a job's batch-norm reduction its ranks run the next memory-bound pass at the
    same moment: the sampling's ranks meet there too, so they time it side by side. A
    sampled step follows steps without an eviction for ``SETTLE_SECONDS`` (at least one),
    and no rank computes while another evicts."""
    monkeypatch.setattr(sampling, "SETTLE_SECONDS", settle)
    probe = Probe("conv", 4, (8, 3, 4, 3, 2, 1))  # batch norms in FP and BP
    reductions = batch_norm_reductions(probe)
    assert reductions >= 2
    ranks, evictions = CountedBarriers(), []
    measured = measure_probe(probe, make_backend(), ranks, repeats=2, evict=lambda: evictions.append(ranks.barriers))
    steps = 2 + period * 2  # two warm-up steps, then each of the two samples after period - 1 steps
    meetings_a_step = reductions + 1
    assert ranks.barriers == steps * meetings_a_step + 2  # and a meeting after each eviction
    assert evictions == [(2 + period) * meetings_a_step, (2 + 2 * period) * meetings_a_step + 1]
    # The statistics stay the probe's own: the reductions sum nothing into them.
    assert len(measured.waits) == 2 and all(len(step) == reductions + 1 for step in measured.waits)


def test_a_samples_span_counts_its_eviction():
    """A small probe's sample is mostly its eviction: counted in the span, the probe stops
    at its repeats where, counting its steps alone, it would evict many more times."""
    probe = Probe("dense", 4, (16, 8, 10))
    evictions: dict[float, list[int]] = {0.0: [], 60.0: []}
    for seconds, calls in evictions.items():
        measure_probe(probe, make_backend(), SerialCommunicator(), repeats=2, evict=lambda calls=calls: calls.append(1),
                      min_seconds=0.5, eviction_seconds=seconds)
    assert len(evictions[60.0]) == 2 < len(evictions[0.0])


def test_an_evictor_keeps_what_its_last_eviction_took():
    evict = CacheEvictor(make_backend())
    assert evict.seconds == 0.0
    evict()
    assert evict.seconds > 0.0


def test_the_kernel_probe_samples_every_step_right_after_an_eviction_as_every_calibration_ran_it():
    """A drift is the kernel probe's time now over the calibration's runs of it: files of
    either sampling rule hold runs of the probe sampled each step after an eviction."""
    probe, evictions = Probe("dense", 4, (16, 8, 10)), []
    measured = measure_probe(probe, make_backend(), SerialCommunicator(), repeats=3,
                             evict=lambda: evictions.append(1), period=SAMPLE_EVERY)
    assert SAMPLE_EVERY == 1 and len(evictions) == 1 + 3  # the warm-up step and each sampled step
    assert len(measured.waits) == 3


def test_the_kernel_probe_s_ranks_meet_where_a_job_s_ranks_meet(monkeypatch):
    """A job's ranks run each memory-bound pass together and share the memory system: the
    kernel probe's ranks meet as the calibration's samples do, at each batch-norm
    reduction, after backward and after each eviction, on every sampled step and the
    warm-up's, and the probe records how many met."""
    probe = Probe("conv", 4, (8, 3, 4, 3, 2, 1))  # batch norms in FP and BP
    monkeypatch.setattr(kernel_probe, "KERNEL_PROBES", (probe,))
    ranks = CountedBarriers()
    probed = probe_kernels(ranks)
    steps = 1 + PROBE_STEPS  # the warm-up step, then each sampled step, each evicted
    assert ranks.barriers == steps * (batch_norm_reductions(probe) + 2)
    assert probed.meeting_ranks == 1 and probed.calls["batchnorm_sums"]
    # A rank that does not probe (a GPU's) joins no meeting and measures nothing.
    idle = CountedBarriers()
    assert probe_kernels(idle, on_host=False).calls == {} and idle.barriers == 0


def test_a_meetings_wait_is_the_mean_over_steps_and_ranks_beyond_the_last_ranks_own():
    # Two ranks, two steps, two meetings a step: (work, seconds at the barrier).
    rank0 = [[[(0.010, 0.003), (0.100, 0.001)], [(0.012, 0.001), (0.090, 0.010)]]]
    rank1 = [[[(0.012, 0.001), (0.100, 0.005)], [(0.010, 0.004), (0.080, 0.002)]]]
    first, end = _mean_waits([rank0, rank1])
    assert first == pytest.approx((0.011, (0.002 + 0.0 + 0.0 + 0.003) / 4))
    assert end == pytest.approx((0.0925, (0.0 + 0.004 + 0.008 + 0.0) / 4))


def test_a_probe_trained_as_a_job_samples_the_same_calls_without_waits_or_evictions():
    """``reduced``: the trainer's own gradient reduction in place of the probes' barrier, the
    sampling that ``benchmarks/probe_tracking.py`` sets the calibration's against."""
    probe, backend, evictions = Probe("conv", 4, (8, 3, 4, 3, 2, 1)), make_backend(), []
    sampled = measure_probe(probe, backend, SerialCommunicator(), repeats=2, evict=lambda: evictions.append(1))
    trained = measure_probe(probe, backend, SerialCommunicator(), repeats=2, evict=lambda: evictions.append(1),
                            reduced=True)
    assert len(evictions) == 2 and trained.waits == []  # the evictions and waits are the sampling's alone
    assert {name: [s.dims for s in calls] for name, calls in trained.samples.items()} == \
        {name: [s.dims for s in calls] for name, calls in sampled.samples.items()}
    assert trained.overhead[0] == sampled.overhead[0]  # the same compute calls a step


def test_the_environment_states_the_last_level_cache_that_is_evicted(monkeypatch):
    assert cache_size_bytes("32768K\n") == 32 << 20 and cache_size_bytes("1048576") == 1 << 20
    assert cache_size_bytes("lots") is None
    monkeypatch.setenv(CACHE_VARIABLE, "6M")
    assert make_backend().last_level_cache_bytes() == 6 << 20
    assert CacheEvictor(make_backend()).buffer.nbytes == 12 << 20  # twice the cache
    monkeypatch.setenv(CACHE_VARIABLE, "0")
    with pytest.raises(UserError, match=f"{CACHE_VARIABLE}='0' is not a cache size"):
        host_last_level_cache_bytes()
    monkeypatch.delenv(CACHE_VARIABLE)
    assert host_last_level_cache_bytes() > 0  # the operating system's figure


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A calibration of the quick grid at batch sizes 4 and 8, one step per probe, saved and read back."""
    calibration = calibrate(make_backend(), SerialCommunicator(), TINY, blas_threads=1)
    # One MLP in the file, whatever the tiny grid's samples chose.
    calibration.kernel_models["gemm"] = MLPRegressor.fit(calibration.kernel_samples["gemm"], max_epochs=5)
    path = str(tmp_path_factory.mktemp("calibration") / "tiny.json")
    calibration.save(path)
    return calibration, path


def test_a_tiny_calibration_reads_back_with_identical_predictions(tiny):
    calibration, path = tiny
    loaded = Calibration.load(path)
    assert loaded.machine["cpu_model"] and loaded.machine["dtype"] == "float32" and loaded.machine["numpy"]
    assert loaded.peak_flops == calibration.peak_flops > 0 and loaded.memory_bandwidth > 0
    assert loaded.allreduce_samples == [] and loaded.allreduce_ranks == 1
    assert set(loaded.kernel_models) == set(calibration.kernel_models)
    assert loaded.kernel_samples == calibration.kernel_samples
    # The kernel probe as the calibration ran it, as it starts and as it ends, for runs to set theirs against.
    assert len(loaded.kernel_probes) == 2 and loaded.kernel_probes == calibration.kernel_probes
    assert all(probe.calls["relu"] and probe.outside for probe in loaded.kernel_probes)
    assert loaded.cold_start_samples == calibration.cold_start_samples
    assert set(loaded.cold_start_samples) == {"sgd_update", "adam_update"}  # one a probe, both optimizers
    assert loaded.thread_scaling is None  # one rank: no ranks to set one rank's threads against
    for name, samples in calibration.kernel_samples.items():
        for sample in samples:
            cost = KernelCost(Stage.FP, name, sample.flops, sample.bytes, sample.dims)
            assert loaded.kernel_seconds(name, cost) == calibration.kernel_seconds(name, cost)


@pytest.mark.parametrize("name", ["vgg11", "resnet18", "densenet121"])
def test_every_kernel_of_a_zoo_model_step_has_a_model_and_a_positive_time(tiny, name):
    calibration = Calibration.load(tiny[1])
    network = create_model(name, (32, 32, 3), 10).build(make_backend())
    for optimizer in (SGD(network), Adam(network)):
        # Accumulating and clipping: the passes over the whole gradient, longer than any timed.
        for _, cost in step_costs(network, optimizer, 16, accumulate=2, clip=True):
            if cost.kernel == ALLREDUCE:
                continue  # predicted from the Allreduce samples
            assert cost.kernel in calibration.kernel_models, cost.kernel
            seconds = calibration.kernel_seconds(cost.kernel, cost)
            assert math.isfinite(seconds) and seconds > 0, (cost, seconds)


def test_the_passes_over_the_whole_gradient_are_sampled_as_a_step_runs_them(tiny):
    calibration = Calibration.load(tiny[1])
    assert {len(calibration.kernel_samples[kernel]) for kernel in GRADIENT_PASSES} == {len(QUICK_LENGTHS)}
    assert all(calibration.kernel_models[kernel].samples == len(QUICK_LENGTHS) for kernel in GRADIENT_PASSES)
    network = create_model("lenet", (28, 28, 1), 10).build(make_backend())
    passes = gradient_pass_samples(SerialCommunicator(), make_backend(), lambda: None, (network.param_count,), 3)
    # Two micro-batches and clipping: the copy that starts the sum, one add, the norm and the scaling.
    step = [cost for _, cost in step_costs(network, SGD(network), 8, accumulate=2, clip=True)
            if cost.kernel in GRADIENT_PASSES]
    assert sorted((cost.kernel, cost.dims, cost.flops, cost.bytes) for cost in step) == sorted(
        (kernel, sample.dims, sample.flops, sample.bytes) for kernel in GRADIENT_PASSES for sample in passes[kernel])
    assert all(sample.seconds > 0 for kernel in GRADIENT_PASSES for sample in passes[kernel])


def test_a_call_sampled_at_its_exact_sizes_is_predicted_as_its_samples_median(tiny):
    calibration = Calibration.load(tiny[1])
    sample = calibration.kernel_samples["gemm"][0]
    calibration.kernel_samples["gemm"] += [dataclasses.replace(sample, seconds=sample.seconds * factor)
                                           for factor in (3.0, 5.0)]
    calibration._sampled.clear()
    cost = KernelCost(Stage.FP, "gemm", sample.flops, sample.bytes, sample.dims)
    assert calibration.kernel_seconds("gemm", cost) == pytest.approx(3.0 * sample.seconds)
    # Other sizes, or the same sizes in another dtype (other bytes), get the model's prediction.
    for other in (KernelCost(Stage.FP, "gemm", sample.flops, sample.bytes, (sample.dims[0] + 1, *sample.dims[1:])),
                  KernelCost(Stage.FP, "gemm", sample.flops, 2 * sample.bytes, sample.dims)):
        assert calibration.kernel_seconds("gemm", other) == calibration.kernel_models["gemm"].predict(
            other.dims, other.flops, other.bytes)


def test_calls_predicted_together_get_the_times_each_gets_alone(tiny):
    calibration = Calibration.load(tiny[1])
    sample = calibration.kernel_samples["gemm"][0]
    widest = max(s.dims[0] for s in calibration.kernel_samples["relu"])
    costs = {"gemm": [KernelCost(Stage.FP, "gemm", sample.flops, sample.bytes, sample.dims),  # its samples' median
                      KernelCost(Stage.FP, "gemm", 2 * sample.flops, 3 * sample.bytes, (64, 32, 16, 0, 0))],
             # Beyond the widest call sampled: as many calls at the widest.
             "relu": [KernelCost(Stage.FP, "relu", 0.0, 8.0 * n, (n,)) for n in (1000, 7 * widest, 1000, 3 * widest)],
             "batchnorm_inference": [KernelCost(Stage.FP, "batchnorm_inference", 4e9, 1e6, (8, 4, 4, 16))]}
    for kernel, calls in costs.items():
        together = calibration.warm_seconds_of(kernel, calls)
        alone = [calibration.warm_seconds(kernel, cost) for cost in calls]
        assert together == pytest.approx(alone, rel=1e-6) and all(seconds > 0 for seconds in together), kernel
    assert calibration.warm_seconds_of("relu", []) == []
    # A step's calls asked of a job's machine kernel by kernel, as a prediction asks them
    # (cold starts, placement on shared cores and thread hand-offs included), one by one; to
    # the precision of a float32 MLP, whose products round by the rows they are given.
    machine = adjusted_machine(calibrated_machine(tiny[1]), Placement(4, 4, 2, 2))
    network = create_model("resnet18", (32, 32, 3), 10).build(make_backend())
    calls: dict[str, list[KernelCost]] = {}
    for _, cost in step_costs(network, SGD(network), 8):
        calls.setdefault(cost.kernel, []).append(cost)
    del calls[ALLREDUCE]
    for kernel, step_calls in calls.items():
        assert machine.kernel_seconds_of(kernel, step_calls) == pytest.approx(
            [machine.kernel_seconds(kernel, cost) for cost in step_calls], rel=1e-5), kernel


def test_an_update_is_predicted_by_its_samples_only_where_many_were_pooled(tiny):
    calibration = Calibration.load(tiny[1])
    n = 70000
    cost = KernelCost(Stage.WU, "sgd_update", 4.0 * n, 20.0 * n, (n,))
    fitted = calibration.kernel_models["sgd_update"].predict(cost.dims, cost.flops, cost.bytes)
    pooled = [KernelSample(cost.dims, cost.flops, cost.bytes, 3.0 * fitted)] * (MIN_UPDATE_SAMPLES - 1)
    calibration.kernel_samples["sgd_update"] = pooled
    calibration._sampled.clear()
    assert calibration.warm_seconds("sgd_update", cost) == pytest.approx(fitted)  # a few minutes' samples
    calibration.kernel_samples["sgd_update"] = [*pooled, pooled[0]]
    calibration._sampled.clear()
    assert calibration.warm_seconds("sgd_update", cost) == pytest.approx(3.0 * fitted)


def test_a_call_after_other_work_adds_the_median_time_such_calls_took_beyond_their_prediction(tiny):
    calibration = Calibration.load(tiny[1])
    calls = [KernelCost(Stage.WU, "sgd_update", 4.0 * n, 20.0 * n, (n,)) for n in (300, 5000, 70000)]
    warm = [calibration.kernel_seconds("sgd_update", cost) for cost in calls]
    # Beyond their warm predictions by 20, 50 and 400 us: the median, 50 us, whatever the outlier.
    beyond = (2e-5, 5e-5, 4e-4)
    calibration.cold_start_samples = {"sgd_update": [KernelSample(cost.dims, cost.flops, cost.bytes, seconds + extra)
                                                     for cost, seconds, extra in zip(calls, warm, beyond, strict=True)]}
    calibration._cold_start.clear()
    assert calibration.cold_start_seconds("sgd_update") == pytest.approx(5e-5)
    for cost, seconds in zip(calls, warm, strict=True):
        assert calibration.kernel_seconds("sgd_update", cost) == seconds  # among other updates
        cold = dataclasses.replace(cost, cold_start=True)
        assert calibration.kernel_seconds("sgd_update", cold) == pytest.approx(seconds + 5e-5)
    assert calibration.cold_start_seconds("adam_update") >= 0.0
    # Calls that took less than their prediction add nothing; a kernel never sampled so, nothing.
    calibration.cold_start_samples["sgd_update"] = [dataclasses.replace(s, seconds=s.seconds / 10)
                                                    for s in calibration.cold_start_samples["sgd_update"]]
    calibration._cold_start.clear()
    assert calibration.cold_start_seconds("sgd_update") == 0.0 and calibration.cold_start_seconds("relu") == 0.0


def test_only_a_steps_first_update_follows_other_work():
    network = create_model("lenet", (32, 32, 3), 10).build(make_backend())
    for optimizer in (SGD(network), Adam(network)):
        marked = [cost.cold_start for _, cost in optimizer.costs()]
        assert marked == [True] + [False] * (len(network.segments) - 1)
    assert not any(cost.cold_start for _, cost in network.costs(4))


def test_a_kernel_without_model_gets_its_roofline_time(tiny):
    calibration = tiny[0]
    cost = KernelCost(Stage.FP, "batchnorm_inference", 4e9, 1e6, (8, 4, 4, 16))
    assert calibration.kernel_seconds("batchnorm_inference", cost) == 4e9 / calibration.peak_flops
    cost = KernelCost(Stage.FP, "batchnorm_inference", 1.0, 4e9, (8, 4, 4, 16))
    assert calibration.kernel_seconds("batchnorm_inference", cost) == 4e9 / calibration.memory_bandwidth


def test_missing_and_damaged_files_raise_clear_errors(tmp_path, tiny):
    with pytest.raises(OSError, match="cannot read calibration file"):
        Calibration.load(str(tmp_path / "missing.json"))
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"format": "pydtnn_lite calibration", "version": 1, "machi')
    with pytest.raises(ValueError, match="is not a calibration file"):
        Calibration.load(str(corrupt))
    damaged = json.loads(open(tiny[1]).read())
    del damaged["roofline"]["peak_flops"]
    (tmp_path / "damaged.json").write_text(json.dumps(damaged))
    with pytest.raises(ValueError, match="damaged calibration file.*peak_flops"):
        Calibration.load(str(tmp_path / "damaged.json"))


def a_later_calibration(calibration: Calibration, slower: float) -> Calibration:
    """``calibration`` as if measured again an hour later on a machine ``slower`` times slower."""
    state = calibration.machine_state
    assert state is not None
    return dataclasses.replace(
        calibration, machine={**calibration.machine, "date": "2099-01-01T01:00:00+00:00"},
        kernel_samples={kernel: [dataclasses.replace(s, seconds=s.seconds * slower) for s in samples]
                        for kernel, samples in calibration.kernel_samples.items()},
        machine_state=dataclasses.replace(state, gemm_flops=state.gemm_flops / slower,
                                          copy_bytes_per_second=state.copy_bytes_per_second / slower))


def test_merged_calibrations_pool_their_samples_and_average_their_snapshots(tiny):
    calibration, _ = tiny
    later = a_later_calibration(calibration, slower=4.0)
    merged = merge_calibrations([calibration, later])
    assert merged.machine["merged_dates"] == sorted([calibration.machine["date"], later.machine["date"]])
    assert merged.machine["date"] == later.machine["date"]
    for kernel, samples in calibration.kernel_samples.items():
        assert len(merged.kernel_samples[kernel]) == 2 * len(samples)
    assert len(merged.kernel_probes) == 2 * len(calibration.kernel_probes)
    assert len(merged.sync_samples) == 2 * len(calibration.sync_samples)
    # The machine's state at the merged calibration: the probes' geometric mean (x2 slower than the first).
    assert merged.machine_state is not None and calibration.machine_state is not None
    assert merged.machine_state.gemm_flops == pytest.approx(calibration.machine_state.gemm_flops / 2)
    assert merged.machine_state.copy_bytes_per_second == pytest.approx(
        calibration.machine_state.copy_bytes_per_second / 2)
    # A call sampled at its exact sizes is predicted as the median of both files' samples.
    sample = calibration.kernel_samples["im2col"][0]
    cost = KernelCost(Stage.FP, "im2col", sample.flops, sample.bytes, tuple(sample.dims))
    pooled = [s.seconds for s in merged.kernel_samples["im2col"]
              if tuple(s.dims) == tuple(sample.dims) and s.bytes == sample.bytes]
    assert merged.warm_seconds("im2col", cost) == pytest.approx(np.median(pooled))
    assert calibration.warm_seconds("im2col", cost) < merged.warm_seconds("im2col", cost) < \
        later.warm_seconds("im2col", cost)


def test_a_merge_counts_each_files_allreduce_once_a_size(tiny):
    calibration, _ = tiny
    mib = float(1 << 20)
    # A file that is itself a merge of many: several samples a size, all slow.
    many = dataclasses.replace(calibration, allreduce_samples=[(2, mib, t) for t in (3e-4, 4e-4, 5e-4)]
                               + [(2, 4 * mib, t) for t in (1.2e-3, 1.4e-3, 1.5e-3, 1.6e-3)] + [(4, mib, 9e-4)],
                               allreduce_cpu_samples=[(2, mib, t) for t in (1e-4, 2e-4, 6e-4)])
    one = dataclasses.replace(a_later_calibration(calibration, slower=1.0),
                              allreduce_samples=[(2, mib, 2e-4), (2, 4 * mib, 6e-4)],
                              allreduce_cpu_samples=[(2, mib, 1e-4)])
    merged = merge_calibrations([many, one])
    assert sorted(merged.allreduce_samples) == sorted([(2, mib, 4e-4), (2, 4 * mib, 1.45e-3), (4, mib, 9e-4),
                                                       (2, mib, 2e-4), (2, 4 * mib, 6e-4)])
    assert sorted(merged.allreduce_cpu_samples) == [(2, mib, 1e-4), (2, mib, 2e-4)]
    # The prediction takes the median of a size's samples: here the two files' mean.
    model = allreduce_models(merged.allreduce_samples, None)["interpolate"]
    assert model.seconds(4 * mib, 2) == pytest.approx((1.45e-3 + 6e-4) / 2)
    assert model.seconds(mib, 2) == pytest.approx(3e-4)


def test_a_thread_scaling_reads_back_and_older_files_scale_threads_linearly(tiny, tmp_path):
    calibration, _ = tiny
    scaled = dataclasses.replace(calibration, thread_scaling=ThreadScaling(2, gemm=1.1, memory=2.2, handoff=1e-4))
    scaled.save(str(tmp_path / "scaled.json"))
    assert Calibration.load(str(tmp_path / "scaled.json")).thread_scaling == scaled.thread_scaling
    older = scaled.to_dict()
    del older["thread_scaling"]["handoff"]  # a file from before the hand-off was timed
    assert Calibration.from_dict(older).thread_scaling == ThreadScaling(2, gemm=1.1, memory=2.2, handoff=None)
    del older["thread_scaling"]
    assert Calibration.from_dict(older).thread_scaling is None


def test_merged_thread_scalings_are_their_geometric_mean(tiny):
    calibration, _ = tiny
    first = dataclasses.replace(calibration, thread_scaling=ThreadScaling(2, gemm=1.0, memory=1.5, handoff=4e-5))
    second = dataclasses.replace(a_later_calibration(calibration, slower=1.0),
                                 thread_scaling=ThreadScaling(2, gemm=1.21, memory=2.4, handoff=1e-4))
    merged = merge_calibrations([first, second]).thread_scaling
    assert merged is not None and merged.threads == 2
    assert (merged.gemm, merged.memory) == pytest.approx((1.1, (1.5 * 2.4) ** 0.5))
    assert merged.handoff == pytest.approx((4e-5 * 1e-4) ** 0.5)
    # A file from before the hand-off was timed leaves the others' to the merge.
    older = dataclasses.replace(second, thread_scaling=ThreadScaling(2, gemm=1.21, memory=2.4))
    assert merge_calibrations([first, older]).thread_scaling.handoff == pytest.approx(4e-5)
    assert merge_calibrations([first, dataclasses.replace(second, thread_scaling=None)]).thread_scaling == \
        first.thread_scaling
    # GEMM shapes: each one's ratio over the files that timed it.
    shaped = dataclasses.replace(first, thread_scaling=ThreadScaling(2, 1.0, 1.5, 4e-5, {(8, 8, 8, 0, 0): 2.0,
                                                                                        (64, 64, 64, 0, 0): 1.5}))
    other = dataclasses.replace(second, thread_scaling=ThreadScaling(2, 1.21, 2.4, 1e-4, {(8, 8, 8, 0, 0): 1.28}))
    shapes = merge_calibrations([shaped, other]).thread_scaling.gemm_shapes
    assert shapes == pytest.approx({(8, 8, 8, 0, 0): 1.6, (64, 64, 64, 0, 0): 1.5})


def test_merging_keeps_a_changed_kernel_s_samples_from_the_files_of_its_newest_code(tiny):
    calibration, _ = tiny
    kernel = "relu"  # as if its code changed after the first file was measured
    assert calibration.kernel_samples[kernel] and all(probe.calls[kernel] for probe in calibration.kernel_probes)
    assert calibration.kernel_revisions == KERNEL_REVISIONS and kernel not in KERNEL_REVISIONS
    newer = dataclasses.replace(a_later_calibration(calibration, slower=2.0),
                                kernel_revisions={**KERNEL_REVISIONS, kernel: 2})
    for files in ([calibration, newer], [newer, calibration]):
        merged = merge_calibrations(files)
        assert merged.kernel_revisions == newer.kernel_revisions and merged.revision(kernel) == 2
        assert merged.kernel_samples[kernel] == newer.kernel_samples[kernel]  # the older file's left out
        assert merged.kernel_rates[kernel] == newer.kernel_rates[kernel]
        assert [bool(probe.calls.get(kernel)) for probe in merged.kernel_probes] == [
            file is newer for file in files for _ in file.kernel_probes]
        # Every other kernel pools both files.
        assert len(merged.kernel_samples["im2col"]) == 2 * len(calibration.kernel_samples["im2col"])
    assert merge_calibrations([calibration, calibration]).kernel_revisions == KERNEL_REVISIONS
    newer.save(str(tiny[1]) + ".newer.json")
    assert Calibration.load(str(tiny[1]) + ".newer.json").kernel_revisions == newer.kernel_revisions


def test_merging_keeps_each_network_sampled_whole_last_as_the_files_mean(tiny):
    calibration, _ = tiny
    jobs = {**calibration.settings, "jobs": ["mlp:4:synthetic"]}
    first = dataclasses.replace(calibration, settings=jobs, overhead_samples=[(10.0, 1.0), (20.0, 3.0)])
    second = dataclasses.replace(first, overhead_samples=[(12.0, 2.0), (20.0, 5.0)])
    merged = merge_calibrations([first, second])
    assert merged.overhead_samples == [(10.0, 1.0), (12.0, 2.0), (20.0, 4.0)]


def test_calibrations_of_other_machines_or_networks_do_not_merge(tiny):
    calibration, _ = tiny
    other = dataclasses.replace(calibration, machine={**calibration.machine, "cpu_model": "another processor"})
    with pytest.raises(ValueError, match="differ in cpu_model"):
        merge_calibrations([calibration, other])
    units = [dataclasses.replace(calibration, machine={**calibration.machine, "vector_unit": unit})
             for unit in ("AVX2", "AVX-512")]
    with pytest.raises(ValueError, match="differ in vector_unit"):
        merge_calibrations(units)
    caches = [dataclasses.replace(calibration, machine={**calibration.machine, "cpu_cache_bytes": size << 20})
              for size in (260, 300)]
    with pytest.raises(ValueError, match="differ in last-level cache"):
        merge_calibrations(caches)
    generations = [dataclasses.replace(calibration, machine={**calibration.machine, "cpu_generation": generation})
                   for generation in ("family 25 model 17", "family 26 model 2")]
    with pytest.raises(ValueError, match="differ in processor generation"):
        merge_calibrations(generations)
    # A file that names no generation merges with one that does, and the merge names it.
    unnamed = dataclasses.replace(calibration, machine={key: value for key, value in calibration.machine.items()
                                                        if key != "cpu_generation"})
    assert merge_calibrations([unnamed, generations[0]]).machine["cpu_generation"] == "family 25 model 17"
    kernels = [dataclasses.replace(calibration, machine={**calibration.machine, "blas": [
        {"internal_api": "openblas", "version": version, "architecture": architecture}]})
        for version, architecture in (("0.3.30", "SkylakeX"), ("0.3.31", "Haswell"))]
    with pytest.raises(ValueError, match="differ in BLAS kernels"):
        merge_calibrations(kernels)
    # Another version of the library running the same kernels is the same machine.
    newer = dataclasses.replace(kernels[0], machine={**kernels[0].machine, "blas": [
        {"internal_api": "openblas", "version": "0.3.31", "architecture": "SkylakeX"}]})
    assert merge_calibrations([kernels[0], newer]).machine["blas"] == kernels[0].machine["blas"]
    with pytest.raises(ValueError, match="sampled different networks whole"):
        merge_calibrations([calibration, dataclasses.replace(calibration, settings={"jobs": ["lenet:8:synthetic"]})])
    # A file whose probes' ranks met only after backward sampled the kernels after a batch
    # norm apart, where the ranks of a newer file ran them side by side.
    older = dataclasses.replace(calibration, settings={k: v for k, v in calibration.settings.items()
                                                       if k != "ranks_meet"})
    with pytest.raises(ValueError, match="met at different points"):
        merge_calibrations([calibration, older])
    # A file that sampled the step right after each eviction timed a small network's kernels
    # before they had their data back in the cache.
    unsettled = dataclasses.replace(calibration, settings={k: v for k, v in calibration.settings.items()
                                                           if k != "sampled_after_seconds"})
    with pytest.raises(ValueError, match="different distances from a cache eviction"):
        merge_calibrations([calibration, unsettled])
    with pytest.raises(ValueError, match="at least two"):
        merge_calibrations([calibration])


def test_cli_merges_calibrations_into_one_with_models_fitted_on_every_sample(tmp_path, tiny):
    calibration, path = tiny
    later = tmp_path / "later.json"
    a_later_calibration(calibration, slower=2.0).save(str(later))
    merged_path = tmp_path / "merged.json"
    result = calibrate_cli("--merge", path, str(later), "--out", str(merged_path))
    assert result.returncode == 0, result.stderr[-2000:]
    merged = Calibration.load(str(merged_path))
    assert merged.kernel_models.keys() == calibration.kernel_models.keys()
    assert len(merged.kernel_samples["gemm"]) == 2 * len(calibration.kernel_samples["gemm"])
    elsewhere = tmp_path / "elsewhere.json"
    dataclasses.replace(calibration, machine={**calibration.machine, "cores": 64}).save(str(elsewhere))
    refused = calibrate_cli("--merge", path, str(elsewhere), "--out", str(tmp_path / "never.json"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "differ in cores" in refused.stderr
    assert not (tmp_path / "never.json").exists()


def calibrate_cli(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pydtnn_lite.calibrate", *flags], capture_output=True, text=True,
                          timeout=120)


def test_cli_names_a_corrupt_calibration_file_in_one_line(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("not json at all")
    result = calibrate_cli("--refit", str(corrupt))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "corrupt.json is not a calibration file" in result.stderr
    assert "Traceback" not in result.stderr


def test_whole_networks_are_not_sampled_by_ranks_that_share_cores(tmp_path):
    """--models times whole networks, whose calls outlast a time slice: with more ranks than
    cores they would be timed sharing the cores and predicted sharing them again."""
    out = tmp_path / "never.json"
    ranks = usable_cores() + 1
    result = run(ranks, ["-m", "pydtnn_lite.calibrate", "--quick", "--models", "mlp:4", "--out", str(out)])
    assert result.returncode == 2
    assert f"--models with {ranks} ranks on {usable_cores()} cores here" in result.stderr
    assert "at most one rank per core" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_networks_sampled_whole_come_in_rounds_spread_along_the_grid():
    grid = [Probe("dense", 4, (64, units, 10)) for units in (64, 256, 512, 1024, 2048)]
    jobs = [Probe("model", 4, ("mlp", "synthetic")), Probe("model", 8, ("lenet", "digits"))]
    assert in_rounds(grid, jobs, 1) == grid + jobs  # one round: after the grid, as a calibration always did
    assert in_rounds(grid, jobs, 2) == grid[:2] + jobs + grid[2:] + jobs
    assert in_rounds(grid, jobs, 3) == grid[:1] + jobs + grid[1:3] + jobs + grid[3:] + jobs
    assert in_rounds(grid, [], 3) == grid


def test_two_rank_quick_calibration_holds_allreduce_samples_and_refits(tmp_path):
    out = tmp_path / "quick.json"
    result = run(2, ["-m", "pydtnn_lite.calibrate", "--quick", "--batch-sizes", "4", "8", "--models", "mlp:4",
                     "--model-rounds", "2", "--out", str(out)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("wrote") == 1  # rank 0 alone writes and reports
    # The network sampled whole in two rounds, and how far apart they fell.
    assert re.search(r"^networks sampled whole, in 2 rounds .*: mlp:4 x\d+\.\d\d$", result.stdout, re.MULTILINE)
    calibration = Calibration.load(str(out))
    assert {"relu_grad_sum", "add_relu"} <= set(calibration.kernel_samples)  # the grid's residual probes
    assert calibration.allreduce_ranks == 2 and calibration.machine["ranks"] == 2
    # A rank per core (on this 2-core machine): one rank's two threads timed against the two ranks.
    scaling = calibration.thread_scaling
    if usable_cores() == 2:
        assert scaling is not None and scaling.threads == 2 and scaling.gemm > 0 and scaling.memory > 0
        assert scaling.handoff is not None and scaling.handoff >= 0
        assert "one rank on 2 threads" in result.stdout and "hand-off" in result.stdout
        # Every GEMM shape of the samples timed on both threads.
        assert set(scaling.gemm_shapes) == {sample.dims for sample in calibration.kernel_samples["gemm"]}
        assert all(ratio > 0 for ratio in scaling.gemm_shapes.values()) and "GEMM shapes" in result.stdout
    # The state a run's Allreduce probe is set against: the probe's reduction on the calibration's ranks.
    state = calibration.machine_state
    assert state is not None and (state.allreduce_ranks, state.allreduce_bytes) == (2, ALLREDUCE_BYTES)
    assert state.allreduce_seconds is not None and state.allreduce_seconds > 0
    assert [(p, n) for p, n, _ in calibration.allreduce_samples] == [(2, float(n)) for n in QUICK_SIZES]
    assert all(seconds > 0 for _, _, seconds in calibration.allreduce_samples)
    # The Allreduce and both updates timed in the cache and after an eviction, on the job's ranks.
    residency = calibration.cache_residency
    assert residency is not None and (residency.ranks, residency.sizes) == (2, QUICK_RESIDENCY_SIZES)
    assert set(residency.resident) == set(residency.evicted) == {ALLREDUCE, "sgd_update", "adam_update"}
    assert all(seconds > 0 for record in (residency.resident, residency.evicted)
               for times in record.values() for seconds in times)
    # And in the cache after each wait since the data's last use, at every size.
    assert residency.idle_seconds == IDLE_WAITS and set(residency.idle) == set(residency.resident)
    assert all(len(rows) == len(IDLE_WAITS) and all(len(row) == len(QUICK_RESIDENCY_SIZES) and min(row) > 0
                                                    for row in rows) for rows in residency.idle.values())
    assert "cache: resident over evicted" in result.stdout and "ms after the data's last use" in result.stdout
    # A bucket's own calls timed with blocking reductions after its post, against its blocking Allreduce.
    progress = calibration.bucket_progress
    assert progress is not None and (progress.ranks, len(progress.sizes)) == (2, 3)
    assert all(seconds > 0 for seconds in (*progress.blocking, *progress.own_calls))
    assert all(0.0 <= progress.share_left(n) <= 1.0 for n in progress.sizes)
    assert "bucket progress: a bucket's own calls" in result.stdout
    # One (work, wait) sample per meeting of a probe's step (each batch-norm reduction, then
    # after backward), the waits at the ranks' barriers fitted as a power law.
    meetings = sum(1 + batch_norm_reductions(probe) for probe in calibration_grid((4, 8), QUICK))
    assert len(calibration.sync_samples) == meetings + 2  # and the MLP's two rounds
    # The time outside the kernels likewise, but the MLP's rounds as one sample, the last (their median).
    assert len(calibration.overhead_samples) == len(calibration_grid((4, 8), QUICK)) + 1
    # The job's network sampled whole: each of its calls predicted as measured (the median of
    # its samples where its layers repeat sizes); but its updates by the model fitted on the
    # grid's, and the first, which follows the step's other work, with the time such calls
    # took beyond their prediction.
    assert calibration.settings["jobs"] == ["mlp:4:synthetic"] and calibration.settings["job_rounds"] == 2
    network = create_model("mlp", (32, 32, 3), 10).build(make_backend())
    for _, cost in step_costs(network, SGD(network), 4):
        if cost.cold_start:
            assert calibration.kernel_seconds(cost.kernel, cost) == pytest.approx(
                calibration.warm_seconds(cost.kernel, cost) + calibration.cold_start_seconds(cost.kernel))
        elif cost.kernel == "sgd_update":
            modelled = calibration.kernel_models["sgd_update"].predict(cost.dims, cost.flops, cost.bytes)
            assert calibration.kernel_seconds(cost.kernel, cost) == pytest.approx(modelled)
        elif cost.kernel != ALLREDUCE:
            sampled = [s.seconds for s in calibration.kernel_samples[cost.kernel]
                       if tuple(s.dims) == tuple(cost.dims) and s.bytes == cost.bytes]
            assert len(sampled) >= 2, cost  # one from each round, at least
            assert calibration.kernel_seconds(cost.kernel, cost) == pytest.approx(np.median(sampled)), cost
    assert sum(map(len, calibration.cold_start_samples.values())) == len(calibration_grid((4, 8), QUICK)) + 2
    assert all(work > 0 and wait >= 0 for work, wait in calibration.sync_samples)
    assert calibration.sync_wait.ranks == 2 and calibration.sync_wait.coefficient > 0
    assert "wait for the slowest rank" in result.stdout
    # Reading ahead, timed against reading in the step: the share a step pays.
    assert len(calibration.read_ahead_samples) == 2 and 0.0 <= calibration.read_ahead_share <= 1.0  # quick: 2 rounds
    assert all(inline > read > 0 and ahead > 0 for inline, ahead, read in calibration.read_ahead_samples)
    refitted = tmp_path / "refitted.json"
    result = calibrate_cli("--refit", str(out), "--out", str(refitted))
    assert result.returncode == 0, result.stderr[-2000:]
    assert Calibration.load(str(refitted)).kernel_models.keys() == calibration.kernel_models.keys()
    assert Calibration.load(str(refitted)).sync_wait == calibration.sync_wait

    # Allreduce timed again into a copy: the kernels stay as they were.
    remeasured = tmp_path / "remeasured.json"
    result = run(2, ["-m", "pydtnn_lite.calibrate", "--allreduce-only", str(out), "--quick", "--out", str(remeasured)])
    assert result.returncode == 0, result.stderr[-2000:]
    again = Calibration.load(str(remeasured))
    assert again.kernel_samples == calibration.kernel_samples
    assert again.kernel_models.keys() == calibration.kernel_models.keys()
    assert [(p, n) for p, n, _ in again.allreduce_samples] == [(p, n) for p, n, _ in calibration.allreduce_samples]
    assert again.settings["allreduce_remeasured"]["seconds"] > 0
    assert again.machine_state is not None and again.machine_state.gemm_flops == state.gemm_flops  # kernels' state kept
    assert again.machine_state.allreduce_seconds is not None and again.machine_state.allreduce_seconds > 0
    assert again.cache_residency is not None and again.cache_residency.sizes == QUICK_RESIDENCY_SIZES  # timed again
    assert again.bucket_progress is not None and again.bucket_progress != progress  # timed again
    assert f"over its blocking Allreduce: {again.bucket_progress.summary()}" in result.stdout  # in the report
    unknown = calibrate_cli("--quick", "--models", "vgg12:4", "--out", str(tmp_path / "never.json"))
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "unknown model 'vgg12'" in unknown.stderr
    assert not (tmp_path / "never.json").exists()
    one_rank = calibrate_cli("--allreduce-only", str(out), "--out", str(remeasured))
    assert one_rank.returncode == 2 and "two ranks or more (this job has 1)" in one_rank.stderr


def test_a_calibration_measured_to_be_fitted_later_predicts_only_once_refitted(tmp_path):
    """--fit-later writes the samples alone (a GPU machine's time spent measuring, the fit run
    on any host); the file is refused for predictions until --refit fits it."""
    out = tmp_path / "later.json"
    measured = calibrate_cli("--quick", "--batch-sizes", "4", "--fit-later", "--out", str(out))
    assert measured.returncode == 0, measured.stderr[-2000:]
    assert f"--refit {out}" in measured.stdout
    unfitted = Calibration.load(str(out))
    assert unfitted.kernel_samples and not unfitted.kernel_models
    predict = [sys.executable, "-m", "pydtnn_lite.predict", "--model", "lenet", "--batch-size", "8", "--procs", "1",
               "--calibration", str(out)]
    refused = subprocess.run(predict, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "no fitted models" in refused.stderr and f"--refit {out}" in refused.stderr
    assert calibrate_cli("--refit", str(out)).returncode == 0
    fitted = Calibration.load(str(out))
    assert fitted.kernel_models.keys() == unfitted.kernel_samples.keys()
    assert fitted.kernel_samples == unfitted.kernel_samples
    assert subprocess.run(predict, capture_output=True, text=True, timeout=120).returncode == 0
    mixed = calibrate_cli("--refit", str(out), "--fit-later")
    assert mixed.returncode == 2 and "argument --fit-later: not allowed with argument --refit" in mixed.stderr


def test_a_gpu_calibration_times_allreduce_on_its_own_ranks_only():
    """Counts of ranks beyond the job's, up to four a core, are CPU ranks sharing cores: a GPU
    job never runs so, and on a 16-core GPU machine their child jobs took minutes."""
    from pydtnn_lite.calibrate import build_parser, settings_from

    def settings(*flags: str) -> CalibrationSettings:
        return settings_from(build_parser().parse_args(list(flags)))

    assert settings().beyond_job and settings().fit
    assert not settings("--device", "gpu").beyond_job
    assert not settings("--no-oversubscribed").beyond_job and not settings("--fit-later").fit
