"""Drift scaling and the affine fits of the time outside kernels, against hand-computed cases."""
from __future__ import annotations

import math

import pytest

from pydtnn_lite.perfmodel.measuring.machine_state import median_and_spread
from pydtnn_lite.perfmodel.modelling.drift import Drift, MachineState, beyond_noise, drift_between
from pydtnn_lite.perfmodel.modelling.outside_kernels import fit_affine

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


def test_a_probe_travels_through_its_dictionary():
    assert MachineState.from_dict(THEN.to_dict()) == THEN
    # A probe recorded before spreads were has none: its moves are all taken as real.
    old = {key: value for key, value in THEN.to_dict().items() if not key.endswith("_spread")}
    assert MachineState.from_dict(old) == THEN and THEN.gemm_spread == 0.0
    assert Drift().describe().startswith("GEMM x1.000")


def test_the_affine_fit_recovers_a_fixed_and_a_per_unit_cost():
    samples = [(calls, 2e-4 + 15e-6 * calls) for calls in (20, 40, 80, 160)]
    model = fit_affine(samples)
    assert model.fixed == pytest.approx(2e-4, rel=1e-6) and model.per_unit == pytest.approx(15e-6, rel=1e-6)
    assert model.seconds(100) == pytest.approx(2e-4 + 15e-4)
    # A negative intercept is not a cost: the fit keeps the per-unit term alone.
    assert fit_affine([(10, 1e-4), (100, 2e-3)]).fixed == 0.0


def test_the_probes_at_a_run_s_start_and_end_are_averaged():
    end = MachineState(30e9, 10e9, 2, 1 << 20, 500e-6)
    mean = THEN.mean_with(end)
    assert (mean.gemm_flops, mean.copy_bytes_per_second, mean.allreduce_seconds) == pytest.approx((60e9, 15e9, 400e-6))
    assert THEN.mean_with(MachineState(30e9, 10e9)).allreduce_seconds is None
    # Their spread is how far they differ (90 and 30 around 60: +-50 %), or their own if larger.
    assert (mean.gemm_spread, mean.copy_spread, mean.allreduce_spread) == pytest.approx((0.5, 1 / 3, 0.25))
    steady = MachineState(100e9, 20e9, gemm_spread=0.08).mean_with(MachineState(102e9, 20e9, gemm_spread=0.04))
    assert steady.gemm_spread == pytest.approx(0.06) and steady.copy_spread == 0.0


def test_only_the_move_beyond_the_probes_noise_is_corrected():
    assert beyond_noise(1.1, 0.12) == 1.0  # a 10 % move within a +-12 % probe: noise
    assert beyond_noise(1.5) == pytest.approx(1.5)  # probes without a spread: all of it
    # 3 % and 4 % spreads combine to 5 %; a 2x slower machine keeps 2 / 1.05 of its move.
    assert beyond_noise(2.0, 0.03, 0.04) == pytest.approx(2.0 / 1.05)
    assert beyond_noise(0.5, 0.03, 0.04) == pytest.approx(0.5 * 1.05)  # faster: shrunk alike
    noisy = MachineState(60e9, 25e9, 2, 1 << 20, 375e-6, gemm_spread=0.2, copy_spread=0.3, allreduce_spread=0.1)
    drift = drift_between(THEN, noisy)
    assert drift.compute == pytest.approx(1.5 / 1.2)
    assert drift.memory == 1.0  # 25 % faster copies, with +-30 % copies: not corrected
    assert drift.communication == pytest.approx(1.25 / 1.1)
    assert drift.measured == pytest.approx(0.5) and drift.noise == pytest.approx(0.3)
    assert "repeat within +-30 %" in drift.describe()
    assert math.isclose(drift_between(THEN, THEN).compute, 1.0)


def test_a_probe_s_spread_is_half_its_interquartile_range_over_its_median():
    median, spread = median_and_spread([1.0, 2.0, 3.0, 4.0, 5.0])  # quartiles 1.5 and 4.5
    assert median == 3.0 and spread == pytest.approx(0.5)
    assert median_and_spread([2.0] * 11) == (2.0, 0.0)
