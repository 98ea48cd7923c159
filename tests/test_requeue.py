"""SLURM-style stop and requeue: a signal ends every rank after the same step with a checkpoint and status 75;
--resume auto continues from it, or starts fresh when there is none."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from pydtnn_lite.training.stopping import REQUEUE_EXIT

from mpi import MPIEXEC, train_cli

FLAGS = ("--model", "lenet", "--dataset", "digits", "--batch-size", "16", "--eval-steps", "0", "--log-every", "1")


def checkpoint_step(directory) -> int:
    with np.load(directory / "checkpoint.npz") as archive:
        return int(archive["meta/global_step"])


@pytest.mark.parametrize("stop", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_a_signal_checkpoints_every_rank_s_last_step_and_asks_for_a_requeue(tmp_path, stop):
    ckpt = tmp_path / "ckpt"
    command = [MPIEXEC, "-n", "2", sys.executable, "-m", "pydtnn_lite.train", *FLAGS, "--epochs", "1000",
               "--checkpoint-dir", str(ckpt), "--resume", "auto", "--run-dir", str(tmp_path)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert job.stdout is not None
        for line in job.stdout:  # training has begun: the first step's line
            if re.search(r"step \d+/\d+ \(global 3\)", line):
                break
        job.send_signal(stop)  # mpiexec passes it on to every rank
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == REQUEUE_EXIT, err[-2000:]
    stopped = re.search(rf"stopped by {stop.name} after step (\d+): checkpoint of step (\d+)", out)
    assert stopped and stopped.group(1) == stopped.group(2), out[-2000:]
    assert checkpoint_step(ckpt) == int(stopped.group(1)) >= 3
    assert "Traceback" not in err
    step = int(stopped.group(1))
    resumed = train_cli(2, *FLAGS, "--epochs", "1", "--steps-per-epoch", str(step + 2), "--checkpoint-dir",
                        str(ckpt), "--resume", "auto", "--run-dir", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed at step {step}" in resumed.stdout
    assert checkpoint_step(ckpt) == step + 2


def test_resume_auto_starts_fresh_without_a_checkpoint(tmp_path):
    result = train_cli(2, *FLAGS, "--steps-per-epoch", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--resume", "auto", "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed" not in result.stdout
    assert checkpoint_step(tmp_path / "ckpt") == 2


def test_the_slurm_script_passes_cpus_per_task_and_requeues_after_a_signal(tmp_path):
    # Stand-ins for srun (it notes what it was given, then runs a small job under mpiexec in its own
    # place, so the script's signal reaches the ranks) and scontrol (it notes the requeue).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    small = " ".join([sys.executable, "-m", "pydtnn_lite.train", *FLAGS, "--epochs", "1000", "--run-dir",
                      str(tmp_path)])
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        f'echo "cpus $SRUN_CPUS_PER_TASK" > {tmp_path}/srun.log\necho "$@" >> {tmp_path}/srun.log\n'
        'while [ "$1" != "--checkpoint-dir" ]; do shift; done\n'
        f'exec {MPIEXEC} -n 2 {small} --checkpoint-dir "$2" --resume auto\n')
    (bin_dir / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$@" > {tmp_path}/scontrol.log\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_NTASKS="2",
               SLURM_CPUS_PER_TASK="3", DATA_DIR=str(tmp_path), CHECKPOINT_DIR=str(tmp_path / "ckpt"),
               VENV=os.path.dirname(os.path.dirname(sys.executable)), PYTHONUNBUFFERED="1")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch", "slurm.sbatch")
    job = subprocess.Popen(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert job.stdout is not None
        for line in job.stdout:
            if "(global 2)" in line:
                break
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends the batch script
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == REQUEUE_EXIT, err[-2000:]
    assert "requeueing job 4242" in out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    srun = (tmp_path / "srun.log").read_text().splitlines()
    assert srun[0] == "cpus 3"
    assert "--resume auto" in srun[1] and "--blas-threads 3" in srun[1]
    assert checkpoint_step(tmp_path / "ckpt") >= 2
