"""Mutation testing: deliberate, realistic bugs, one at a time, against the tests that should catch them.

    python tests/mutation/run.py                  # every mutation
    python tests/mutation/run.py --list           # names, files and the tests named for each
    python tests/mutation/run.py --only NAME ...  # some of them

The repository's ``pydtnn_lite/``, ``models/`` and ``tests/`` (with ``calibration/`` and
``benchmarks/``, which some tests read, and ``pyproject.toml`` for pytest's settings) are
copied into a temporary directory. The named tests first run there unmutated and must pass.
Then each mutation replaces one exact source snippet in the copy (found exactly once, or
the mutation is BROKEN: the source moved on and the list needs updating), runs its named
tests against the copy, and puts the file back. ``PYTHONPATH`` puts the copy first, for
pytest and for every process the tests spawn (``mpiexec`` passes the environment on), and
the runner checks that both import the copy's package before it starts.

A mutation is KILLED when one of its tests fails, SURVIVED when they all pass (a behaviour
no test guards: strengthen or add the test that should catch it), TIMEOUT past
``--timeout`` seconds. The run ends with ``killed K of N`` and exits non-zero unless every
mutation was killed. Not collected by pytest: the name does not start with ``test_`` and
it holds no test functions. See docs/testing.md.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from pydtnn_lite.textable import format_table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COPIED = ("pydtnn_lite", "models", "tests", "calibration", "benchmarks", "pyproject.toml")


@dataclass(frozen=True)
class Mutation:
    """Replace ``find`` (present exactly once in ``path``) with ``replace``; one of ``tests`` must fail."""

    name: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]


GRADIENTS = "tests/test_gradients.py"
DISTRIBUTED = "tests/test_distributed.py::test_ranks_equal_one_process"
CPU_KERNELS = "tests/test_cpu_kernels.py"  # the Numba kernels against these NumPy references
RESUME = "tests/test_cli.py::test_resumed_run_equals_uninterrupted_run"

MUTATIONS = [
    # ---------------------------------------------------------------- layers and kernels
    Mutation("col2im-swaps-window-axes", "pydtnn_lite/kernels/conv.py",
             "+= patches[:, :, :, i, j, :]", "+= patches[:, :, :, j, i, :]",
             (f"{GRADIENTS}::test_conv2d", CPU_KERNELS)),
    Mutation("im2col-ignores-the-column-stride", "pydtnn_lite/kernels/conv.py",
             "(s0, s1 * stride, s2 * stride, s1, s2, s3)", "(s0, s1 * stride, s2, s1, s2, s3)",
             ("tests/test_reference.py::test_conv_matches_direct_convolution", CPU_KERNELS)),
    Mutation("maxpool-grad-swaps-window-position", "pydtnn_lite/kernels/pooling.py",
             "_position(grad, k // kw, k % kw, stride, ho, wo)[...] += xp.where(argmax == k, grad_out, 0)",
             "_position(grad, k % kw, k // kw, stride, ho, wo)[...] += xp.where(argmax == k, grad_out, 0)",
             (f"{GRADIENTS}::test_maxpool", CPU_KERNELS)),
    Mutation("maxpool-keeps-the-last-maximum", "pydtnn_lite/kernels/pooling.py",
             "larger = candidate > out", "larger = candidate >= out",
             ("tests/test_reference.py::test_maxpool_gradient_goes_to_the_first_maximum_of_a_tie", CPU_KERNELS)),
    Mutation("avgpool-grad-divides-by-one-side", "pydtnn_lite/kernels/pooling.py",
             "share = grad_out * (1.0 / (kh * kw))", "share = grad_out * (1.0 / kh)",
             (f"{GRADIENTS}::test_avgpool", CPU_KERNELS)),
    Mutation("batchnorm-grad-drops-the-variance-term", "pydtnn_lite/kernels/normalization.py",
             "(grad_out - mean_grad - normalized(x, mean, inv_std) * mean_grad_hat)", "(grad_out - mean_grad)",
             (f"{GRADIENTS}::test_batchnorm_on_maps_and_vectors", CPU_KERNELS)),
    # The Numba host kernels, which the layers run on NumPy arrays.
    Mutation("numba-col2im-overwrites-overlapping-windows", "pydtnn_lite/kernels/cpu.py",
             "grad[image, y, z, ch] += cols[row, start + ch]", "grad[image, y, z, ch] = cols[row, start + ch]",
             (f"{GRADIENTS}::test_conv2d",)),
    Mutation("numba-batchnorm-sums-drop-the-between-block-term", "pydtnn_lite/kernels/cpu.py",
             "squares.sum(axis=0) + counts @ (means - mean) ** 2", "squares.sum(axis=0)",
             (CPU_KERNELS,)),
    Mutation("batchnorm-sums-forget-the-shift", "pydtnn_lite/kernels/normalization.py",
             "offset = sums[0] / rows - shift if rows", "offset = sums[0] / rows if rows",
             ("tests/test_reference.py::test_float32_batchnorm_keeps_the_variance_of_inputs_far_from_zero",
              "tests/test_reference.py::test_batchnorm_sums_of_uneven_shares_give_the_whole_batch_statistics")),
    Mutation("numba-relu-grad-ignores-the-activation", "pydtnn_lite/kernels/cpu.py",
             "out[i] = grad[i] * (activated[i] > 0)", "out[i] = grad[i]",
             (f"{GRADIENTS}::test_relu",)),
    Mutation("numba-sgd-nesterov-is-plain-momentum", "pydtnn_lite/kernels/cpu.py",
             "param[i] -= lr * (g + momentum * v if nesterov else v)", "param[i] -= lr * v",
             ("tests/test_optimizers.py",)),
    Mutation("numba-maxpool-keeps-the-last-maximum", "pydtnn_lite/kernels/cpu.py",
             "if value > out[image, r, q, ch]:", "if value >= out[image, r, q, ch]:",
             ("tests/test_reference.py::test_maxpool_gradient_goes_to_the_first_maximum_of_a_tie",)),
    Mutation("numba-pool-gradients-ignore-the-stride", "pydtnn_lite/kernels/cpu.py",
             "if start < 0 or start % stride:", "if start < 0:",
             (f"{GRADIENTS}::test_maxpool", f"{GRADIENTS}::test_avgpool")),
    Mutation("numba-adam-second-moment-not-stored", "pydtnn_lite/kernels/cpu.py",
             "second[i] = v", "second[i] = second[i]",
             ("tests/test_optimizers.py",)),
    Mutation("batchnorm-running-variance-biased", "pydtnn_lite/layers/batchnorm.py",
             "unbiased = var * (self.rows / max(self.rows - 1, 1))", "unbiased = var",
             ("tests/test_reference.py::test_dense_and_batchnorm_match_formulas",)),
    Mutation("dense-bias-grad-is-a-mean", "pydtnn_lite/kernels/blas.py",
             "return grad_out.sum(axis=0, out=out)", "return grad_out.mean(axis=0, out=out)",
             (f"{GRADIENTS}::test_dense",)),
    Mutation("residual-gradients-overwrite-instead-of-add", "pydtnn_lite/network.py",
             "grad = kernels.add((pending[source], grad))", "grad = kernels.add((grad, 0 * pending[source]))",
             (f"{GRADIENTS}::test_residual_and_dense_connectivity",)),
    # ---------------------------------------------------------------- optimizers and schedule
    Mutation("sgd-nesterov-is-plain-momentum", "pydtnn_lite/kernels/update.py",
             "step = grad + momentum * velocity if nesterov else velocity", "step = velocity",
             ("tests/test_optimizers.py", CPU_KERNELS)),
    Mutation("sgd-weight-decay-sign", "pydtnn_lite/kernels/update.py",
             "grad = grad + weight_decay * param\n    if momentum:",
             "grad = grad - weight_decay * param\n    if momentum:",
             ("tests/test_optimizers.py", CPU_KERNELS)),
    Mutation("adam-bias-correction-without-sqrt", "pydtnn_lite/kernels/update.py",
             "(1.0 - beta2 ** step) ** 0.5", "(1.0 - beta2 ** step)",
             ("tests/test_optimizers.py", CPU_KERNELS)),
    Mutation("warmup-first-step-has-zero-lr", "pydtnn_lite/optim/schedule.py",
             "lr *= (step + 1) / warmup_steps", "lr *= step / warmup_steps",
             ("tests/test_training.py::test_schedule_warmup_and_decay",)),
    # ---------------------------------------------------------------- communication
    Mutation("buckets-started-in-forward-layer-order", "pydtnn_lite/comm/gradients.py",
             "self.buckets = plan_buckets(network, bucket_mb * MIB, first_bucket_bytes)",
             "self.buckets = plan_buckets(network, bucket_mb * MIB, first_bucket_bytes)[::-1]",
             ("tests/test_overlap.py",)),
    Mutation("buckets-start-one-layer-late", "pydtnn_lite/comm/gradients.py",
             "self.buckets[self.next_bucket].first_layer >= layer_index",
             "self.buckets[self.next_bucket].first_layer > layer_index + 1",
             ("tests/test_overlap.py",)),
    Mutation("overlap-skips-a-bucket", "pydtnn_lite/comm/gradients.py",
             "self.next_bucket += 1", "self.next_bucket += 2 if self.next_bucket == 1 else 1",
             ("tests/test_overlap.py", DISTRIBUTED)),
    Mutation("blocking-sync-skips-the-last-bucket", "pydtnn_lite/comm/gradients.py",
             "for bucket in self.buckets[self.next_bucket:]:", "for bucket in self.buckets[self.next_bucket:-1]:",
             (DISTRIBUTED,)),
    Mutation("overlap-never-tests-requests", "pydtnn_lite/comm/gradients.py",
             "self.pending = [request for request in self.pending if not request.test()]",
             "self.pending = list(self.pending)",
             ("tests/test_overlap.py",)),
    Mutation("evaluate-does-not-sum-across-ranks", "pydtnn_lite/training/trainer.py",
             "loss, correct = self.comm.allreduce_host([loss, correct])",
             "loss, correct = loss * self.comm.size, correct * self.comm.size",
             (DISTRIBUTED,)),
    Mutation("batchnorm-statistics-of-the-local-batch", "pydtnn_lite/layers/batchnorm.py",
             "sums = ctx.sum_across_ranks(shifted_sums(local, int(np.prod(x.shape[:-1])), shift))",
             "sums = shifted_sums(local, int(np.prod(x.shape[:-1])), shift) * 1",
             (DISTRIBUTED,)),
    Mutation("dropout-mask-ignores-the-rank-offset", "pydtnn_lite/kernels/elementwise.py",
             "uniform[offset:offset + x.shape[0]]", "uniform[:x.shape[0]]",
             (DISTRIBUTED,)),
    Mutation("two-level-skips-the-broadcast", "pydtnn_lite/comm/two_level.py",
             "            self.inner.broadcast(array, 0)\n", "            pass\n",
             ("tests/test_distributed.py::test_host_staged_and_two_level_reductions_equal_one_process",)),
    Mutation("gpu-side-deals-every-cpu-rank-to-one-gpu", "pydtnn_lite/comm/strategy.py",
             "leader = min(same_node, key=lambda g: (dealt[g], g))", "leader = min(same_node)",
             ("tests/test_comm_strategy.py::test_gpu_side_deals_cpu_ranks_to_gpu_ranks_of_their_node_first",)),
    # ---------------------------------------------------------------- checkpoints
    Mutation("loading-drops-batchnorm-buffers", "pydtnn_lite/network.py",
             "            target[...] = self.backend.asarray(value)\n",
             "            if \"running_\" not in name:\n                target[...] = self.backend.asarray(value)\n",
             (f"{RESUME}[2-flags3-none]",)),
    Mutation("checkpoint-saves-step-zero", "pydtnn_lite/training/checkpoint.py",
             "arrays[\"meta/global_step\"] = np.array(global_step)", "arrays[\"meta/global_step\"] = np.array(0)",
             (f"{RESUME}[1-flags0-none]",)),
    Mutation("optimizer-step-count-not-restored", "pydtnn_lite/optim/base.py",
             "self.steps = int(state[\"steps\"])", "self.steps = 0",
             (f"{RESUME}[2-flags3-none]",)),
    Mutation("checkpoint-copies-instead-of-renaming", "pydtnn_lite/training/checkpoint.py",
             "os.replace(temporary, target)", "open(target, \"wb\").write(open(temporary, \"rb\").read())",
             ("tests/test_checkpoint.py",)),
    # ---------------------------------------------------------------- running jobs
    Mutation("accumulation-restarts-at-every-micro-batch", "pydtnn_lite/training/trainer.py",
             "elif index == 0:", "elif index >= 0:",
             ("tests/test_accumulate.py::test_accumulating_k_batches_equals_a_k_times_larger_batch",)),
    Mutation("clipping-scales-by-the-square-of-the-norm", "pydtnn_lite/optim/clipping.py",
             "max_norm / norm if norm", "max_norm / norm ** 2 if norm",
             ("tests/test_schedule_and_clipping.py",)),
    Mutation("prefetch-skips-a-step", "pydtnn_lite/data/prefetch.py",
             "for step in self.steps:", "for step in list(self.steps)[1:]:",
             ("tests/test_prefetch.py",)),
    Mutation("best-checkpoint-keeps-the-worst", "pydtnn_lite/training/retention.py",
             "validation_accuracy > best", "validation_accuracy < best",
             ("tests/test_retention.py",)),
    # ---------------------------------------------------------------- tracer and costs
    Mutation("conv-cost-patch-length-misses-a-side", "pydtnn_lite/layers/conv.py",
             "self.kernel_size ** 2 * self.input_shapes[0][2]", "self.kernel_size * self.input_shapes[0][2]",
             ("tests/test_tracing.py::test_gemm_flops_agree_with_the_operand_shapes_of_each_call",)),
    Mutation("backward-kernels-traced-as-forward", "pydtnn_lite/network.py",
             "            with self.scope(index, Stage.BP):\n                grad_in",
             "            with self.scope(index, Stage.FP):\n                grad_in",
             ("tests/test_tracing.py::test_each_step_records_exactly_the_kernels_the_cost_model_lists",)),
    Mutation("call-counter-never-advances", "pydtnn_lite/costs.py",
             "self._calls[(layer, stage, kernel)] += 1", "self._calls[(layer, stage, kernel)] += 0",
             ("tests/test_perfmodel.py::test_each_call_of_a_kernel_in_a_layer_is_compared_with_its_own_prediction",)),
    # ---------------------------------------------------------------- data and augmentation
    Mutation("sampler-same-order-every-epoch", "pydtnn_lite/data/sampler.py",
             "np.random.default_rng([self.seed, epoch])", "np.random.default_rng([self.seed])",
             ("tests/test_training.py::test_sampler_covers_each_epoch_once_and_reshuffles",)),
    Mutation("partition-gives-remainders-to-the-smallest", "pydtnn_lite/data/sampler.py",
             "np.argsort(-(exact - shares), kind=\"stable\")", "np.argsort(exact - shares, kind=\"stable\")",
             ("tests/test_training.py::test_partition_sums_and_follows_weights",)),
    Mutation("synthetic-test-split-has-other-templates", "pydtnn_lite/data/synthetic.py",
             "rng = np.random.default_rng([seed, 0x7E4])", "rng = np.random.default_rng([seed, split, 0x7E4])",
             ("tests/test_training.py::test_the_embedded_synthetic_data_set_is_learnable",)),
    Mutation("flip-mirrors-rows", "pydtnn_lite/data/augment.py",
             "out[i] = window[:, ::-1] if flip else window", "out[i] = window[::-1] if flip else window",
             ("tests/test_augment.py::test_each_sample_equals_a_naive_crop_and_flip",)),
    Mutation("augmentation-follows-the-row-not-the-sample", "pydtnn_lite/data/augment.py",
             "row_words, column_words, flip_words = _sample_hashes(indices, seed, epoch, 3)",
             "row_words, column_words, flip_words = _sample_hashes(np.arange(len(indices)), seed, epoch, 3)",
             ("tests/test_augment.py::test_choices_follow_the_sample_not_its_row_or_the_split_of_the_batch",)),
    # ---------------------------------------------------------------- performance model
    Mutation("wre-divides-by-the-kernel-not-the-stage-mean", "pydtnn_lite/perfmodel/modelling/validation.py",
             "wre = (pred - meas) / stage_mean[key.stage]", "wre = (pred - meas) / meas",
             ("tests/test_perfmodel.py::test_validation_metrics_against_hand_computed_values",)),
    Mutation("ring-allreduce-sends-the-whole-message", "pydtnn_lite/perfmodel/modelling/allreduce.py",
             "return 2.0 * (p - 1), 2.0 * (p - 1) / p * n, (p - 1) / p * n",
             "return 2.0 * (p - 1), 2.0 * (p - 1) * n, (p - 1) / p * n",
             ("tests/test_perfmodel.py::test_allreduce_formulas",)),
    Mutation("sync-wait-scales-linearly-with-ranks", "pydtnn_lite/perfmodel/modelling/synchronization.py",
             "scale = expected_maximum(procs) / expected_maximum(self.ranks)", "scale = procs / self.ranks",
             ("tests/test_perfmodel.py::test_expected_maximum_of_normal_draws_and_the_fitted_wait",)),
    Mutation("between-runs-compares-a-run-with-itself", "pydtnn_lite/perfmodel/modelling/repeatability.py",
             "[stand_in[k.key] for k in kernels]", "[k.measured for k in kernels]",
             ("tests/test_repeatability.py",)),
    Mutation("balancer-weights-inverse-to-speed", "pydtnn_lite/training/balance.py",
             "proposal = [float(v) for v in self.speeds / self.speeds.max()]",
             "proposal = [float(v) for v in self.speeds.min() / self.speeds]",
             ("tests/test_balance.py::test_balancer_weights_follow_smoothed_speeds_when_it_pays",)),
    Mutation("first-calls-compile-without-waiting", "pydtnn_lite/kernels/jit.py",
             "if self.dispatcher.overloads:", "if True:", ("tests/test_jit.py",)),
    Mutation("no-spare-core-compiles-beside-the-lock", "pydtnn_lite/kernels/jit.py",
             'for i in range(1, usable_cores())]]', 'for i in range(1, 1)]]', ("tests/test_jit.py",)),
]


def copy_repository(destination: str) -> None:
    """The parts of the repository the tests read, without caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, name), ignore=ignore)
        elif os.path.isfile(source):
            shutil.copy2(source, os.path.join(destination, name))


