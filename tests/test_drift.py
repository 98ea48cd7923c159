"""Drift scaling and the affine fits of the time outside kernels, against hand-computed cases."""
from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from pydtnn_lite.comm import SerialCommunicator
from pydtnn_lite.costs import DATA_LOAD, KernelCost, Stage
from pydtnn_lite.perfmodel.measuring.machine_state import StateWatch, cores_of, median_and_spread
from pydtnn_lite.perfmodel.modelling.cache_residency import CacheResidency
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.drift import (
    CoreRates,
    Drift,
    MachineState,
    ProbedWork,
    beyond_noise,
    drift_between,
    kernel_ratios,
    lasting_imbalance,
    like_for_like,
    probe_moves,
)
from pydtnn_lite.perfmodel.modelling.machines import (
    OUTSIDE_KERNELS,
    AdjustedMachine,
    CalibratedMachine,
    adjusted_machine,
    allreduce_models,
    probed_gemm_ratio,
    probed_ratios,
)
from pydtnn_lite.perfmodel.modelling.outside_kernels import AffineCost, fit_affine
from pydtnn_lite.perfmodel.modelling.placement import Placement
from pydtnn_lite.perfmodel.modelling.processors import Processor
from pydtnn_lite.perfmodel.modelling.regression import KernelSample, RateModel
from pydtnn_lite.perfmodel.modelling.synchronization import SyncWaitModel, expected_maximum
from pydtnn_lite.perfmodel.modelling.trace_validation import kernel_probe_of
from pydtnn_lite.runtime import usable_cores

THEN = MachineState(gemm_flops=90e9, copy_bytes_per_second=20e9, allreduce_ranks=2, allreduce_bytes=1 << 20,
                    allreduce_seconds=300e-6)


def test_a_slower_machine_scales_each_kind_of_work_by_its_own_rate():
    now = MachineState(60e9, 25e9, 2, 1 << 20, 375e-6)
    drift = drift_between(THEN, now)
    assert drift.compute == pytest.approx(1.5)  # GEMM 90 -> 60 GFLOP/s: 1.5x the time
    assert drift.memory == pytest.approx(0.8)  # copies 20 -> 25 GB/s
    assert drift.communication == pytest.approx(1.25)  # 375 us against the calibration's 300 us
    assert drift.scale("gemm") == pytest.approx(1.5)
    assert drift.scale("im2col") == pytest.approx(0.8)
    assert drift.scale("allreduce_wait", communication=True) == pytest.approx(1.25)
    assert drift.measured == pytest.approx(0.5) and drift.moved and drift.noise == 0.0


def test_a_gemm_moves_with_the_peak_only_for_the_share_of_its_time_spent_at_the_peak():
    drift = drift_between(THEN, MachineState(60e9, 25e9))  # GEMM x1.5, memory x0.8
    # At the calibration probe's 90 GFLOP/s the whole time is at the peak: the GEMM ratio.
    assert drift.scale("gemm", flops=9e9, seconds=0.1) == pytest.approx(1.5)
    # At 60 GFLOP/s two thirds of it was; the third spent below the peak moves as memory.
    assert drift.scale("gemm", flops=6e9, seconds=0.1) == pytest.approx(2 / 3 * 1.5 + 1 / 3 * 0.8)
    # Faster than the probe (several threads): the share is capped at all of it.
    assert drift.scale("gemm", flops=18e9, seconds=0.1) == pytest.approx(1.5)
    # Without the cost, or without the calibration's probe rate, the GEMM ratio as it is.
    assert drift.scale("gemm") == pytest.approx(1.5)
    assert Drift(compute=1.5, memory=0.8).scale("gemm", flops=6e9, seconds=0.1) == pytest.approx(1.5)


def test_a_gemm_moves_as_the_kernel_probe_s_products_and_on_another_processor_splits_at_the_peak():
    """A GEMM predicted at 1 ms with a quarter of its time at the 90 GFLOP/s peak (2.25e7
    FLOP), where the every-core probe's GEMM moved 1.2x and the kernel probe's products 1.6x:
    on the calibration's processor all of it moves 1.6x, at the peak or not. On another, the
    part at the peak moves as the every-core probe's GEMM, the rest as the products."""
    drift = dataclasses.replace(drift_between(THEN, MachineState(75e9, 25e9)), probed_gemm=1.6)  # GEMM x1.2
    assert drift.scale("gemm", flops=2.25e7, seconds=1e-3) == pytest.approx(1.6)
    assert drift.scale("gemm", flops=9e7, seconds=1e-3) == pytest.approx(1.6)
    assert drift.scale("im2col") == pytest.approx(0.8)  # other kernels keep the copy rates
    assert "the model's GEMMs x1.600, as the kernel probe's products moved" in drift.describe()
    elsewhere = dataclasses.replace(drift, other_processor=True)
    assert elsewhere.scale("gemm", flops=2.25e7, seconds=1e-3) == pytest.approx(0.25 * 1.2 + 0.75 * 1.6)
    assert "GEMMs off their peak x1.600" in elsewhere.describe()


