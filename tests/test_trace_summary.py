"""The trace summary's figures against hand-computed ones on records made up for the purpose."""
from __future__ import annotations

import pytest

from pydtnn_lite.tracing.records import COMMUNICATION, COMPUTE, TRAIN, KernelRecord, StepRecord
from pydtnn_lite.tracing.summary import rank_rows, report, statistics


def record(rank: int, step: int, kernel: str, duration: float, thread: str = COMPUTE, flops: float = 0.0,
           nbytes: float = 0.0) -> KernelRecord:
    stage = "COMM" if thread == COMMUNICATION else "FP"
    return KernelRecord(rank, TRAIN, step, stage, 0, "conv1", "conv", kernel, thread, 0.0, duration, "", flops,
                        nbytes)


def test_statistics_of_a_kernel_are_the_hand_computed_ones():
    durations = [0.001, 0.002, 0.003, 0.004, 0.010]
    stats = statistics([record(0, 1, "gemm", d, flops=2e6, nbytes=1e6) for d in durations])
    assert stats["calls"] == 5 and stats["total_s"] == pytest.approx(0.020)
    assert stats["mean_s"] == pytest.approx(0.004) and stats["median_s"] == pytest.approx(0.003)
    assert (stats["min_s"], stats["max_s"]) == (0.001, 0.010)
    # 90th percentile, linear between order statistics: 0.004 + 0.6 * (0.010 - 0.004)
    assert stats["p90_s"] == pytest.approx(0.0076)
    assert stats["gflops_per_s"] == pytest.approx(5 * 2e6 / 0.020 / 1e9)
    assert stats["gbytes_per_s"] == pytest.approx(5 * 1e6 / 0.020 / 1e9)


def test_the_straggler_is_the_rank_that_waits_least_and_the_others_wait_for_it():
    # Two steps on three ranks; rank 1 computes longest, so it waits least in communication.
    waits = {0: (0.030, 0.020), 1: (0.005, 0.005), 2: (0.015, 0.025)}
    computes = {0: 0.050, 1: 0.080, 2: 0.060}
    records, steps = [], []
    for rank in range(3):
        for step in (1, 2):
            records.append(record(rank, step, "gemm", computes[rank]))
            records.append(record(rank, step, "allreduce_wait", waits[rank][step - 1], COMMUNICATION))
            steps.append(StepRecord(rank, step, 0.0, 0.1 + 0.01 * rank, 8))
    rows = {row["rank"]: row for row in rank_rows(records, steps)}
    assert rows[0]["communication_s"] == pytest.approx(0.025)
    assert rows[1]["communication_s"] == pytest.approx(0.005)
    assert rows[0]["straggler_wait_s"] == pytest.approx(0.020)
    assert rows[2]["straggler_wait_s"] == pytest.approx(0.015)
    assert rows[1]["straggler_wait_s"] == 0.0
    assert rows[2]["compute_s"] == pytest.approx(0.060) and rows[2]["step_s"] == pytest.approx(0.12)
    text = report(records, steps, {"model": "m"})
    assert "rank 1 is the straggler: the others wait up to 20.00 ms per step for it" in text