def environment(copy: str) -> dict[str, str]:
    """The copy first on the path (of pytest and of the processes its tests spawn), and no bytecode
    written: a restored file must never be served from the cache of its mutant."""
    path = os.pathsep.join(filter(None, [copy, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")


def check_the_copy_is_imported(copy: str) -> None:
    """Exit unless a plain subprocess and a process started by mpiexec import the copy's package."""
    code = "import pydtnn_lite, pydtnn_lite.models; print(pydtnn_lite.__file__); print(pydtnn_lite.models.__file__)"
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    commands = [[sys.executable, "-c", code]]
    if os.path.exists(mpiexec):
        commands.append([mpiexec, "-n", "1", sys.executable, "-c", code])
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, env=environment(copy), cwd=copy, timeout=120)
        files = result.stdout.split()
        if result.returncode != 0 or len(files) != 2 or not all(f.startswith(copy + os.sep) for f in files):
            sys.exit(f"mutation: {' '.join(command[:2])} does not import the copy in {copy}: "
                     f"{result.stdout.strip()} {result.stderr.strip()[-500:]}")


def run_tests(copy: str, tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """(status, detail) of ``tests`` run in the copy: ('pass', ''), ('fail', first failing test) or ('timeout', '')."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=environment(copy), cwd=copy,
                                timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    if result.returncode == 0:
        return "pass", ""
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, flags=re.MULTILINE)
    return "fail", failed[0] if failed else f"pytest exit {result.returncode}: {result.stdout.strip()[-300:]}"


def mutate(copy: str, mutation: Mutation, timeout: float) -> tuple[str, str]:
    """(result, detail) of one mutation: KILLED (by the test named in detail), SURVIVED, BROKEN or TIMEOUT."""
    path = os.path.join(copy, mutation.path)
    if not os.path.isfile(path):
        return "BROKEN", f"no file {mutation.path}"
    with open(path, encoding="utf-8") as handle:
        original = handle.read()
    found = original.count(mutation.find)
    if found != 1:
        return "BROKEN", f"the snippet occurs {found} times in {mutation.path}, not once"
    mutated = original.replace(mutation.find, mutation.replace)
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(mutated)
        status, detail = run_tests(copy, mutation.tests, timeout)
    finally:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(original)
    return {"pass": "SURVIVED", "fail": "KILLED", "timeout": "TIMEOUT"}[status], detail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation (default 600)")
    args = parser.parse_args()
    names = [m.name for m in MUTATIONS]
    assert len(set(names)) == len(names), "mutation names must be unique"
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}  {m.path}  {' '.join(m.tests)}")
        return 0
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"unknown mutation(s) {', '.join(unknown)}: see --list")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    with tempfile.TemporaryDirectory(prefix="pydtnn-mutation-") as copy:
        copy_repository(copy)
        check_the_copy_is_imported(copy)
        tests = tuple(dict.fromkeys(test for m in chosen for test in m.tests))
        started = time.perf_counter()
        status, detail = run_tests(copy, tests, args.timeout * 3)
        if status != "pass":
            print(f"mutation: the named tests do not pass unmutated ({status} {detail}): fix them first",
                  file=sys.stderr)
            return 1
        print(f"unmutated: {len(tests)} named test(s) pass ({time.perf_counter() - started:.0f} s)", flush=True)
        rows: list[tuple[str, str, str]] = []
        for mutation in chosen:
            started = time.perf_counter()
            result, detail = mutate(copy, mutation, args.timeout)
            cell = f"killed by {detail}" if result == "KILLED" else f"{result} {detail}".strip()
            print(f"{mutation.name}: {cell} ({time.perf_counter() - started:.0f} s)", flush=True)
            rows.append((mutation.name, mutation.path, cell))
    killed = sum(row[2].startswith("killed by") for row in rows)
    print()
    print(format_table(("mutation", "file", "result"), rows, align="<<<"))
    print(f"killed {killed} of {len(chosen)}")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
