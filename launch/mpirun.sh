#!/usr/bin/env bash
# Data-parallel training with plain mpirun, on this node or on the hosts of a hostfile.
#   launch/mpirun.sh 8                      # 8 ranks on this machine
#   HOSTFILE=launch/hosts.example launch/mpirun.sh 16
# Extra arguments after the rank count go to the trainer.
set -euo pipefail
ranks=${1:-2}
shift || true
venv=${VENV:-.venv}
hostfile_args=()
if [ -n "${HOSTFILE:-}" ]; then
  hostfile_args=(-f "$HOSTFILE")   # MPICH's flag; Open MPI uses --hostfile
fi
exec "$venv/bin/mpiexec" -n "$ranks" "${hostfile_args[@]}" "$venv/bin/python" -m pydtnn_lite.train \
  --model vgg11 --batch-size $((32 * ranks)) "$@"
