#!/usr/bin/env bash
# The device check, one command for whoever has an NVIDIA GPU (a GPU server with pip's TensorRT, H200
# class, or a Jetson on JetPack 6), under 9 minutes from a clean checkout:
#
#   [1/7] engine tests   scripts/gpu-check.sh: makes .venv-gpu (TensorRT chosen from the driver's CUDA
#                        version, pycuda), runs tests/test_tensorrt.py (engine builds, TensorRT against
#                        ONNX Runtime, the compatibility refusal, the daemon on an engine package)
#   [2/7]-[7/7]          bench/device_check.py in that venv: a threaded open/infer/close loop (50 cycles,
#                        free device memory and context-stack depth every 10), GPU memory back to baseline
#                        after close, a calibrated INT8 build with warnings as errors against ONNX Runtime,
#                        an FP16 strongly typed build (10.12+), a 10.x plan refused on 11.x before
#                        deserialising, and eta on the GPU (daemon end to end / tight loop, same engine)
#
#     bash scripts/device-check.sh [--dry-run] [--out FILE]
#
# Without an NVIDIA GPU (nvidia-smi lists none and this is no Jetson), or with --dry-run, every step prints
# SKIP with its reason and the script exits 0. Otherwise it exits 1 when a step fails. The output is also
# written to FILE (default bench/results/device-check.<host>.txt, or device-check.dryrun.txt for a dry run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
BUDGET_S=540  # 9 minutes, gpu-check's install and tests included
dry=
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry="--dry-run given" ;;
    --out) out=${2:?--out needs a file}; shift ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "device-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$dry" ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU' && [ ! -f /etc/nv_tegra_release ]; then
  dry="no NVIDIA GPU here: nvidia-smi lists none and this is no Jetson"
fi
if [ -z "$out" ]; then
  if [ -n "$dry" ]; then out=bench/results/device-check.dryrun.txt; else out=bench/results/device-check.$(hostname -s).txt; fi
fi
mkdir -p "$(dirname "$out")"
exec > >(tee "$out") 2>&1

start=$(date +%s)
echo "edged device check: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$dry" ]; then
  py=.venv/bin/python; [ -x "$py" ] || py=python3
  echo "dry run: $dry"
  echo "[1/7] engine    tests/test_tensorrt.py through scripts/gpu-check.sh: SKIP ($dry)"
  "$py" bench/device_check.py --dry-run "$dry"
  echo "device check: dry run, every step skipped, exit 0 ($(( $(date +%s) - start )) s)"
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
bash scripts/gpu-check.sh
gpu_rc=$?
venv=${EDGED_GPU_VENV:-.venv-gpu}
elapsed=$(( $(date +%s) - start ))
if [ "$gpu_rc" = 0 ]; then result=PASS; else result=FAIL; fi
echo "[1/7] engine    tests/test_tensorrt.py through scripts/gpu-check.sh: $result (exit $gpu_rc after ${elapsed} s; table above)"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import edged.daemon.backends' 2>/dev/null; then
  echo "[2/7]-[7/7]     SKIP (gpu-check could not make $venv with edged: see above)"
  exit 1
fi
"$venv/bin/python" bench/device_check.py --budget-s $(( BUDGET_S - elapsed - 15 ))
steps_rc=$?
total=$(( $(date +%s) - start ))
echo "device check: engine tests exit $gpu_rc, steps exit $steps_rc, ${total} s (budget ${BUDGET_S} s); output in $out"
[ "$gpu_rc" = 0 ] && [ "$steps_rc" = 0 ]