def test_a_fused_kernel_the_probe_did_not_time_moves_as_the_mean_of_its_parts():
    drift = Drift(memory=0.8, kernels={"batchnorm_normalize": 1.2, "relu": 0.6, "batchnorm_relu_grad_input": 1.1})
    assert drift.scale("batchnorm_relu_normalize") == pytest.approx((1.2 + 0.6) / 2)
    assert drift.scale("batchnorm_relu_grad_sums") == pytest.approx(0.8)  # neither part timed: memory
    assert drift.scale("batchnorm_relu_grad_input") == pytest.approx(1.1)  # timed itself: its own


def test_an_unmoved_machine_changes_nothing_and_raises_no_warning():
    drift = drift_between(THEN, MachineState(92e9, 19.5e9))
    assert drift.communication == 1.0  # one rank now: no Allreduce timed
    assert not drift.moved and drift.measured < 0.1


def test_an_allreduce_on_other_ranks_is_compared_through_the_calibration_s_model():
    def model(nbytes: float, ranks: int) -> float:  # 8 ranks take 4x the time of 2 here
        return {2: 1.0, 8: 4.0}[ranks] * nbytes * 1e-9

    now = MachineState(90e9, 20e9, 8, 1 << 20, 1.5e-3)  # 1.2 ms expected: 300 us x 4
    assert drift_between(THEN, now, model).communication == pytest.approx(1.25)
    assert drift_between(THEN, now).communication == 1.0  # no model: nothing to carry it over with


def test_only_allreduce_times_measured_at_the_run_s_rank_count_carry_its_probe_over_and_a_fit_is_named():
    """A calibration of 2 ranks on 2 cores, its Allreduce timed on those 2 only, and a run
    of 8 ranks sharing the cores whose probe's Allreduce takes 12x the calibration's: the
    alpha-beta-gamma fit knows nothing of the sharing, so the probe is not carried over
    through it, and the prediction says where its reductions come from. Timed at 8 ranks
    too (4x the time of 2), the probe is carried over through the times."""
    sizes = [float(1 << k) for k in range(10, 24, 2)]
    two = [(2, n, 20e-6 + n * 1e-9) for n in sizes]
    placed = {"ranks": 2, "usable_cores": 2, "blas_threads": 1}
    calibration = Calibration(machine=placed, peak_flops=1e11, memory_bandwidth=1e10, kernel_models={},
                              allreduce_samples=two, machine_state=THEN, cache_residency=CacheResidency(2, ()))
    now = MachineState(90e9, 20e9, 8, 1 << 20, 12 * 300e-6)
    eight_sharing = Placement(8, 8, 2)

    def machine(samples: list) -> AdjustedMachine:
        fitted = CalibratedMachine(dataclasses.replace(calibration, allreduce_samples=samples),
                                   allreduce_models(samples)["interpolate"])
        return adjusted_machine(fitted, eight_sharing, now)

    only_two = machine(two)
    assert only_two.drift.communication == 1.0
    assert any("timed Allreduce on 2 ranks, not on 8" in line for line in only_two.warnings([]))
    timed = machine(two + [(8, n, 4 * (20e-6 + n * 1e-9)) for n in sizes])
    assert timed.drift.communication == pytest.approx(12 * 300e-6 / (300e-6 * 4), rel=0.05)
    assert timed.warnings([]) == []


def test_a_run_on_another_processor_splits_its_gemms_at_the_calibration_s_peak():
    """The run's processor against the calibration's (its record names Xeon A, AVX-512):
    another name or vector unit is another processor; a record that names none is taken
    as the calibration's, as is a run without a processor named."""
    placed = {"ranks": 2, "usable_cores": 2, "blas_threads": 1, "cpu_model": "Xeon A", "vector_unit": "AVX-512"}
    calibration = Calibration(machine=placed, peak_flops=1e11, memory_bandwidth=1e10, kernel_models={},
                              allreduce_samples=[], machine_state=THEN)
    machine = CalibratedMachine(calibration, None)
    now = MachineState(60e9, 25e9)

    def other(processor: Processor | None) -> bool:
        return adjusted_machine(machine, None, now, None, processor).drift.other_processor

    assert other(Processor("Xeon B", "AVX-512")) and other(Processor("Xeon A", "AVX2"))
    assert not other(Processor("Xeon A", "AVX-512")) and not other(Processor("")) and not other(None)


