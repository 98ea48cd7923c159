"""The benchmarks' timing helpers, and smoke runs of the multi-rank benchmarks (no timing asserted beyond
the verdict the heterogeneous benchmark computes itself)."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from mpi import REPO, run

BENCHMARKS = os.path.join(REPO, "benchmarks")
sys.path.insert(0, BENCHMARKS)

from core_speed import longest  # noqa: E402
from emulated_cluster import between_runs, summary_row  # noqa: E402
from heterogeneous import verdict_of  # noqa: E402
from host_kernels import NUMPY_VERSIONS  # noqa: E402
from oversubscription import compute_bound  # noqa: E402
from probe_tracking import log_fit, spread_left, window_means  # noqa: E402
from validation_accuracy import Config, steps_to_trace  # noqa: E402

from pydtnn_lite.perfmodel.modelling.machines import calibrated_machine  # noqa: E402

from allreduce_model import benchmark_sizes  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
from common import interleave  # noqa: E402

GRADIENT_SYNC = os.path.join(BENCHMARKS, "gradient_sync.py")
BUCKET_PROGRESS = os.path.join(BENCHMARKS, "bucket_progress.py")


def run_script(script: str, *args: str, timeout: int = 300) -> str:
    """The standard output of ``python benchmarks/SCRIPT ARGS`` on one process, which must succeed."""
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *args], capture_output=True, text=True,
                            timeout=timeout, cwd=BENCHMARKS)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_interleave_rotates_the_order_and_drops_the_warmup():
    calls = []

    def variant(name):
        def call():
            calls.append(name)
            return {name: float(len(calls))}  # "seconds": this call's position among all calls
        return call

    samples = interleave([variant("a"), variant("b"), variant("c")], rounds=2, warmup=1,
                         before=lambda: calls.append("|"), combine=lambda timings: {k: -v for k, v in timings.items()})
    assert "".join(calls) == "|a|b|c" "|b|c|a" "|c|a|b"
    assert samples == {"b": [-8.0, -18.0], "c": [-10.0, -14.0], "a": [-12.0, -16.0]}


def test_a_slow_spell_lasts_from_its_first_slow_instant_to_the_next_fast_one():
    instants = [(float(at), []) for at in range(6)]
    assert longest(instants, [False, True, True, False, True, False]) == 2.0
    assert longest(instants, [False] * 6) == 0.0
    assert longest(instants, [False, False, False, False, True, True]) == 1.0  # until the last instant


def test_the_oversubscription_bound_lets_ranks_beyond_the_cores_take_turns():
    assert compute_bound(0.1, ranks=8, cores=2) == pytest.approx(0.4)  # four ranks a core, one after the other
    assert compute_bound(0.3, ranks=2, cores=2) == pytest.approx(0.3)  # a core each
    assert compute_bound(0.3, ranks=1, cores=2) == pytest.approx(0.3)  # an idle core buys a one-thread rank nothing
    # 8 ranks of 8 images (0.1 s a step) against 2 of 32 (0.3 s): compute alone allows 0.75x.
    assert compute_bound(0.3, 2, 2) / compute_bound(0.1, 8, 2) == pytest.approx(0.75)


def test_the_emulated_cluster_summary_gives_medians_and_how_far_runs_differ():
    def run(step: float, comm: float, strategy: str = "mpi") -> dict:
        parts = {"posts": 0.2 * comm, "tests": 0.3 * comm, "wait": 0.5 * comm}
        return {"measured_step_seconds": step, "predicted_step_seconds": 0.2, "step_error": 0.2 / step - 1,
                "raw_step_error": 0.0, "measured_stage_seconds": {"COMM": comm},
                "predicted_stage_seconds": {"COMM": 0.05}, "stage_errors": {"COMM": 0.05 / comm - 1},
                "comm_parts": {part: {"measured_seconds": seconds, "predicted_seconds": 0.01, "error": 0.0}
                               for part, seconds in parts.items()},
                "strategy": strategy}
    # Two runs 10 % apart: each misses the other by 10/110 or 10/100.
    assert between_runs([0.11, 0.10]) == pytest.approx(100 * (0.1 / 1.1 + 0.1) / 2)
    assert between_runs([0.3, 0.2, 0.1]) == pytest.approx(100 * (1 / 2 + 2 / 3) / 2)  # of 1/3, 1/2, 1/2, 2/3, 1, 2
    runs = [run(0.25, 0.05), run(0.2, 0.04), run(0.16, 0.1)]
    row = summary_row(runs, "vgg11", "mpi", 2.0, with_between=True)
    assert row[:10] == ["vgg11", "mpi", "2", "200", "200", "+0.0", "+0.0", "50", "50", "+0.0"]
    # COMM's parts: each part's median over the runs, measured (predicted).
    assert row[10] == "10.0 (10.0), 15.0 (10.0), 25.0 (10.0)"
    assert row[11:] == [f"{between_runs([0.25, 0.2, 0.16]):.1f}", f"{between_runs([0.05, 0.04, 0.1]):.1f}"]
    assert summary_row([dict(runs[0], comm_parts={})], "vgg11", "mpi", 2.0, False)[10] == "-"  # none modelled
    assert summary_row(runs[:1], "vgg11", "mpi", 2.0, with_between=False)[5] == "-20.0"
    # A strategy that --comm auto (or a fallback) chose is named beside the one asked for.
    assert summary_row([run(0.2, 0.05, "hierarchical")], "vgg11", "auto", 1.0, False)[1] == "auto: hierarchical"


def test_probe_tracking_fits_the_network_s_logarithm_on_each_probe_s():
    # The network 4x slower where the probe is 2x slower: slope 2, a perfect correlation.
    assert log_fit([1.0, 2.0, 4.0], [3.0, 12.0, 48.0]) == pytest.approx((2.0, 1.0))
    assert log_fit([1.0, 2.0, 4.0], [3.0, 0.75, 0.1875]) == pytest.approx((-2.0, -1.0))  # moving against it
    slope, correlation = log_fit([1.0, 1.0], [1.0, 2.0])  # a probe that stood still says nothing
    assert math.isnan(slope) and math.isnan(correlation)


def test_probe_tracking_means_windows_and_measures_what_a_correction_leaves():
    assert window_means([1.0, 4.0, 16.0, 4.0], 2) == pytest.approx([2.0, 8.0, 8.0])  # geometric means
    assert window_means([3.0, 5.0], 1) == pytest.approx([3.0, 5.0])
    # A probe that moved as the network did takes all of its spread away, ...
    assert spread_left([1.0, 2.0, 4.0], [3.0, 6.0, 12.0]) == pytest.approx(0.0)
    # ... one that stood still leaves it whole, one that moved against it doubles it.
    assert spread_left([5.0, 5.0, 5.0], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert spread_left([4.0, 2.0, 1.0], [3.0, 6.0, 12.0]) == pytest.approx(2.0)
    assert math.isnan(spread_left([1.0, 2.0], [3.0, 3.0]))  # a network that did not move


def test_probe_tracking_prints_every_round_and_each_probe_s_fit_on_two_ranks():
    result = run(2, [os.path.join(BENCHMARKS, "probe_tracking.py"), "--model", "mlp", "--batch-size", "4",
                     "--rounds", "2", "--window", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.findall(r"^round (\d):", result.stdout, re.MULTILINE) == ["1", "2"]  # rank 0 alone prints
    figure = r"(-?[\d.]+|nan)"  # two rounds: a correlation is +-1 or, where either stood still, nan
    for probe in ("core GEMM", "core copy", "kernel probe", "kernel probe GEMMs"):
        assert re.search(rf"^{probe} +[\d.]+( +{figure}){{4}}$", result.stdout, re.MULTILINE), result.stdout
    # Kernel by kernel, trained over sampled: every kernel of the step, the first update (which
    # follows other work, sampled apart from the rest) among them, largest share first; the
    # shares add up to the whole network.
    table = result.stdout.split("by kernel:")[1]
    rows = re.findall(r"^([a-z_0-9]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", table, re.MULTILINE)
    kernels = {name: float(share) for name, share, *_ in rows}
    assert {"gemm", "sgd_update", "relu", "bias_add", "softmax_cross_entropy"} <= set(kernels), result.stdout
    assert list(kernels.values()) == sorted(kernels.values(), reverse=True)
    assert sum(kernels.values()) == pytest.approx(100.0, abs=0.1 * len(kernels))
    assert all(float(low) <= float(median) <= float(high) for _, _, median, low, high in rows)
    # The first layer's update, 1.6 M of MLP's 1.7 M parameters streamed from memory: a large
    # share, which a sum of the other updates alone (a few % of the step) would miss.
    assert kernels["sgd_update"] > 10.0, result.stdout


def test_cold_start_times_every_condition_against_back_to_back():
    stdout = run_script("cold_start.py", "--rounds", "2", "--busy-ms", "1", timeout=120)
    timed = re.findall(r"^ +(back to back|after GEMMs|after a busy wait|after sleep) +[\d.]+ us +([\d.]+)x",
                       stdout, re.MULTILINE)
    conditions = ["back to back", "after GEMMs", "after a busy wait", "after sleep"]
    assert [condition for condition, _ in timed] == conditions * 2, stdout  # the Numba and NumPy updates
    assert [ratio for condition, ratio in timed if condition == "back to back"] == ["1.0", "1.0"]


def test_first_run_times_a_job_with_the_cache_empty_and_again_with_it_filled():
    stdout = run_script("first_run.py", "--model", "mlp", "--batch-size", "8", "--steps", "1", "--ranks", "2",
                        timeout=300)
    row = re.search(r"^2 +([\d.]+) +([\d.]+) +(-?[\d.]+) +([\d.]+)x$", stdout, re.MULTILINE)
    assert row, stdout
    first, filled, compiling, _ = map(float, row.groups())
    assert first > 0 and filled > 0 and compiling == pytest.approx(first - filled, abs=0.11)


def test_gradient_sync_prints_every_part_on_two_ranks():
    result = run(2, [GRADIENT_SYNC, "--model", "lenet", "--batch-size", "8", "--repeats", "2", "--steps", "2",
                     "--bucket-mb", "0.01", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    for title in ("1. sync:", "2. buckets:", "3. overlap:", "4. scaling:", "hidden from step times"):
        assert result.stdout.count(title) == 1, result.stdout  # rank 0 alone prints


def test_gradient_sync_needs_two_ranks():
    result = run(1, [GRADIENT_SYNC, "--model", "lenet"])
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["gradient_sync: needs at least 2 ranks: "
                                                  "mpiexec -n 2 python benchmarks/gradient_sync.py"]


def test_validation_accuracy_sets_the_model_against_the_runs_themselves(tmp_path):
    calibration = os.path.join(REPO, "calibration", "dev-2core.json")
    kept = tmp_path / "traces"
    command = [sys.executable, os.path.join(BENCHMARKS, "validation_accuracy.py"), "--calibration", calibration,
               "--configs", "lenet:16:digits", "--runs", "2", "--steps", "2", "--min-seconds", "0", "--keep", str(kept)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 ranks, 2 steps traced" in result.stdout
    for label in ("model, run 1", "model, run 2", "model, median", "between runs, median", "split-half, median",
                  "model / between runs"):
        assert result.stdout.count(label) == 1, result.stdout
    # The summary names the run farthest off, not only the runs' median.
    run_errors = re.findall(r"model, run \d\s+([+-]\d+\.\d)", result.stdout)
    farthest = max(run_errors, key=lambda error: abs(float(error)))
    assert f"of a single run {farthest} % (lenet b16 x2)" in result.stdout, result.stdout
    assert sorted(os.listdir(kept)) == ["lenet-16-2-0", "lenet-16-2-1"]
    assert (kept / "lenet-16-2-0" / "events.csv").is_file()
    assert re.search(r"calibrated 2\d{3}-\d\d-\d\d \d\d:\d\d, [\d.]+ to [\d.]+ h before the runs", result.stdout)
    # The kept runs validated again, training nothing, give the same figures.
    revalidated = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "validation_accuracy.py"), "--calibration",
                                  calibration, "--traces", str(kept)], capture_output=True, text=True, timeout=120)
    assert revalidated.returncode == 0, revalidated.stderr[-3000:]
    assert f"runs kept in {kept}" in revalidated.stdout

    def figures(stdout: str) -> list[str]:
        return [line for line in stdout.splitlines() if line.strip().startswith(("model, run", "between runs"))]
    assert figures(revalidated.stdout) == figures(result.stdout) and len(figures(result.stdout)) == 3
    empty = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "validation_accuracy.py"), "--calibration",
                            calibration, "--traces", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert empty.returncode != 0 and "holds no traced run" in empty.stderr
    training = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "validation_accuracy.py"), "--calibration",
                               calibration, "--traces", str(kept), "--runs", "4", "--matrix"],
                              capture_output=True, text=True, timeout=60)
    assert training.returncode != 0 and "--runs, --matrix would be ignored" in training.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and f"--keep {kept} exists" in again.stderr
    bad = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "validation_accuracy.py"), "--calibration",
                          calibration, "--configs", "lenet"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "model:batch[:dataset]" in bad.stderr


def test_validation_runs_of_small_models_trace_a_second_of_steps():
    machine = calibrated_machine(os.path.join(REPO, "calibration", "dev-2core.json"))
    assert steps_to_trace(Config.parse("vgg16:64", 2), machine, 4, 1.0) == 4  # 4 steps take over a second
    lenet = steps_to_trace(Config.parse("lenet:64", 2), machine, 4, 1.0)
    assert lenet > 20 and steps_to_trace(Config.parse("lenet:64", 2), machine, 4, 2.0) in (2 * lenet - 1, 2 * lenet)


def test_heterogeneous_benchmark_balances_a_slowed_rank():
    """Rank 1, made 6x slower, gets fewer samples than the fast rank 0, and the benchmark's own verdict is that
    the step got shorter. (Loading a synthetic image is most of a LeNet sample's work, so the slowdown dominates
    the step and balancing it is a large effect: about 60 %. The verdict compares medians of a few steps of
    some 30 ms, and the suite runs another test file's jobs beside this one: at the default 3x the effect,
    14-55 % under such bursts, was sometimes lost in them.)"""
    result = run(2, [os.path.join(BENCHMARKS, "heterogeneous.py"), "--model", "lenet", "--dataset", "synthetic",
                     "--batch-size", "32", "--steps", "6", "--slowdown", "6"])
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "equal shares [16, 16]:" in result.stdout
    fast, slow = map(int, re.search(r"^balanced shares \[(\d+), (\d+)\]:", result.stdout, re.MULTILINE).groups())
    assert fast + slow == 32 and fast > slow, result.stdout
    assert result.stdout.splitlines()[-1] == "verdict: faster"


def test_heterogeneous_benchmark_verdict():
    """The benchmark fails unless balancing took samples off the slow rank and shortened the step."""
    assert verdict_of([16, 16], [24, 8], 1, plain=0.3, tuned=0.2) == "faster"
    assert verdict_of([16, 16], [24, 8], 1, plain=0.2, tuned=0.3) == "slower"
    assert verdict_of([16, 16], [16, 16], 1, plain=0.3, tuned=0.2) == "unmoved"
    assert verdict_of([16, 16], [8, 24], 1, plain=0.3, tuned=0.2) == "unmoved"


def test_against_pytorch_prints_the_throughput_ratio():
    pytest.importorskip("torch")
    stdout = run_script("against_pytorch.py", "--model", "lenet", "--dataset", "digits", "--batch-size", "8",
                        "--steps", "1", "--threads", "1")
    assert "x PyTorch's throughput" in stdout
    assert re.search(r"float32 GEMM peak [\d.]+ GFLOP/s \(the fastest of \d+ products between the steps\); "
                     r"step [\d.]+ GFLOP: pydtnn_lite [\d.]+ GFLOP/s \([\d.]+% of the peak\), "
                     r"PyTorch [\d.]+ GFLOP/s \([\d.]+%\)", stdout), stdout


def test_against_pytorch_runs_graph_models():
    """The residual adds and dense concatenations translate too (a model PyTorch could not run
    would fail the step)."""
    pytest.importorskip("torch")
    stdout = run_script("against_pytorch.py", "--model", "resnet18", "--dataset", "synthetic", "--batch-size", "4",
                        "--steps", "1", "--threads", "1")
    assert "x PyTorch's throughput" in stdout
    # Its 3x3 blocks run by Winograd: fewer FLOPs executed than the textbook counts.
    assert re.search(r"pydtnn_lite's kernels execute [\d.]+ of the [\d.]+ GFLOP \(Winograd convolutions\)",
                     stdout), stdout


def test_host_kernels_benchmark_times_both_kernel_sets():
    stdout = run_script("host_kernels.py", "--model", "resnet18", "--dataset", "digits", "--batch-size", "4",
                        "--steps", "1", "--threads", "1", "--optimizer", "adam")
    assert re.search(r"numpy  kernels: step [\d.]+ ms, of which the replaced kernels [\d.]+ ms", stdout)
    assert re.search(r"speed-up: step [\d.]+x, replaced kernels [\d.]+x", stdout)
    assert "cpu, 1 threads, adam" in stdout and f"{len(NUMPY_VERSIONS)} kernel entries replaced" in stdout


def test_host_kernels_benchmark_replaces_the_entries_it_is_given():
    stdout = run_script("host_kernels.py", "--model", "resnet18", "--dataset", "digits", "--batch-size", "4",
                        "--steps", "1", "--threads", "1", "--kernels", "batchnorm")
    assert "; 7 kernel entries replaced" in stdout  # the seven batch-norm entries
    unknown = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "host_kernels.py"), "--kernels", "bn"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no kernel entry starts with bn" in unknown.stderr


def test_pool_relu_order_benchmark_times_both_orders():
    stdout = run_script("pool_relu_order.py", "--model", "lenet", "--dataset", "digits", "--batch-size", "8",
                        "--steps", "1", "--threads", "1")
    for order in ("relu first", "pool first"):
        assert re.search(rf"{order}: step [\d.]+ ms, of which ReLU and max pooling [\d.]+ ms", stdout)
    assert re.search(r"pool first against relu first: step [\d.]+x, ReLU and max pooling [\d.]+x", stdout)


def test_conv_forms_benchmark_times_winograd_against_the_patch_matrix():
    stdout = run_script("conv_forms.py", "--model", "vgg11", "--batch-size", "2", "--steps", "1", "--threads", "1")
    for form in ("patch matrix", "winograd"):
        assert re.search(rf"{form}: step [\d.]+ ms, of which convolution kernels [\d.]+ ms", stdout)
    assert re.search(r"winograd against patch matrix: step [\d.]+x, convolution kernels [\d.]+x", stdout)


def test_conv_forms_benchmark_times_single_layers_in_both_forms():
    stdout = run_script("conv_forms.py", "--layers", "8:4:4", "8:8:4", "--batch-size", "2", "--steps", "1",
                        "--threads", "1")
    assert re.search(r"8:4:4: winograd [\d.]+ ms, direct [\d.]+ ms, [\d.]+x", stdout), stdout
    assert re.search(r"8:8:4: winograd [\d.]+ ms, transposed [\d.]+ ms, [\d.]+x", stdout), stdout


def test_allreduce_benchmark_times_between_the_samples():
    mib = 1 << 20
    # The geometric middles of neighbouring samples (whole KiB), and the earlier 1.5 .. 96 MiB within range.
    assert benchmark_sizes([mib // 2, mib, 4 * mib, 16 * mib], mib) == {
        mib: "in", 3 * mib // 2: "out", 2 * mib: "out", 4 * mib: "in", 6 * mib: "out", 8 * mib: "out",
        16 * mib: "in"}


def test_bucket_progress_prints_each_bucket_size_in_both_patterns_on_two_ranks():
    result = run(2, [BUCKET_PROGRESS, "--mb", "0.25", "1", "--kernels", "3", "--gemm", "64", "--repeats", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("2 ranks, 3 kernels") == 1, result.stdout  # rank 0 alone prints
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] in (["0.25"], ["1"])]
    assert [row[0] for row in rows] == ["0.25", "1"], result.stdout
    for row in rows:  # blocking ms, then each pattern's ms with its ratio to the blocking Allreduce
        assert float(row[1]) > 0 and all(cell.startswith("(") and cell.endswith("x)") for cell in row[3:8:2]), row


def test_bucket_progress_needs_two_ranks():
    result = run(1, [BUCKET_PROGRESS])
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["bucket_progress: needs at least 2 ranks: "
                                                  "mpiexec -n 2 python benchmarks/bucket_progress.py"]


def test_allreduce_benchmark_prints_both_models_on_two_ranks():
    result = run(2, [os.path.join(BENCHMARKS, "allreduce_model.py"), "--min-mib", "128",
                     "--calibration", os.path.join(REPO, "calibration", "dev-2core.json")])
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ("interpolate, the file's samples: in:", "interpolate, this run's samples: out:",
                 "fit, the file's samples: in:", "fit, this run's samples: out:"):
        assert result.stdout.count(line) == 1, result.stdout  # rank 0 alone prints


def test_cache_residency_prints_each_kernel_resident_after_a_wait_and_evicted_on_two_ranks():
    result = run(2, [os.path.join(BENCHMARKS, "cache_residency.py"), "--mib", "1", "2", "--calls", "2",
                     "--rounds", "1", "--idle-ms", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resident ms  after 1 ms  evicted ms" in result.stdout, result.stdout
    rows = re.findall(r"^(\w+_?\w*) +([\d.]+)" + r" +([\d.]+)" * 5 + "$", result.stdout, re.MULTILINE)
    assert [(kernel, mib) for kernel, mib, *_ in rows] == [(kernel, mib) for kernel in ("allreduce", "sgd_update",
                                                                                        "adam_update")
                                                           for mib in ("1", "2")], result.stdout
    for _, _, resident, waited, evicted, resident_ratio, waited_ratio in rows:  # rank 0 alone prints
        assert float(resident) > 0 and float(waited) > 0 and float(evicted) > 0
        # Each ratio is of the times the row prints.
        assert float(resident_ratio) == pytest.approx(float(resident) / float(evicted), rel=0.02, abs=0.01)
        assert float(waited_ratio) == pytest.approx(float(waited) / float(evicted), rel=0.02, abs=0.01)


def test_device_allreduce_checks_the_sums_and_skips_strategies_the_ranks_cannot_run():
    result = run(2, [os.path.join(BENCHMARKS, "device_allreduce.py"), "--device", "cpu", "--mib", "0.0625", "1",
                     "--repeats", "1", "--strategies", "mpi", "nccl"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nccl: skipped (--comm nccl needs every rank on a GPU" in result.stdout
    assert "2 rank(s), devices cpu, cpu; sums checked" in result.stdout
    rows = re.findall(r"^(0.0625|1) +(bare mpi4py \(host\)|mpi) +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+x$", result.stdout,
                      re.MULTILINE)
    assert len(rows) == 4, result.stdout  # two sizes, the bare Allreduce and mpi, printed by rank 0 alone


def test_gpu_checks_refuses_an_unknown_stage_before_running_any(tmp_path):
    result = subprocess.run(["bash", os.path.join(BENCHMARKS, "gpu_checks.sh"), str(tmp_path), "tests", "profiles"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("gpu_checks: unknown stage 'profiles': choose from environment tests pytorch "
                                     "profile nccl mixed calibrate model")
    assert not (tmp_path / "tests.log").exists()


def test_the_synthetic_data_benchmark_sets_the_loader_against_per_sample_generators():
    stdout = run_script("synthetic_data.py", "--batch-size", "4", "--rounds", "1")
    lines = stdout.splitlines()
    assert len(lines) == 4 and all("x the generators' speed" in line for line in lines)
    assert "generator per sample" in lines[1] and "(1.00x" in lines[1]


def test_the_prefetch_benchmark_reads_a_cifar10_binary_set_both_ways():
    stdout = run_script("prefetch.py", "--model", "lenet", "--batch-size", "16", "--steps", "3", "--rounds", "1",
                        "--records-per-file", "64", "--threads", "1")
    assert "320 CIFAR-10 binary records" in stdout
    for label in ("in the step (--prefetch 0): step", "read ahead (--prefetch 2): step"):
        assert stdout.count(label) == 1, stdout
