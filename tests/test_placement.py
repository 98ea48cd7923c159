"""Placement arithmetic against hand-computed cases."""
from __future__ import annotations

import dataclasses

import pytest

from pydtnn_lite.costs import KERNEL_REVISIONS, THREADED_FROM_ELEMENTS, KernelCost, Stage
from pydtnn_lite.perfmodel.measuring.data_loading import read_ahead_share
from pydtnn_lite.perfmodel.modelling.calibration import Calibration
from pydtnn_lite.perfmodel.modelling.machines import CalibratedMachine, adjusted_machine, allreduce_models
from pydtnn_lite.perfmodel.modelling.placement import (
    Placement,
    ThreadScaling,
    kernel_handoff,
    kernel_scale,
    thread_scaling_gap,
)
from pydtnn_lite.perfmodel.modelling.regression import RateModel

CALIBRATED = Placement(ranks=2, ranks_per_node=2, cores_per_node=2, threads_per_rank=1)


def test_a_job_placed_as_the_calibration_runs_at_its_speed():
    for kernel in ("gemm", "im2col", "relu"):
        assert kernel_scale(kernel, CALIBRATED, CALIBRATED) == 1.0


@pytest.mark.parametrize("ranks, scale", [(4, 2.0), (8, 4.0), (3, 1.5)])
def test_more_ranks_than_cores_time_share_every_kernel(ranks, scale):
    job = Placement(ranks, ranks, 2, 1)
    assert job.oversubscribed and job.time_sharing == scale
    assert kernel_scale("gemm", job, CALIBRATED) == pytest.approx(scale)
    assert kernel_scale("batchnorm_sums", job, CALIBRATED) == pytest.approx(scale)


def test_one_rank_with_every_core_speeds_up_only_the_threaded_kernels():
    job = Placement(1, 1, 2, 2)
    assert not job.oversubscribed
    for threaded in ("gemm", "im2col", "batchnorm_sums", "sgd_update", "relu_grad_sum"):
        assert kernel_scale(threaded, job, CALIBRATED) == pytest.approx(0.5)
    for single in ("softmax_cross_entropy", "dropout_mask"):
        assert kernel_scale(single, job, CALIBRATED) == 1.0
    threads_from = THREADED_FROM_ELEMENTS["concat"]  # a concatenation copies on the threads from this size
    assert kernel_scale("concat", job, CALIBRATED, dims=(threads_from,)) == pytest.approx(0.5)
    assert kernel_scale("concat", job, CALIBRATED, dims=(threads_from - 1,)) == 1.0


def test_the_shortfall_of_threads_measured_at_every_core_is_prorated_below_it():
    scaling = ThreadScaling(threads=4, gemm=1.3, memory=2.5)
    assert scaling.factor("gemm", 1) == 1.0 and scaling.factor("relu", 1) == 1.0
    assert scaling.factor("gemm", 4) == pytest.approx(1.3) and scaling.factor("relu", 4) == pytest.approx(2.5)
    assert scaling.factor("gemm", 2) == pytest.approx(1.1)  # a third of the way from 1 thread to 4
    assert scaling.factor("batchnorm_sums", 3) == pytest.approx(2.0)  # two thirds of 1.5
    assert scaling.factor("relu", 8) == pytest.approx(2.5)  # held beyond the threads measured
    assert ThreadScaling.from_dict(scaling.to_dict()) == scaling


def test_one_rank_with_every_core_runs_its_threaded_kernels_as_the_calibration_measured_threads():
    job, scaling = Placement(1, 1, 2, 2), ThreadScaling(threads=2, gemm=1.1, memory=2.0)
    assert kernel_scale("gemm", job, CALIBRATED, scaling) == pytest.approx(0.55)  # half the time, 10 % more
    for memory_bound in ("relu", "batchnorm_sums", "winograd_input", "sgd_update"):
        assert kernel_scale(memory_bound, job, CALIBRATED, scaling) == pytest.approx(1.0)  # no gain at all
    assert kernel_scale("dropout_mask", job, CALIBRATED, scaling) == 1.0  # one thread either way
    assert kernel_scale("relu", CALIBRATED, CALIBRATED, scaling) == 1.0  # the calibration's own placement
    # A calibration of one rank on both cores predicting a rank per core: the other way round.
    assert kernel_scale("relu", CALIBRATED, job, scaling) == pytest.approx(2.0 / 2.0)
    assert kernel_scale("gemm", CALIBRATED, job, scaling) == pytest.approx(2.0 / 1.1)


