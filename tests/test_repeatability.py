"""Runs of one configuration set beside each other (perfmodel/modelling/repeatability.py), on hand-computed cases."""
from __future__ import annotations

import json

import pytest

from pydtnn_lite.errors import UserError
from pydtnn_lite.perfmodel.modelling.repeatability import (
    between,
    check_same_configuration,
    comparison_summary,
    comparison_table,
    model_and_floor,
    parts_model_and_floor,
)
from pydtnn_lite.perfmodel.modelling.validation import Comparison, KernelComparison, Validation


def run(fp: tuple[float, float], step: float, comm: float, predicted_step: float = 10.0) -> Validation:
    """A run of two FP kernels measured ``fp`` (each predicted 2.0 s), one WU and one BP kernel of
    1 s each, predicted exactly, its step and COMM measured as given."""
    kernels = [KernelComparison(0, "conv", "FP", "gemm", 0, fp[0], 2.0, 0.0),
               KernelComparison(1, "conv", "FP", "im2col", 0, fp[1], 2.0, 0.0),
               KernelComparison(0, "conv", "BP", "gemm", 0, 1.0, 1.0, 0.0),
               KernelComparison(0, "conv", "WU", "sgd_update", 0, 1.0, 1.0, 0.0)]
    stages = [Comparison(name, 1.0, 1.0, 0.0, 0.0, 0.0) for name in ("DATA", "FP", "BP", "WU")]
    stages.append(Comparison("COMM", comm, 1.0, half_difference=0.0))
    return Validation(kernels, stages, Comparison("step", step, predicted_step, half_difference=0.0), 0)


def test_between_two_runs_one_run_s_measurement_stands_in_for_the_prediction():
    first, second = run((1.0, 3.0), 10.0, 2.0), run((1.5, 2.5), 12.0, 1.0)
    figures = between(first, second)
    assert figures["step error"] == pytest.approx(0.2)  # (12 - 10) / 10
    assert figures["WRE FP"] == pytest.approx(0.25)  # mean(|1.5 - 1|, |2.5 - 3|) / mean(1, 3)
    assert figures["WRE BP"] == figures["WRE WU"] == 0.0
    assert figures["COMM error"] == pytest.approx(-0.5)  # (1 - 2) / 2
    assert between(second, first)["step error"] == pytest.approx(-2 / 12)


def test_the_floor_is_the_median_over_every_ordered_pair_and_the_model_over_the_runs():
    runs = [run((2.0, 2.0), 10.0, 1.0), run((2.0, 2.0), 11.0, 1.0), run((2.0, 2.0), 12.0, 1.0)]
    model, floor = model_and_floor(runs)
    # The model predicts 10 s: errors 0, -1/11 and -2/12, whose median magnitude is 1/11.
    assert model["step error"] == pytest.approx(1 / 11) and model["WRE FP"] == 0.0
    # Pairs, in magnitude: 1/10, 2/10, 1/11, 1/11, 2/12, 1/12; the median of six, (1/11 + 1/10) / 2.
    assert floor["step error"] == pytest.approx((1 / 11 + 1 / 10) / 2)
    table = comparison_table(runs)
    assert "model, run 3" in table and "between runs, median" in table and "model / between runs" in table


def test_runs_of_different_configurations_are_refused_with_the_key_that_differs():
    same = {"model": "vgg11", "global_batch": 64, "ranks": 2}
    check_same_configuration(["a", "b"], [same, dict(same)])
    with pytest.raises(UserError, match="b trained ranks 4 where a trained 2"):
        check_same_configuration(["a", "b"], [same, {**same, "ranks": 4}])


def test_the_json_summary_has_no_nan_where_a_stage_has_no_kernels():
    runs = [run((2.0, 2.0), 10.0, 1.0), run((2.0, 2.0), 12.0, 1.0)]
    for validation in runs:  # no update: a stage without kernels has no WRE
        validation.kernels = [k for k in validation.kernels if k.stage != "WU"]
        validation.stages = [Comparison("WU", 0.0, 0.0) if s.name == "WU" else s for s in validation.stages]
    summary = comparison_summary(runs)
    assert summary["between_runs_median"]["wre_wu"] is None and summary["model_median"]["wre_wu"] is None
    assert summary["between_runs_median"]["step_error"] == pytest.approx((0.2 + 2 / 12) / 2)
    json.dumps(summary, allow_nan=False)


def test_comm_s_parts_are_set_beside_how_far_the_runs_parts_differ():
    """Over a network each run's posts, tests and wait are compared with the model's, and the
    runs' parts with each other: posts 2 and 3 ms against 4 predicted are off by 50-100 %
    where the runs differ by 1/3 to 1/2, a miss no run's noise explains."""
    def with_parts(posts: float, tests: float, wait: float) -> Validation:
        validation = run((2.0, 2.0), 10.0, posts + tests + wait)
        validation.comm_parts = [Comparison("posts", posts, 4.0), Comparison("tests", tests, 1.0),
                                 Comparison("wait", wait, 2.0)]
        return validation
    runs = [with_parts(2.0, 1.0, 2.0), with_parts(3.0, 1.0, 2.0)]
    parts = parts_model_and_floor(runs)
    assert parts is not None
    model, floor = parts
    assert model == pytest.approx({"posts error": (1.0 + 1 / 3) / 2, "tests error": 0.0, "wait error": 0.0})
    assert floor["posts error"] == pytest.approx((0.5 + 1 / 3) / 2) and floor["tests error"] == 0.0
    table = comparison_table(runs)
    assert "COMM's parts" in table and "posts error" in table
    summary = comparison_summary(runs)
    assert summary["comm_parts"]["model_median"]["posts_error"] == pytest.approx((1.0 + 1 / 3) / 2)
    # A part no run measured (no test took any time) has no error: null in JSON, not NaN.
    untested = [with_parts(2.0, 0.0, 2.0), with_parts(3.0, 0.0, 2.0)]
    assert comparison_summary(untested)["comm_parts"]["model_median"]["tests_error"] is None
    json.dumps(comparison_summary(untested), allow_nan=False)
    # One run without parts (one node): no part is compared.
    runs[1].comm_parts = []
    assert parts_model_and_floor(runs) is None and comparison_summary(runs)["comm_parts"] == {}
    assert "COMM's parts" not in comparison_table(runs)
