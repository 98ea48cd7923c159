"""launch/emulated-cluster.sh: its refusals, its set-up and teardown, and training across emulated nodes."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pytest

from pydtnn_lite.perfmodel.measuring.straggler_waits import REPEATS, SEGMENTS
from pydtnn_lite.perfmodel.modelling.network import NetworkTimings
from pydtnn_lite.runtime import usable_cores

from mpi import REPO, TRAIN_SMALL, assert_same_weights, train_small

LAUNCHER = os.path.join(REPO, "launch", "emulated-cluster.sh")
LOCK = "/run/lock/pydtnn-lite-emulated-cluster.lock"
PREFIX = "pdtl-"
CAN_EMULATE = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_emulation = pytest.mark.skipif(not CAN_EMULATE, reason="emulating a cluster needs root, ip and tc")
# Held by each test of this file: pytest-xdist's workers run tests of one file side by side
# under plain ``-n``, and a cluster started by one would make the launcher refuse the other's,
# or appear among the namespaces that another test expects to see removed.
ONE_TEST_AT_A_TIME = os.path.join(tempfile.gettempdir(), "pydtnn-lite-emulated-cluster-tests.lock")


@pytest.fixture(autouse=True)
def alone_on_the_machine():
    """No other test of this file runs meanwhile, in this pytest process or another."""
    with open(ONE_TEST_AT_A_TIME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def launch(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The launcher run by bash (so that a test can narrow PATH); output captured as text."""
    return subprocess.run(["/bin/bash", LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def cluster(nodes: int, ranks_per_node: int, *command: str, **kwargs) -> subprocess.CompletedProcess:
    return launch("--nodes", str(nodes), "--ranks-per-node", str(ranks_per_node), "--link-gbit", "5", "--",
                  *command, env=dict(os.environ, MPIEXEC=os.path.join(os.path.dirname(sys.executable), "mpiexec")),
                  **kwargs)


def our_namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(PREFIX)]


def refusal(run: Callable[[], subprocess.CompletedProcess], message: str) -> None:
    """``run`` exits 2 with one error line that says ``message``, and creates or removes no namespace
    (compared with those standing before it: a killed run elsewhere on the machine may have left some)."""
    before = our_namespaces() if CAN_EMULATE else []
    result = run()
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("emulated-cluster: error:"), result.stderr
    assert message in result.stderr
    if CAN_EMULATE:
        assert our_namespaces() == before


@pytest.mark.parametrize("args,message", [
    (("--nodes", "2", "--ranks-per-node", "1", "--", "true"), "--link-gbit are required"),
    (("--nodes", "0", "--ranks-per-node", "1", "--link-gbit", "1", "--", "true"), "--nodes 0"),
    (("--nodes", "2", "--ranks-per-node", "1", "--link-gbit", "0", "--", "true"), "--link-gbit 0"),
    (("--nodes", "2", "--ranks-per-node", "1", "--link-gbit", "1"), "no command to run"),
    (("--nodes", "2", "--ranks-per-node", "1", "--link-gbit", "1", "--hosts", "a", "--", "true"),
     "unknown argument '--hosts'"),
])
def test_bad_arguments_are_refused(args, message):
    refusal(lambda: launch(*args), message)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_refuses_without_root():
    # The script reaches the unprivileged shell on its standard input: the checkout may sit in a
    # directory that only root can read (a mktemp directory, for one).
    def as_nobody() -> subprocess.CompletedProcess:
        with open(LAUNCHER, encoding="utf-8") as script:
            return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/bash", "-s",
                                   "--", "--nodes", "2", "--ranks-per-node", "1", "--link-gbit", "1", "--", "true"],
                                  stdin=script, capture_output=True, text=True, timeout=30, cwd="/")
    refusal(as_nobody, "need root")


@pytest.mark.skipif(os.geteuid() != 0, reason="the check for ip and tc comes after the one for root")
def test_refuses_without_ip_and_tc(tmp_path):
    os.symlink(shutil.which("id"), tmp_path / "id")  # the one tool the launcher runs before looking for ip and tc
    refusal(lambda: launch("--nodes", "2", "--ranks-per-node", "1", "--link-gbit", "1", "--", "true",
                           env={"PATH": str(tmp_path)}), "ip and tc are missing")