def test_a_gemm_scales_with_threads_as_the_measured_shapes_nearest_it():
    small = {(128, 256, 128, 0, 0): 1.8, (128, 256, 256, 0, 0): 1.7, (64, 256, 128, 0, 0): 1.9,
             (128, 128, 128, 0, 0): 1.8, (128, 256, 128, 1, 0): 5.0}  # the last timed in a slow moment
    large = {(2048, 128, 1152, 0, 0): 1.04, (4096, 128, 1152, 0, 0): 1.02, (2048, 256, 1152, 0, 0): 1.06,
             (2048, 128, 2304, 0, 0): 1.05, (1024, 128, 1152, 0, 0): 1.03}
    scaling = ThreadScaling(threads=2, gemm=1.1, memory=2.0, gemm_shapes={**small, **large})
    job = Placement(1, 1, 2, 2)
    # The median of the five nearest: one shape timed in a slow moment moves nothing.
    assert kernel_scale("gemm", job, CALIBRATED, scaling, (128, 256, 128, 0, 0)) == pytest.approx(0.9)  # 1.8 / 2
    assert kernel_scale("gemm", job, CALIBRATED, scaling, (128, 256, 128, 1, 0)) == pytest.approx(0.9)
    assert kernel_scale("gemm", job, CALIBRATED, scaling, (2048, 128, 1152, 0, 0)) == pytest.approx(0.52)
    # Unmeasured shapes take their neighbours', by the sizes' logarithms.
    assert scaling.factor("gemm", 2, (96, 256, 192, 0, 0)) == pytest.approx(1.8)
    assert scaling.factor("gemm", 2, (8192, 128, 1152, 0, 1)) == pytest.approx(1.04)
    assert scaling.factor("gemm", 2) == pytest.approx(1.1)  # no shape given: the one GEMM's ratio
    assert scaling.factor("relu", 2, (128, 256, 128, 0, 0)) == pytest.approx(2.0)  # the loops keep theirs
    assert kernel_scale("gemm", CALIBRATED, CALIBRATED, scaling, (128, 256, 128, 0, 0)) == 1.0  # one thread
    assert ThreadScaling.from_dict(scaling.to_dict()) == scaling
    without = scaling.to_dict()
    del without["gemm_shapes"]  # a file from before the shapes were timed
    assert ThreadScaling.from_dict(without).factor("gemm", 2, (128, 256, 128, 0, 0)) == pytest.approx(1.1)


def test_the_parallel_loops_of_a_rank_of_several_threads_pay_the_hand_off_per_call():
    scaling = ThreadScaling(threads=2, gemm=1.1, memory=2.0, handoff=1e-4)
    one_process = Placement(1, 1, 2, 2)
    for loop in ("relu", "sgd_update", "batchnorm_sums", "winograd_input"):
        assert kernel_handoff(loop, one_process, CALIBRATED, scaling) == pytest.approx(1e-4)
        assert kernel_handoff(loop, CALIBRATED, CALIBRATED, scaling) == 0.0  # one thread: the loop in place
    assert kernel_handoff("gemm", one_process, CALIBRATED, scaling) == 0.0  # OpenBLAS's threads, in its samples
    assert kernel_handoff("dropout_mask", one_process, CALIBRATED, scaling) == 0.0  # not a parallel loop
    large, small = (THREADED_FROM_ELEMENTS["concat"],), (THREADED_FROM_ELEMENTS["concat"] - 1,)
    assert kernel_handoff("concat", one_process, CALIBRATED, scaling, large) == pytest.approx(1e-4)
    assert kernel_handoff("concat", one_process, CALIBRATED, scaling, small) == 0.0  # NumPy's copy, in place
    assert kernel_handoff("relu", one_process, CALIBRATED, None) == 0.0  # a file without thread scaling
    assert kernel_handoff("relu", one_process, CALIBRATED, ThreadScaling(2, 1.1, 2.0)) == 0.0  # nor a hand-off
    # Two 2-thread ranks on 2 cores: each wake-up waits behind the other rank's threads.
    assert kernel_handoff("relu", Placement(2, 2, 2, 2), CALIBRATED, scaling) == pytest.approx(2e-4)
    # A calibration whose ranks ran several threads held the hand-offs in its samples.
    assert kernel_handoff("relu", one_process, one_process, scaling) == 0.0
    assert ThreadScaling.from_dict(scaling.to_dict()) == scaling