def test_a_probe_travels_through_its_dictionary():
    assert MachineState.from_dict(THEN.to_dict()) == THEN
    # A probe recorded before spreads were has none: its moves are all taken as real.
    old = {key: value for key, value in THEN.to_dict().items() if not key.endswith("_spread")}
    assert MachineState.from_dict(old) == THEN and THEN.gemm_spread == 0.0
    assert Drift().describe().startswith("every-core GEMM x1.000")


def test_the_affine_fit_recovers_a_fixed_and_a_per_unit_cost():
    samples = [(calls, 2e-4 + 15e-6 * calls) for calls in (20, 40, 80, 160)]
    model = fit_affine(samples)
    assert model.fixed == pytest.approx(2e-4, rel=1e-6) and model.per_unit == pytest.approx(15e-6, rel=1e-6)
    assert model.seconds(100) == pytest.approx(2e-4 + 15e-4)
    # A negative intercept is not a cost: the fit keeps the per-unit term alone.
    assert fit_affine([(10, 1e-4), (100, 2e-3)]).fixed == 0.0


def test_a_synchronous_step_runs_at_the_slowest_core_unless_ranks_time_share_them():
    # Two cores, one in a slow spell: every rank waits for the slowest at the reduction.
    instant = CoreRates((150e9, 100e9), (16e9, 12e9))
    assert instant.pace() == (100e9, 12e9)
    # Ranks outnumbering the cores move between them: the time is the cores' mean time.
    shared = CoreRates((150e9, 100e9), (16e9, 12e9), shared=True)
    assert shared.pace() == pytest.approx((120e9, 2 / (1 / 16e9 + 1 / 12e9)))


def test_a_run_s_state_is_the_mean_time_and_a_calibration_s_the_median():
    fast, slow = CoreRates((150e9, 150e9), (15e9, 15e9)), CoreRates((150e9, 75e9), (15e9, 5e9))
    run = MachineState.over([fast, fast, slow])
    # Time per unit 1/150 + 1/150 + 1/75 over 3 instants: the mean rate is 112.5 GFLOP/s.
    assert run.gemm_flops == pytest.approx(112.5e9)
    assert run.copy_bytes_per_second == pytest.approx(3 / (2 / 15e9 + 1 / 5e9))
    assert (run.cores, run.probes) == (2, 3)
    # Its spread is the standard error of that mean: times (1, 1, 2)/150, sd 1/sqrt(3)/150.
    assert run.gemm_spread == pytest.approx((1 / math.sqrt(3)) / math.sqrt(3) / (4 / 3))
    typical = MachineState.over([fast, fast, slow], typical=True)
    assert typical.gemm_flops == pytest.approx(150e9)  # the odd slow spell does not move a median
    one = MachineState.over([CoreRates((100e9,), (10e9,), gemm_spread=0.03, copy_spread=0.05)])
    assert (one.gemm_spread, one.copy_spread, one.allreduce_seconds) == (0.03, 0.05, None)


def test_a_rank_on_a_core_of_the_mean_speed_waits_for_the_slowest_core():
    # GEMM times 1/150 and 1/100 per GFLOP: the slowest takes 1.2x their mean 1/120.
    assert CoreRates((150e9, 100e9), (16e9, 12e9)).imbalance() == pytest.approx(0.2)
    assert CoreRates((150e9, 100e9), (16e9, 12e9), shared=True).imbalance() == 0.0
    assert CoreRates((150e9,), (16e9,)).imbalance() == 0.0
    even, apart = CoreRates((100e9, 100e9), (10e9, 10e9)), CoreRates((150e9, 100e9), (10e9, 10e9))
    # A run's: each core's mean time, 1/120 and 1/100 per GFLOP; the slower 1/100 over their mean 1/109.09.
    assert MachineState.over([even, apart]).imbalance == pytest.approx(1 / 11)
    assert MachineState.over([even, even, apart], typical=True).imbalance == 0.0  # a calibration's: the median
    assert drift_between(THEN, MachineState.over([apart])).imbalance == pytest.approx(0.2)