@needs_emulation
def test_refuses_while_another_cluster_runs():
    with open(LOCK, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running launcher holds it
        try:
            refusal(lambda: cluster(2, 1, "true"), "another emulated cluster is running")
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@needs_emulation
def test_nodes_see_each_other_through_their_links_and_everything_is_removed(tmp_path):
    """Each rank runs in its node's namespace with the node's index; the nodes reach each
    other over the bridge; nothing is left after the job."""
    result = cluster(2, 2, sys.executable, os.path.join(REPO, "tests", "programs", "emulated_node.py"), str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [(tmp_path / f"{rank}.txt").read_text().strip() for rank in range(4)]
    assert lines == ["0 pdtl-node0 5 emu0 reached"] * 2 + ["1 pdtl-node1 5 emu0 reached"] * 2
    assert our_namespaces() == []


@needs_emulation
def test_exit_status_of_the_job_and_its_errors_remove_the_cluster():
    result = cluster(2, 1, sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode != 0
    assert our_namespaces() == []


@needs_emulation
def test_the_job_does_not_hold_the_lock():
    """A rank or an MPICH proxy that outlives the launcher by a moment must not keep the next cluster out."""
    result = cluster(1, 1, "/bin/bash", "-c", "ls -l /proc/$$/fd")
    assert result.returncode == 0, result.stderr
    assert " -> " in result.stdout and LOCK not in result.stdout, result.stdout  # its files, not the lock


def default_sigint() -> None:
    """Ctrl-C's default action in the launcher, as a terminal gives it: pytest-xdist's workers
    ignore SIGINT, and a shell that starts with a signal ignored cannot trap it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@needs_emulation
@pytest.mark.parametrize("on_term", [
    "signal.SIG_DFL",
    "signal.SIG_IGN",  # a rank that does not end on SIGTERM is killed after a few seconds' grace
])
def test_ctrl_c_removes_the_cluster(tmp_path, on_term):
    started = tmp_path / "started"
    program = (f"import pathlib, signal, time; signal.signal(signal.SIGTERM, {on_term}); "
               f"pathlib.Path({str(started)!r}).touch(); time.sleep(60)")
    job = subprocess.Popen(["/bin/bash", LAUNCHER, "--nodes", "1", "--ranks-per-node", "1", "--link-gbit", "1", "--",
                            sys.executable, "-c", program],
                           env=dict(os.environ, MPIEXEC=os.path.join(os.path.dirname(sys.executable), "mpiexec")),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=default_sigint)
    try:
        for _ in range(300):  # until the rank runs
            if started.exists():
                break
            time.sleep(0.1)
        assert started.exists() and len(our_namespaces()) == 2
        signalled = time.monotonic()
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=30) == 130
        assert time.monotonic() - signalled < 15
    finally:
        if job.poll() is None:
            job.kill()
    assert our_namespaces() == []


@needs_emulation
def test_leftovers_of_a_killed_run_are_removed():
    subprocess.run(["ip", "netns", "add", f"{PREFIX}node5"], check=True)
    result = cluster(1, 1, "true")
    assert result.returncode == 0, result.stderr
    assert "removed 1 namespace(s) left by a killed run" in result.stderr
    assert our_namespaces() == []


@needs_emulation
def test_two_nodes_train_as_one_process(tmp_path):
    """2 nodes x 2 ranks, hierarchical: the groups are the emulated nodes, and the weights
    are those of one process on the whole batch."""
    single = train_small(tmp_path, 1)
    out = tmp_path / "cluster.npz"
    result = cluster(2, 2, sys.executable, TRAIN_SMALL, str(out), "--comm", "hierarchical", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "summed in 2 group(s)" in result.stdout
    with np.load(out) as archive:
        assert_same_weights(single, {name: archive[name] for name in archive.files})


@needs_emulation
def test_auto_takes_the_strategy_the_model_predicts_faster_on_the_nodes(tmp_path):
    """2 nodes x 2 ranks with --comm auto and a calibration of such nodes: the model's
    choice, said in the first line, and the run validated against it."""
    result = cluster(2, 2, sys.executable, "-m", "pydtnn_lite.train", "--model", "mlp", "--dataset", "synthetic",
                     "--batch-size", "32", "--steps-per-epoch", "3", "--eval-steps", "0", "--no-progress",
                     "--comm", "auto", "--validate", os.path.join(REPO, "calibration", "emulated-2x2-1gbit.json"),
                     "--trace", str(tmp_path / "trace"), "--trace-skip", "1", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "strategy (auto: predicted faster by the model)" in output
    assert "measured ms  predicted ms" in output


@needs_emulation
def test_allreduce_is_timed_between_and_inside_the_emulated_nodes(tmp_path):
    """On 2 nodes x 2 ranks, the calibration's network timings: among one rank per node over
    the link, among each node's ranks, and the CPU that moving buckets costs the ranks."""
    out = tmp_path / "network.json"
    sizes = [1 << 10, 4 << 20]
    result = cluster(2, 2, sys.executable, os.path.join(REPO, "tests", "programs", "network_timing.py"), str(out),
                     *map(str, sizes), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    network = NetworkTimings.from_dict(json.loads(out.read_text()))
    assert (network.nodes, network.ranks_per_node, network.link_gbit) == (2, 2, 5.0)
    assert network.ranks_per_host == 4  # the emulated nodes share this machine's cores
    assert [n for n, _ in network.inter_node] == sizes and [n for n, _ in network.intra_node] == sizes
    assert all(seconds > 0 for _, seconds in network.inter_node + network.intra_node)
    # Each node sends the 4 MiB at least once over its 5 Gbit/s link (tc lets a burst of 1 ms pass at once).
    assert dict(network.inter_node)[4 << 20] > 0.8 * (4 << 20) * 8 / 5e9
    # Sockets copy every byte at least once on the ranks' cores (far under 20 ms per MiB).
    assert 0 < network.transfer.cpu_per_byte * (1 << 20) < 20e-3
    assert 0 < network.transfer.post_seconds < 20e-3  # posting a 4 MiB bucket: MPICH starts sending in the call
    assert 0 < network.transfer.post_test_seconds < 20e-3  # the trainer's test right after it, timed apart
    # Between two MPI calls the link moves a bounded window of bytes: more than nothing, less than the buckets.
    assert 0 < network.transfer.window_bytes < 6 * (4 << 20)
    # The same through the hierarchical strategy's pipeline, whose node levels the ranks run in their calls.
    pipelined = network.two_level_transfer
    assert pipelined is not None
    assert 0 < pipelined.cpu_per_byte * (1 << 20) < 20e-3 and 0 < pipelined.post_seconds < 20e-3
    # Its tests start each bucket's later collectives (a flat bucket has none to start).
    assert 0 < pipelined.start_seconds < 20e-3 and network.transfer.start_seconds == 0
    assert 0 < pipelined.window_bytes < 6 * (4 << 20)
    # Four ranks on fewer cores time-share them: their waits for the slowest, after stretches of 50-800 ms of work.
    assert bool(network.straggler_waits) == (usable_cores() < 4)
    works = [work for work, _ in network.straggler_waits]
    assert len(works) in (0, len(SEGMENTS) * REPEATS)
    # A stretch is sized by a kernel timed once, on cores whose speed swings up to 2x between
    # instants (77-152 GFLOP/s a core on 2026-11-27). A wait is at most the others' work on the
    # shared cores: the slowest of the 4 ranks may start its stretch after the others ended theirs
    # (under another job's load, more than one stretch late).
    outside = [(work, wait) for work, wait in network.straggler_waits
               if not (SEGMENTS[0] / 4 < work < 8 * SEGMENTS[-1] and 0 <= wait < network.ranks_per_host * work)]
    assert outside == []