def test_a_one_process_job_predicts_its_parallel_loops_with_their_hand_offs():
    """Kernels without a model take their roofline time (peak 1e11 FLOP/s, 1e10 B/s) on the
    calibration's one-thread ranks; one process on both cores halves it, the measured
    shortfall multiplies it back, and each parallel loop's call adds the hand-off."""
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={}, allreduce_samples=[],
                              thread_scaling=ThreadScaling(2, gemm=1.2, memory=2.0, handoff=1e-4))
    one_process = adjusted_machine(CalibratedMachine(calibration, None), Placement(1, 1, 2, 2))
    relu, gemm = KernelCost(Stage.FP, "relu", 0.0, 1e4), KernelCost(Stage.FP, "gemm", 1e8, 1e4)
    assert one_process.kernel_seconds("relu", relu) == pytest.approx(1e-6 * 0.5 * 2.0 + 1e-4)
    assert one_process.kernel_seconds("gemm", gemm) == pytest.approx(1e-3 * 0.5 * 1.2)
    assert adjusted_machine(CalibratedMachine(calibration, None)).kernel_seconds("relu", relu) == pytest.approx(1e-6)


def test_a_calibration_without_what_predicts_a_job_s_threads_says_so():
    one_process = Placement(1, 1, 2, 2)
    measured = ThreadScaling(2, gemm=1.1, memory=2.0, handoff=1e-4, gemm_shapes={(64, 64, 64, 0, 0): 1.3})
    assert thread_scaling_gap(one_process, CALIBRATED, measured) is None
    assert thread_scaling_gap(CALIBRATED, CALIBRATED, None) is None  # one-thread ranks, as calibrated
    assert thread_scaling_gap(one_process, one_process, None) is None  # calibrated on the same threads
    assert "no measure of how threads scale" in thread_scaling_gap(one_process, CALIBRATED, None)
    for older in (ThreadScaling(2, gemm=1.1, memory=2.0), ThreadScaling(2, 1.1, 2.0, handoff=1e-4)):
        assert "one GEMM ratio for every shape" in thread_scaling_gap(one_process, CALIBRATED, older)
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={}, allreduce_samples=[])
    machine = CalibratedMachine(calibration, None)
    assert adjusted_machine(machine, one_process).warnings([]) == [thread_scaling_gap(one_process, CALIBRATED, None)]
    assert adjusted_machine(machine).warnings([]) == []


def test_a_calibration_without_samples_of_a_job_s_kernels_says_so():
    model = RateModel(0.0, 0.0, 1e-9)
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={"gemm": model, "relu": model, "batchnorm_normalize": model},
                              allreduce_samples=[], kernel_revisions=dict(KERNEL_REVISIONS))
    # A fused kernel is predicted from its parts' models; a reduction from the Allreduce timings.
    assert calibration.unmodelled(["gemm", "relu", "allreduce", "batchnorm_relu_normalize"]) == []
    assert calibration.unmodelled(["winograd_input", "gemm", "batchnorm_relu_grad_sums", "winograd_input"]) == [
        "batchnorm_grad_sums", "relu_grad", "winograd_input"]
    machine = adjusted_machine(CalibratedMachine(calibration, None))
    [line] = machine.warnings(["gemm", "winograd_input"])
    assert "no samples of winograd_input" in line and "roofline" in line
    assert machine.warnings(["gemm", "relu"]) == []


def test_a_calibration_of_a_kernel_s_older_code_says_so():
    model = RateModel(0.0, 0.0, 1e-9)
    fused = {"relu": model, "batchnorm_relu_grad_input": model}
    older = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                        kernel_models=fused, allreduce_samples=[])
    assert KERNEL_REVISIONS["batchnorm_relu_grad_input"] > 1  # changed since its first version
    assert "relu" not in KERNEL_REVISIONS
    assert older.outdated(["relu", "batchnorm_relu_grad_input"]) == ["batchnorm_relu_grad_input"]
    [line] = adjusted_machine(CalibratedMachine(older, None)).warnings(["relu", "batchnorm_relu_grad_input"])
    assert "older code of batchnorm_relu_grad_input" in line and "calibrate again" in line
    current = dataclasses.replace(older, kernel_revisions=dict(KERNEL_REVISIONS))
    assert current.outdated(["relu", "batchnorm_relu_grad_input"]) == []
    # A kernel the calibration has no model of is the unmodelled warning's, not this one's.
    assert older.outdated(["batchnorm_relu_grad_sums"]) == []


def test_threads_beyond_the_cores_share_them():
    job = Placement(4, 2, 2, 2)  # two nodes, each 2 ranks x 2 threads on 2 cores
    assert job.nodes == 2 and job.time_sharing == 2.0 and job.blas_cores == 1.0
    assert kernel_scale("gemm", job, CALIBRATED) == 1.0  # two threads at half a core each
    assert kernel_scale("relu", job, CALIBRATED) == 1.0  # threaded as the GEMM
    assert kernel_scale("dropout_mask", job, CALIBRATED) == 2.0