def test_a_core_slow_at_one_instant_and_fast_at_the_next_is_no_lasting_imbalance():
    # Each instant 20 % apart, the slower core changing: the ranks wander, neither stays behind.
    first_slow, second_slow = CoreRates((100e9, 150e9), (10e9, 10e9)), CoreRates((150e9, 100e9), (10e9, 10e9))
    assert first_slow.imbalance() == pytest.approx(0.2) and second_slow.imbalance() == pytest.approx(0.2)
    assert lasting_imbalance([first_slow, second_slow]) == pytest.approx(0.0)
    assert MachineState.over([first_slow, second_slow, first_slow]).imbalance == pytest.approx(
        (2 / 100 + 1 / 150) / 3 / ((2 / 100 + 1 / 150 + 2 / 150 + 1 / 100) / 6) - 1)
    assert lasting_imbalance([first_slow, CoreRates((100e9, 100e9, 100e9), (10e9,) * 3)]) == 0.0  # other cores


def test_the_wait_at_a_synchronisation_adds_the_slowest_core_to_the_ranks_wandering():
    placed = {"ranks": 2, "usable_cores": 2, "blas_threads": 1}
    # The calibration's cores were 2 % apart: of its fitted 0.02 * sqrt(0.5) = 14.1 ms after 0.5 s of
    # work, 10 ms were the slower core's; the rest, 4.1 ms, the ranks' independent wandering.
    calibration = Calibration(machine=placed, peak_flops=1e11, memory_bandwidth=1e10, kernel_models={},
                              allreduce_samples=[], sync_wait=SyncWaitModel(0.02, 0.5, 2),
                              machine_state=MachineState(1e11, 1e10, cores=2, imbalance=0.02))
    machine = CalibratedMachine(calibration, None)
    wander = 0.02 * math.sqrt(0.5) - 0.02 * 0.5
    to_eight = expected_maximum(8) / expected_maximum(2)
    apart = AdjustedMachine(machine, Placement(2, 2, 2, 1), Drift(imbalance=0.05))
    assert apart.sync_wait_seconds(0.5, 2) == pytest.approx(wander + 0.05 * 0.5)  # the run's cores 5 % apart
    # More ranks wait longer for the slowest wanderer; a core's steady slowness stays what it is.
    assert apart.sync_wait_seconds(0.5, 8) == pytest.approx(wander * to_eight + 0.05 * 0.5)
    assert apart.sync_wait_seconds(0.5, 1) == 0.0  # one rank waits for no one
    # Without a probe of the run: the calibration's cores, except where the ranks time-share them.
    assert AdjustedMachine(machine, Placement(2, 2, 2, 1)).sync_wait_seconds(0.5, 2) == pytest.approx(
        0.02 * math.sqrt(0.5))
    assert AdjustedMachine(machine, Placement(8, 8, 2, 1)).sync_wait_seconds(0.5, 8) == pytest.approx(
        wander * to_eight)
    # 4 s of work: the calibration's imbalance explains more than its fit, so no wandering is left.
    assert AdjustedMachine(machine, Placement(2, 2, 2, 1), Drift(imbalance=0.0)).sync_wait_seconds(4.0, 2) == 0.0


def test_the_allreduce_probes_of_a_run_are_averaged():
    instant = CoreRates((100e9,), (10e9,))
    state = MachineState.over([instant], [(2, 1 << 20, 300e-6, 0.02), (2, 1 << 20, 500e-6, 0.04)])
    assert (state.allreduce_ranks, state.allreduce_bytes) == (2, 1 << 20)
    assert state.allreduce_seconds == pytest.approx(400e-6)
    assert state.allreduce_spread == pytest.approx(0.25)  # they differ by +-25 %, more than their own 3 %
    with pytest.raises(ValueError, match="different ranks or sizes"):
        MachineState.over([instant], [(2, 1 << 20, 300e-6, 0.0), (4, 1 << 20, 500e-6, 0.0)])


def test_ranks_share_out_their_host_s_cores_and_ranks_beyond_them_probe_none():
    assert [cores_of(i, 2, 2) for i in range(2)] == [1, 1]
    assert cores_of(0, 1, 2) == 2  # one rank with two BLAS threads: both cores
    assert [cores_of(i, 3, 8) for i in range(3)] == [3, 3, 2]
    assert [cores_of(i, 8, 2) for i in range(8)] == [1, 1, 0, 0, 0, 0, 0, 0]


def test_a_run_is_probed_between_its_traced_steps_only():
    traced = [0]
    watch = StateWatch(SerialCommunicator(), lambda: traced[0])
    assert len(watch.instants) == 1  # as the run starts
    watch.after_step(0, None)  # a warm-up step, not traced
    assert len(watch.instants) == 1 and watch.every is None
    for _ in range(3):
        traced[0] += 1
        watch.after_step(traced[0], None)
    assert watch.every is not None and watch.every >= 1
    probed = len(watch.instants)
    assert probed == 1 + 3 // watch.every
    state = watch.state()
    assert state.probes == probed + 1 and state.cores == usable_cores()  # and once more as it ends


