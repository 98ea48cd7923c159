#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one run, one log per stage.
#
#   bash benchmarks/gpu_checks.sh LOGDIR [STAGE...]
#
# Stages (default: all, in this order): environment tests pytorch profile nccl mixed calibrate model.
# calibrate traces VGG11 and measures the calibration's samples; model fits them and
# validates the trace (minutes of CPU work, which may run on another machine: copy
# LOGDIR/work/gpu.json and LOGDIR/work/trace-model there and run the stage there).
# Each writes LOGDIR/STAGE.log; traces, calibrations and weights go to LOGDIR/work. Each
# command is bounded by `timeout`, and with BUDGET_S set (seconds) every stage is cut to
# what is left of that budget, so a machine lent for a fixed time returns the logs of the
# stages that fit. PYTHON names the interpreter (default python3); mpiexec is taken from
# beside it, as the tests take it.
set -u
if (( $# < 1 )); then
  echo "usage: bash benchmarks/gpu_checks.sh LOGDIR [environment tests pytorch profile nccl mixed calibrate model]" >&2
  exit 2
fi
LOGS=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
shift
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
WORK=$LOGS/work
mkdir -p "$WORK"
PY=${PYTHON:-python3}
MPIEXEC=$($PY -c 'import os, sys; print(os.path.join(os.path.dirname(sys.executable), "mpiexec"))')
END=$(( $(date +%s) + ${BUDGET_S:-86400} ))

# The smaller of $1 seconds and what the budget has left (at least 1).
cap() { local left=$(( END - $(date +%s) - 8 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
# The host's load and the GPU's clock and use as each step starts: small kernels are timed
# with the host's launch latency in them, so a busy host shows in them.
say() { echo "=== $* ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg)$(gpu_state))"; }
gpu_state() {
  command -v nvidia-smi > /dev/null &&
    nvidia-smi --query-gpu=clocks.sm,utilization.gpu --format=csv,noheader 2> /dev/null | sed 's/^/, GPU /'
}

# Median step of the second half of a run directory's metrics.csv.
median_step() {
  $PY - "$1" <<'EOF'
import csv, glob, statistics, sys
rows = list(csv.DictReader(open(glob.glob(sys.argv[1] + "/*/metrics.csv")[0])))
half = [float(row["step_seconds"]) for row in rows[len(rows) // 2:]]
print(f"median step (last {len(half)} of {len(rows)}): {statistics.median(half) * 1e3:.1f} ms")
EOF
}

# Largest difference between two weight files, relative to each array's largest value.
weight_difference() {
  $PY - "$1" "$2" <<'EOF'
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
worst = max(float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(a[k])) + 1e-30)) for k in a.files)
print(f"weights against one process: {len(a.files)} arrays, largest difference {worst:.2e} of the array's largest value")
EOF
}

environment() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import sys; from mpi4py import MPI; print(sys.executable, MPI.Get_library_version().splitlines()[0])"
  $PY -c "import cupy, numpy, torch; from cupy.cuda import nccl
print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'nccl', nccl.get_version())"
  echo "$(nproc) cores"
}

tests() {
  timeout "$(cap 300)" $PY -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_gpu_kernels.py tests/test_gpu_training.py
}

pytorch() {
  for config in "vgg11 synthetic 128" "resnet18 synthetic 128" "vgg11 synthetic-imagenet 64"; do
    set -- $config; say "against_pytorch $config"
    timeout "$(cap 150)" $PY benchmarks/against_pytorch.py --model "$1" --dataset "$2" --batch-size "$3" --device gpu \
      --threads 4 --steps 12
  done
}

profile() {
  for config in "vgg11 synthetic 128 100" "resnet18 synthetic 128 16" "vgg11 synthetic-imagenet 64 8"; do
    set -- $config; say "trace $config"
    rm -rf "$WORK/trace-$1-$2" "$WORK/runs"
    timeout "$(cap 120)" $PY -m pydtnn_lite.train --model "$1" --dataset "$2" --device gpu --batch-size "$3" \
      --steps-per-epoch "$4" --eval-steps 0 --no-progress --run-dir "$WORK/runs" --trace "$WORK/trace-$1-$2" | tail -2
    timeout "$(cap 60)" $PY -m pydtnn_lite.trace summarize "$WORK/trace-$1-$2"
  done
  # What the CUDA kernels gain over the same entries written with CuPy's operators.
  for prefix in batchnorm "im2col col2im" "maxpool avgpool"; do
    say "CUDA against CuPy operators: $prefix"
    timeout "$(cap 90)" $PY benchmarks/host_kernels.py --device gpu --model resnet18 --batch-size 128 --threads 4 \
      --steps 10 --kernels $prefix
  done
}

nccl() {
  say "NCCL collectives, 1 rank"; timeout "$(cap 60)" "$MPIEXEC" -n 1 $PY tests/programs/nccl_collectives.py
  say "1 GPU rank"; timeout "$(cap 90)" "$MPIEXEC" -n 1 $PY benchmarks/device_allreduce.py --device gpu --strategies mpi nccl
  say "1 GPU rank and 2 CPU ranks"
  timeout "$(cap 120)" "$MPIEXEC" -n 3 $PY benchmarks/device_allreduce.py --device gpu,cpu,cpu --strategies mpi gpu-side
  say "3 CPU ranks"; timeout "$(cap 120)" "$MPIEXEC" -n 3 $PY benchmarks/device_allreduce.py --device cpu --strategies mpi
}

mixed() {
  local exact=(--model resnet18 --dtype float64 --batch-size 64 --steps-per-epoch 8 --eval-steps 0 --no-progress --seed 3)
  say "one process on the CPU, float64"
  timeout "$(cap 120)" $PY -m pydtnn_lite.train "${exact[@]}" --device cpu --run-dir "$WORK/one" \
    --save-weights "$WORK/one.npz" | tail -1
  for comm in mpi gpu-side; do
    say "gpu,cpu,cpu --comm $comm --balance on, float64"
    timeout "$(cap 150)" "$MPIEXEC" -n 3 $PY -m pydtnn_lite.train "${exact[@]}" --device gpu,cpu,cpu --comm "$comm" \
      --balance on --balance-warmup 2 --balance-every 2 --run-dir "$WORK/three-$comm" \
      --save-weights "$WORK/three-$comm.npz" | grep -E "shares|done"
    weight_difference "$WORK/one.npz" "$WORK/three-$comm.npz"
  done
  local speed=(--model vgg11 --batch-size 256 --steps-per-epoch 30 --eval-steps 0 --no-progress)
  say "speed: the GPU alone"
  timeout "$(cap 120)" $PY -m pydtnn_lite.train "${speed[@]}" --device gpu --run-dir "$WORK/alone" | tail -1
  median_step "$WORK/alone"
  for comm in mpi gpu-side; do
    say "speed: gpu,cpu,cpu --comm $comm --balance on"
    timeout "$(cap 180)" "$MPIEXEC" -n 3 $PY -m pydtnn_lite.train "${speed[@]}" --device gpu,cpu,cpu --comm "$comm" \
      --balance on --run-dir "$WORK/mixed-$comm" | grep -E "shares|done"
    median_step "$WORK/mixed-$comm"
  done
}

calibrate() {
  say "trace VGG11 b128"
  rm -rf "$WORK/trace-model" "$WORK/runs"
  timeout "$(cap 120)" $PY -m pydtnn_lite.train --model vgg11 --device gpu --batch-size 128 --steps-per-epoch 100 \
    --eval-steps 0 --no-progress --run-dir "$WORK/runs" --trace "$WORK/trace-model" | tail -1
  say "calibrate: measure"
  timeout "$(cap 400)" $PY -m pydtnn_lite.calibrate --device gpu --batch-sizes 32 64 128 256 --fit-later \
    --out "$WORK/gpu.json"
}

model() {
  say "calibrate: fit"
  timeout "$(cap 1800)" $PY -m pydtnn_lite.calibrate --refit "$WORK/gpu.json"
  say "validate"
  timeout "$(cap 60)" $PY -m pydtnn_lite.validate "$WORK/trace-model" --calibration "$WORK/gpu.json"
}

STAGES=(environment tests pytorch profile nccl mixed calibrate model)
stages=("$@")
(( ${#stages[@]} )) || stages=("${STAGES[@]}")
for name in "${stages[@]}"; do
  if [[ " ${STAGES[*]} " != *" $name "* ]]; then
    echo "gpu_checks: unknown stage '$name': choose from ${STAGES[*]}" >&2
    exit 2
  fi
done
for name in "${stages[@]}"; do
  say "$name"
  { time "$name"; } > "$LOGS/$name.log" 2>&1
  tail -3 "$LOGS/$name.log"
  # A command cut by its time limit can leave MPI ranks behind, which would slow the next stage.
  left=$(pgrep -fc "python.* (-m pydtnn_lite|benchmarks/)|hydra_pmi_proxy")
  (( left > 0 )) && echo "gpu_checks: $left process(es) of $name still running" | tee -a "$LOGS/$name.log"
done
