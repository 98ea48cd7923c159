"""The model where the job is not the calibration's: more ranks than cores, and Allreduce timed at those counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pydtnn_lite import predict as predict_command
from pydtnn_lite import runtime
from pydtnn_lite.perfmodel.measuring import kernel_probe, machine_state
from pydtnn_lite.perfmodel.measuring.process_counts import missing_counts, run_child
from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_CALIBRATION = os.path.join(REPO, "calibration", "dev-2core.json")


def predict(*flags: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "pydtnn_lite.predict", "--model", "vgg11", "--dataset",
                             "synthetic", "--batch-size", "64", "--calibration", REFERENCE_CALIBRATION, "--json",
                             *flags], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_ranks_beyond_the_cores_share_them_and_the_machine_name_says_so():
    crowded = predict("--procs", "8")  # one node of the calibration's 2 cores: 4 ranks per core
    spread = predict("--procs", "8", "--ranks-per-node", "2")  # four nodes of 2 ranks: a core each
    for stage in ("FP", "BP", "WU"):
        assert crowded["stage_seconds"][stage] == pytest.approx(4 * spread["stage_seconds"][stage], rel=1e-9)
    assert "4 threads per core" in crowded["machine"] and "per core" not in spread["machine"]
    assert crowded["step_seconds"] > spread["step_seconds"]


def test_placement_flags_need_a_calibration_and_a_possible_placement():
    result = subprocess.run([sys.executable, "-m", "pydtnn_lite.predict", "--preset", "altec", "--ranks-per-node",
                             "2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "need --calibration FILE" in result.stderr
    result = subprocess.run([sys.executable, "-m", "pydtnn_lite.predict", "--calibration", REFERENCE_CALIBRATION,
                             "--procs", "2", "--ranks-per-node", "4"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--ranks-per-node 4 is more than the job's 2 ranks" in result.stderr


def test_the_reference_calibration_timed_allreduce_up_to_four_ranks_per_core():
    with open(REFERENCE_CALIBRATION, encoding="utf-8") as handle:
        document = json.load(handle)
    counts = {int(sample[0]) for sample in document["allreduce_samples"]}
    cores = document["machine"]["usable_cores"]
    assert counts == set(range(2, 4 * cores + 1))
    # The CPU time of the reductions at the counts beyond the calibration's own, of the same calls.
    cpu = {(int(p), n): seconds for p, n, seconds in document["allreduce_cpu_samples"]}
    durations = {(int(p), n): seconds for p, n, seconds in document["allreduce_samples"] if p > 2}
    assert cpu.keys() == durations.keys()
    assert all(0 < cpu[key] <= 1.5 * durations[key] for key in cpu)
    assert missing_counts(2, cores) == list(range(3, 4 * cores + 1))


def test_a_child_job_times_allreduce_on_more_ranks_than_the_caller_has():
    samples = run_child(3, [1024, 65536])
    assert [(ranks, nbytes) for ranks, nbytes, _, _ in samples] == [(3, 1024), (3, 65536)]
    assert all(0 < seconds < 1 and 0 < cpu < 1 for _, _, seconds, cpu in samples)


def test_predict_probe_corrects_for_the_machine_s_state_now():
    document = predict("--procs", "2", "--probe")
    assert "drift every-core GEMM x" in document["machine"] and document["step_seconds"] > 0
    # The kernel probe's networks time the kernels and the loading of the synthetic set too.
    assert "kinds of work by the kernel probe's" in document["machine"]


def test_predict_probe_keeps_freed_memory_before_it_probes_as_calibrating_does(monkeypatch):
    """A fresh process maps each large temporary anew and faults its pages in: the kernel
    probe's first run in one took im2col 3x and ReLU 4x the time of the calibration's runs,
    which keep freed memory (2026-12-07). ``predict --probe`` keeps it too, before probing."""
    calls: list[str] = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(machine_state, "probe_machine_state", lambda comm: calls.append("state"))
    monkeypatch.setattr(kernel_probe, "probe_kernels", lambda comm, dataset: calls.append("kernels"))
    args = predict_command.build_parser().parse_args(["--model", "vgg11", "--calibration", REFERENCE_CALIBRATION,
                                                      "--probe"])
    predict_command.placed(calibrated_machine(REFERENCE_CALIBRATION), args, 2)
    assert calls == ["keep", "state", "kernels"]