def test_a_calibration_whose_ranks_outnumbered_its_cores_timed_its_kernels_unshared():
    crowded = Placement(4, 4, 2, 1)  # 4 ranks on 2 cores, as under an emulated 2 x 2 cluster
    assert kernel_scale("gemm", crowded, crowded) == 2.0 and kernel_scale("dropout_mask", crowded, crowded) == 2.0
    assert kernel_scale("gemm", CALIBRATED, crowded) == 1.0  # a job of one rank per core


def test_an_impossible_placement_is_refused():
    with pytest.raises(ValueError):
        Placement(2, 4, 2, 1)
    with pytest.raises(ValueError):
        Placement(2, 2, 0, 1)


@pytest.mark.parametrize("placement, share", [
    (Placement(2, 2, 2, 1), 1.0),  # every core runs a rank: the readers take their time from the ranks
    (Placement(1, 1, 2, 1), 0.0),  # a spare core reads ahead for free
    (Placement(2, 2, 3, 1), 0.5),  # one spare core for two readers
    (Placement(8, 8, 2, 1), 1.0),  # oversubscribed: no idle core at all
    (Placement(1, 1, 4, 2), 0.0),
])
def test_reading_ahead_costs_the_step_the_share_of_readers_without_an_idle_core(placement, share):
    assert placement.background_share == pytest.approx(share)


def test_a_reduction_among_ranks_that_share_cores_costs_its_cpu_time_on_their_share():
    """While other ranks compute, a reduction among ranks that time-share the cores costs
    the step its CPU time times the ranks per core; with a core per rank, or without CPU
    samples, its duration."""
    durations = [(p, n, 0.01 * p) for p in (2, 4, 8) for n in (1e6, 4e6)]
    cpu = [(p, n, 0.002) for p in (4, 8) for n in (1e6, 4e6)]
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={}, allreduce_samples=durations, allreduce_cpu_samples=cpu,
                              allreduce_ranks=2)
    duration_model = allreduce_models(durations)["interpolate"]
    machine = CalibratedMachine(calibration, duration_model, allreduce_cpu=allreduce_models(cpu)["interpolate"])
    assert adjusted_machine(machine, Placement(8, 8, 2, 1)).allreduce_during_compute_seconds(1e6, 8) == \
        pytest.approx(0.002 * 4)
    assert adjusted_machine(machine, Placement(4, 4, 2, 1)).allreduce_during_compute_seconds(4e6, 4) == \
        pytest.approx(0.002 * 2)
    assert adjusted_machine(machine).allreduce_during_compute_seconds(1e6, 2) == pytest.approx(0.02)
    without_cpu = CalibratedMachine(calibration, duration_model)
    assert adjusted_machine(without_cpu, Placement(8, 8, 2, 1)).allreduce_during_compute_seconds(1e6, 8) == \
        pytest.approx(0.08)


def test_a_step_pays_the_measured_share_of_reading_ahead_where_no_core_is_idle():
    # Reading in the step: 30 ms a step, of which 10 ms reading; reading ahead: 24 ms, so 4 of the 10 ms paid.
    samples = [(0.030, 0.024, 0.010), (0.030, 0.026, 0.010), (0.030, 0.020, 0.010)]
    assert read_ahead_share(samples) == pytest.approx(0.4)
    assert read_ahead_share([(0.030, 0.045, 0.010)]) == 1.0 and read_ahead_share([(0.030, 0.010, 0.010)]) == 0.0
    assert read_ahead_share([]) == 1.0
    calibration = Calibration(machine={"ranks": 2, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                              kernel_models={}, allreduce_samples=[], read_ahead_samples=samples,
                              read_ahead_share=0.4)
    assert calibration.read_ahead_seconds(0.01, Placement(2, 2, 2, 1)) == pytest.approx(0.004)
    assert calibration.read_ahead_seconds(0.01, Placement(8, 8, 2, 1)) == pytest.approx(0.004)
    assert calibration.read_ahead_seconds(0.01, Placement(2, 2, 3, 1)) == pytest.approx(0.002)  # one spare core
    assert calibration.read_ahead_seconds(0.01, Placement(1, 1, 2, 1)) == 0.0
    spare = Calibration(machine={"ranks": 1, "usable_cores": 2}, peak_flops=1e11, memory_bandwidth=1e10,
                        kernel_models={}, allreduce_samples=[], read_ahead_share=0.0)
    assert spare.read_ahead_seconds(0.01, Placement(2, 2, 2, 1)) == pytest.approx(0.01)  # it measured no share