def test_a_run_runs_the_kernel_probe_as_it_starts_and_as_it_ends():
    seconds = iter([1e-5, 2e-5])
    watch = StateWatch(SerialCommunicator(), lambda: 0,
                       lambda: ProbedWork({"relu": [KernelSample((1000,), 0.0, 8e3, next(seconds))]}))
    assert len(watch.kernel_runs) == 1
    watch.state()
    assert len(watch.kernel_runs) == 2
    assert ProbedWork.mean(watch.kernel_runs).calls["relu"][0].seconds == pytest.approx(1.5e-5)
    assert StateWatch(SerialCommunicator(), lambda: 0).kernel_runs == []  # not asked to probe kernels


def test_the_runs_of_a_kernel_probe_are_averaged_piece_by_piece():
    def run(scale: float) -> ProbedWork:
        return ProbedWork({"relu": [KernelSample((1000,), 0.0, 8e3, scale * 1e-5),
                                    KernelSample((9000,), 0.0, 7.2e4, scale * 9e-5)]},
                          outside=[(20.0, scale * 1e-4)], data={"digits": [(16.0, scale * 1e-3)]})
    mean = ProbedWork.mean([run(1.0), run(3.0)])
    assert [call.seconds for call in mean.calls["relu"]] == pytest.approx([2e-5, 1.8e-4])
    assert mean.calls["relu"][1].dims == (9000,) and mean.outside == [(20.0, pytest.approx(2e-4))]
    assert mean.data == {"digits": [(16.0, pytest.approx(2e-3))]} and mean.runs == 2
    # A run of other work (another version's probe) is left out; no runs, no probe.
    other = ProbedWork({"relu": [KernelSample((500,), 0.0, 4e3, 1e-5)]})
    assert ProbedWork.mean([run(1.0), other, run(3.0)]) == mean
    assert ProbedWork.mean([]) == ProbedWork()
    # A trace's meta keeps the runs; older traces kept the one run, as a record of its own.
    assert kernel_probe_of({"kernel_probes": [run(1.0).to_dict(), run(3.0).to_dict()]}) == mean
    assert kernel_probe_of({"kernel_probes": run(1.0).to_dict()}) == run(1.0)
    assert kernel_probe_of({}) is None


def test_only_the_move_beyond_the_probes_noise_is_corrected():
    assert beyond_noise(1.1, 0.12) == 1.0  # a 10 % move within a +-12 % probe: noise
    assert beyond_noise(1.5) == pytest.approx(1.5)  # probes without a spread: all of it
    # 3 % and 4 % spreads combine to 5 %: a 2x slower machine keeps its move on the
    # logarithm shrunk by 1 - (ln 1.05 / ln 2)^2 = 0.99505, 1.9932 of its 2.
    assert beyond_noise(2.0, 0.03, 0.04) == pytest.approx(1.99314, rel=1e-5)
    assert beyond_noise(0.5, 0.03, 0.04) == pytest.approx(1 / 1.99314, rel=1e-5)  # faster: shrunk alike
    assert beyond_noise(1.0, 0.05) == 1.0
    noisy = MachineState(60e9, 25e9, 2, 1 << 20, 375e-6, gemm_spread=0.2, copy_spread=0.3, allreduce_spread=0.1)
    drift = drift_between(THEN, noisy)
    assert drift.compute == pytest.approx(1.38193, rel=1e-5)  # 1.5 with +-20 %: ln 1.5 x (1 - 0.2022)
    assert drift.memory == 1.0  # 25 % faster copies, with +-30 % copies: not corrected
    assert drift.communication == pytest.approx(1.20014, rel=1e-5)  # 1.25 with +-10 %: ln 1.25 x (1 - 0.1824)
    assert drift.measured == pytest.approx(0.5) and drift.noise == pytest.approx(0.3)
    assert "repeat within +-30 %" in drift.describe()
    assert math.isclose(drift_between(THEN, THEN).compute, 1.0)


def test_a_probe_s_spread_is_the_standard_error_of_its_median():
    median, spread = median_and_spread([1.0, 2.0, 3.0, 4.0, 5.0])  # quartiles 1.5 and 4.5
    # sigma = 3 / 1.349; the median's standard error 1.2533 sigma / sqrt(5), over the median 3.
    assert median == 3.0 and spread == pytest.approx(1.2533 * (3 / 1.349) / math.sqrt(5) / 3)
    assert median_and_spread([2.0] * 11) == (2.0, 0.0)


def test_each_probed_kernel_moves_by_the_ratio_of_its_calls_total_times():
    # relu's calls took 30 + 90 us now against 20 + 60 predicted: 1.5x, weighted by time;
    # GEMM is left to the GEMM and copy rates, the update to the copy rates.
    calls = {"relu": [KernelSample((1000,), 0.0, 8e3, 30e-6), KernelSample((9000,), 0.0, 72e3, 90e-6)],
             "gemm": [KernelSample((64, 64, 64, 0, 0), 5e5, 5e4, 1e-4)],
             "sgd_update": [KernelSample((4096,), 1e4, 5e4, 1e-4)]}  # updates follow the copy probe
    before = {"relu": [20e-6, 60e-6], "gemm": [5e-5], "sgd_update": [5e-5]}
    assert kernel_ratios(calls, before, {}) == {"relu": pytest.approx(1.5)}
    # A ratio known within 20 % keeps ln 1.5 x (1 - (ln 1.2 / ln 1.5)^2) of its move on the
    # logarithm, 1.3819; a kernel without a time then is left out.
    assert kernel_ratios(calls, before, {"relu": 0.2})["relu"] == pytest.approx(1.38193, rel=1e-5)
    assert kernel_ratios(calls, {"gemm": [5e-5]}, {}) == {}
    drift = dataclasses.replace(drift_between(THEN, MachineState(60e9, 25e9)), kernels={"relu": 1.5})
    assert drift.scale("relu") == pytest.approx(1.5) and drift.scale("add") == pytest.approx(0.8)
    assert "1 kinds of work by the kernel probe's" in drift.describe()


def test_the_kernel_probe_is_compared_only_with_a_calibration_placed_as_it_runs():
    model = RateModel(0.0, 0.0, 1e-9)  # 1 ns a byte
    probed = ProbedWork({"relu": [KernelSample((1000,), 0.0, 8e3, 16e-6)]},
                        outside=[(20.0, 3e-4), (40.0, 9e-4)],  # 1.2 ms against 0.6 ms: 2x
                        data={"synthetic": [(16.0, 2e-4), (64.0, 8e-4)]})  # 1 ms against 2 ms: 0.5x
    placed = {"ranks": 2, "usable_cores": 2, "blas_threads": 1}
    calibration = Calibration(machine=placed, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={"relu": model}, allreduce_samples=[],
                              overhead=AffineCost(0.0, 10e-6), data_load={"synthetic": AffineCost(0.0, 25e-6)})
    assert probed_ratios(calibration, probed) == {"relu": pytest.approx(2.0), OUTSIDE_KERNELS: pytest.approx(2.0),
                                                  DATA_LOAD: pytest.approx(0.5)}
    assert ProbedWork.from_dict(probed.to_dict()) == probed  # as a trace's meta keeps it
    threaded = dataclasses.replace(calibration, machine={**placed, "ranks": 1, "blas_threads": 2})
    assert probed_ratios(threaded, probed) == {}
    on_gpu = dataclasses.replace(calibration, machine={**placed, "device": "gpu"})
    assert probed_ratios(on_gpu, probed) == {}  # the probe times the host's kernels


def test_like_for_like_takes_each_piece_s_median_over_the_calibration_s_probes():
    work = [((1000,), 1.5), ((9000,), 2.5)]
    references = [[((1000,), 1.0), ((9000,), 3.0)], [((1000,), 2.0), ((9000,), 2.0)], [((1000,), 3.0), ((9000,), 5.0)]]
    medians, noise = like_for_like(work, references)
    # Totals 4, 4 and 8, spread sigma (the standard deviation of their logarithms): one run
    # now is known within sigma, their median within 1.2533 sigma / sqrt(3).
    sigma = statistics.stdev([math.log(4), math.log(4), math.log(8)])
    assert medians == [2.0, 3.0]
    assert noise == pytest.approx(sigma * math.sqrt(1 + 1.2533 ** 2 / 3), rel=1e-4)
    # The mean of two runs now: sigma / sqrt(2) of its own.
    assert like_for_like(work, references, runs=2)[1] == pytest.approx(sigma * math.sqrt(1 / 2 + 1.2533 ** 2 / 3),
                                                                        rel=1e-4)
    assert like_for_like(work, references[:1]) == ([1.0, 3.0], 0.0)
    assert like_for_like(work, [*references, [((1000,), 1.0)]]) is None  # a reference of other work
    assert like_for_like(work, []) is None


def test_each_kind_of_work_moves_as_the_probe_s_whole_and_apart_beyond_its_spread():
    """The calibration probed twice, the second time 1.5x slower throughout (the machine's
    wander): shares 1/4, 1/4, 1/2 both times, totals 4 and 6 (median 5; a run against it
    is known within 38 %). Now the probe's work took 5, as a whole unmoved, and ReLU
    took 2/5 of it: 1.6x its share, while the add and the time outside the kernels fell
    to 0.8x theirs."""
    now = {"relu": [((1000,), 2.0)], "add": [((500,), 1.0)], "outside": [(20.0, 2.0)]}
    calm = {"relu": [((1000,), 1.0)], "add": [((500,), 1.0)], "outside": [(20.0, 2.0)]}
    slower = {kind: [(name, 1.5 * seconds) for name, seconds in pieces] for kind, pieces in calm.items()}
    moves = probe_moves(now, [calm, slower])
    assert moves == {"relu": pytest.approx(1.6), "add": pytest.approx(0.8), "outside": pytest.approx(0.8)}
    # Twice as slow as a whole, shares unmoved: every kind 2x, its move shrunk by the noise
    # of a run against the median of two totals of spread ln(1.5) / sqrt(2).
    doubled = {kind: [(name, 2.5 * seconds) for name, seconds in pieces] for kind, pieces in calm.items()}
    noise = math.log(1.5) / math.sqrt(2) * math.sqrt(1 + 1.2533 ** 2 / 2)
    shrunk = math.exp(math.log(2.0) * (1 - (math.log1p(noise) / math.log(2.0)) ** 2))
    assert probe_moves(doubled, [calm, slower]) == {kind: pytest.approx(shrunk, rel=1e-4) for kind in calm}
    # References whose ReLU took 1/4 and 2/5 of their work: a share within that spread moved as the whole.
    assert probe_moves(now, [calm, now])["relu"] == probe_moves(now, [calm, now])["add"]
    # A kind some reference timed at other sizes is left out; without references, everything.
    other = {**calm, "relu": [((2000,), 1.0)]}
    assert set(probe_moves(now, [calm, other])) == {"add", "outside"}
    assert probe_moves(now, []) == {}


def test_the_kernel_probe_is_set_against_the_calibration_s_own_runs_of_it():
    """The model predicts the probe's ReLU at 8 us, the calibration's own probe took 16 us, as
    now: against the models the ReLU moved 2x, like for like it did not move. The update,
    left to the copy rates against the models, is set like for like too."""
    probed = ProbedWork({"relu": [KernelSample((1000,), 0.0, 8e3, 16e-6)],
                         "sgd_update": [KernelSample((4096,), 1.6e4, 8e4, 9e-6)]},
                        outside=[(20.0, 3e-4), (40.0, 9e-4)])
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2, "blas_threads": 1}, peak_flops=1e11,
                              memory_bandwidth=1e10, kernel_models={"relu": RateModel(0.0, 0.0, 1e-9)},
                              allreduce_samples=[], overhead=AffineCost(0.0, 10e-6))
    assert probed_ratios(calibration, probed) == {"relu": pytest.approx(2.0), OUTSIDE_KERNELS: pytest.approx(2.0)}
    own = dataclasses.replace(calibration, kernel_probes=[probed, probed])
    assert probed_ratios(own, probed) == {"relu": pytest.approx(1.0), "sgd_update": pytest.approx(1.0),
                                          OUTSIDE_KERNELS: pytest.approx(1.0)}
    assert Calibration.from_dict(own.to_dict()).kernel_probes == own.kernel_probes
    # Merged with an older file whose probe lost the ReLU's calls (its code changed since):
    # the ReLU moves as the newer file's probes say, the rest as all of them do.
    older = ProbedWork({"sgd_update": probed.calls["sgd_update"]}, outside=probed.outside)
    merged = dataclasses.replace(calibration, kernel_probes=[probed, probed, older, older])
    assert probed_ratios(merged, probed) == {"relu": pytest.approx(1.0), "sgd_update": pytest.approx(1.0),
                                             OUTSIDE_KERNELS: pytest.approx(1.0)}
    # Products of 1 ms and 3 ms in the calibration's probes (both runs alike: no noise) took
    # 1.5 ms and 4.5 ms now: they moved 1.5x as a whole, at the peak and off it alike.
    products = [KernelSample((64, 64, 64, 0, 0), 2.25e7, 1e5, 1e-3),
                KernelSample((8, 512, 512, 0, 0), 2.7e8, 1e6, 3e-3)]
    gemm_then = dataclasses.replace(own, kernel_probes=[ProbedWork({"gemm": products})] * 2)
    now_gemm = ProbedWork({"gemm": [dataclasses.replace(call, seconds=1.5 * call.seconds)
                                    for call in products]})
    assert probed_gemm_ratio(gemm_then, now_gemm) == pytest.approx(1.5)
    assert probed_gemm_ratio(gemm_then, ProbedWork({"relu": probed.calls["relu"]})) is None  # no product timed


def test_the_kernel_probe_is_set_against_the_calibration_s_runs_whose_ranks_ran_as_its_own():
    """The calibration's probes that met as a job's ranks do timed the update at 2 ms, as the
    run's, which met; an older file's, its ranks apart, at 1 ms. Like for like the update
    did not move; against the older runs alone it moved 2x, and the validation warns."""
    def probe(seconds: float, meeting_ranks: int) -> ProbedWork:
        return ProbedWork({"sgd_update": [KernelSample((2 << 20,), 4e6, 4e7, seconds)],
                           "relu": [KernelSample((1000,), 0.0, 8e3, 10e-6)]}, outside=[(20.0, 3e-4)],
                          meeting_ranks=meeting_ranks)
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2, "blas_threads": 1}, peak_flops=1e11,
                              memory_bandwidth=1e10, kernel_models={}, allreduce_samples=[], machine_state=THEN,
                              kernel_probes=[probe(1e-3, 0), probe(2e-3, 2), probe(1e-3, 0), probe(2e-3, 2)])
    now = probe(2e-3, 2)
    assert probed_ratios(calibration, now)["sgd_update"] == pytest.approx(1.0)
    apart = dataclasses.replace(calibration, kernel_probes=[probe(1e-3, 0)] * 2)
    assert probed_ratios(apart, now)["sgd_update"] == pytest.approx(2.0)
    assert probed_ratios(apart, probe(1e-3, 0))["sgd_update"] == pytest.approx(1.0)  # an older run's, apart too

    def warned(calibration: Calibration, probed: ProbedWork) -> bool:
        machine = adjusted_machine(CalibratedMachine(calibration, None), now=THEN, probed=probed)
        return any("ran their ranks apart" in line for line in machine.warnings(["sgd_update"]))
    assert warned(apart, now) and not warned(calibration, now) and not warned(apart, probe(1e-3, 0))
    assert ProbedWork.from_dict(now.to_dict()).meeting_ranks == 2
    assert ProbedWork.from_dict({"calls": {}}).meeting_ranks == 0  # a record from before it was kept


def test_a_probe_whose_ranks_met_sets_its_updates_against_the_calibration_s_models():
    """The calibration's samples of the updates ran at 1 ns a byte; its own probes, which met,
    timed the probe's update at 2 ms, as now. Now the probe's ranks, meeting, take 2 ms
    where the model gives 1: the updates moved 2x, as a job's ranks updating together do.
    A probe whose ranks ran apart sets them against the calibration's probes (no move)."""
    def probe(meeting_ranks: int) -> ProbedWork:
        return ProbedWork({"sgd_update": [KernelSample((1 << 20,), 2e6, 1e6, 2e-3)],
                           "relu": [KernelSample((1000,), 0.0, 8e3, 10e-6)]}, outside=[(20.0, 3e-4)],
                          meeting_ranks=meeting_ranks)
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2, "blas_threads": 1}, peak_flops=1e11,
                              memory_bandwidth=1e10, kernel_models={"sgd_update": RateModel(0.0, 0.0, 1e-9)},
                              allreduce_samples=[], kernel_probes=[probe(2), probe(2), probe(0), probe(0)])
    assert probed_ratios(calibration, probe(2))["sgd_update"] == pytest.approx(2.0)
    assert probed_ratios(calibration, probe(2))["relu"] == pytest.approx(1.0)  # like for like, as before
    assert probed_ratios(calibration, probe(0))["sgd_update"] == pytest.approx(1.0)


def test_a_call_beyond_the_largest_sampled_batch_takes_time_in_proportion():
    model = RateModel(5e-6, 0.0, 1e-9)  # 5 us a call and 1 ns a byte
    samples = [KernelSample((n,), 0.0, 8.0 * n, 5e-6 + 8e-9 * n) for n in (100, 1000)]
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={"relu": model}, allreduce_samples=[],
                              kernel_samples={"relu": samples})
    inside = KernelCost(Stage.FP, "relu", 0.0, 8e3, (1000,))
    assert calibration.kernel_seconds("relu", inside) == pytest.approx(5e-6 + 8e-6)
    # Three times the largest batch: three calls' time, overheads included.
    beyond = KernelCost(Stage.FP, "relu", 0.0, 24e3, (3000,))
    assert calibration.kernel_seconds("relu", beyond) == pytest.approx(3 * (5e-6 + 8e-6))
