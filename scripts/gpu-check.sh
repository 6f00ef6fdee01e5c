#!/usr/bin/env bash
# The TensorRT checks in one command, on a machine with TensorRT and an NVIDIA GPU: a Jetson on
# JetPack 6 (TensorRT and OpenCV from JetPack's system site-packages), or a GPU server with the
# tensorrt wheel installed. Builds a venv that sees the system site-packages (.venv-gpu), installs
# edged[tensorrt] (cuda-python's cuda-bindings wheel: nothing compiles; pycuda is used where it is installed
# and cuda-python is not) and pytest with the two
# plugins the tests' settings name (CHECK_REQS; nothing else of [dev]), runs
# tests/test_tensorrt.py (engine build, TensorRT against ONNX Runtime, the compatibility refusal,
# the daemon on an engine package). Prints a table; exits non-zero when any check fails or is
# skipped, except the expected skips: the tests of the no-TensorRT messages, and the daemon test where
# no mosquitto is installed (JetPack has none and the bundle carries none; the table says so).
# ONNX Runtime and OpenCV: the venv's own when it sees them (onnxruntime-gpu, JetPack's OpenCV), else
# edged's extras from PyPI ([onnxruntime], [opencv]); never over the system's.
#
#     bash scripts/gpu-check.sh              from a source checkout
#     bash edged-bundle/check/gpu-check.sh   from an unpacked bundle, offline: edged, cuda-python
#                                            (cuda-bindings) and CHECK_REQS come from the bundle's wheels/
#     bash scripts/gpu-check.sh --print-trt-wheel [CUDA]   the pip TensorRT it picks for this driver (or CUDA)
#
# Prerequisites (all missing ones are listed before anything is installed):
#   Python >= 3.10 with venv (Jetson: JetPack 6; apt-get install python3-venv)
#   TensorRT's Python bindings: JetPack's python3-libnvinfer (apt-get install nvidia-jetpack), or on a
#     GPU server pip's TensorRT into the venv, chosen from the driver's CUDA version (nvidia-smi's "CUDA
#     Version", else libcuda's cuDriverGetVersion): tensorrt-cu12 for a CUDA 12 driver (R535+), tensorrt-cu13
#     for CUDA 13+ (R580+), both >=10.12,<12 (the bare `tensorrt` is the CUDA 13 build and fails on a CUDA
#     12 driver). Automatic off Jetson when the system has no tensorrt; EDGED_GPU_PIP=tensorrt asks for it
#     anyway, EDGED_GPU_PIP="<pip spec>" installs exactly that
#   a CUDA binding: edged[tensorrt] installs cuda-python's cuda-bindings 12.x from its wheel (aarch64 and
#     x86_64; any CUDA 12+ driver; a jetson-jp6 bundle carries it); only from a bundle without that wheel
#     (made before it, or a host bundle) pycuda and what building it needs (CUDA's nvcc,
#     /usr/local/cuda/bin is added to PATH; python3-dev; g++)
#   the demo assets (edged model fetch-demo: the internet once, or a copied ~/.cache/edged/demo)
#   mosquitto is optional: without it the daemon-on-an-engine test is skipped with the reason
#   without the internet: run it from a jetson-jp6 bundle's check/ (its wheels/ carry everything the
#     venv needs), or set EDGED_WHEELS=DIR with every wheel the venv needs (used with pip --no-index);
#     an x86 host bundle carries no pycuda (no CUDA where it is built): give its wheel in EDGED_WHEELS
set -uo pipefail
# what the check installs besides edged[tensorrt]; edged bundles carry them (deploy/bundle.py GPU_CHECK)
CHECK_REQS=("pytest>=8" "pytest-timeout>=2.2" "pytest-xdist>=3.5")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUNDLE=
if [ -f "$here/../bundle.json" ]; then  # check/ of an unpacked bundle: edged from the bundle's wheels
  BUNDLE=$(cd "$here/.." && pwd)
  cd "$here" || exit 1
  EDGED_WHEELS=${EDGED_WHEELS:-$BUNDLE/wheels}
else  # a source checkout
  cd "$here/.." || exit 1
fi
VENV=${EDGED_GPU_VENV:-.venv-gpu}
[ -d /usr/local/cuda/bin ] && PATH=/usr/local/cuda/bin:$PATH

# The CUDA version the NVIDIA driver supports, "12.4" (empty without a driver): nvidia-smi's header, else
# libcuda's cuDriverGetVersion (needs no cuInit, so no GPU context).
driver_cuda() {
  local v
  v=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
  [ -n "$v" ] || v=$(python3 -c '
import ctypes
v = ctypes.c_int()
if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
    print(f"{v.value // 1000}.{v.value % 1000 // 10}")' 2>/dev/null)
  echo "$v"
}
# The pip TensorRT for a driver's CUDA version; the range is what edged supports on a GPU server (10.12 to 11.x).
trt_wheel() {
  local major=${1%%.*}
  if [ -z "$major" ]; then return 1; fi
  if [ "$major" -ge 13 ]; then echo "tensorrt-cu13>=10.12,<12"
  elif [ "$major" -eq 12 ]; then echo "tensorrt-cu12>=10.12,<12"
  else return 1; fi
}
[ "${1:-}" = "--print-trt-wheel" ] && { trt_wheel "${2:-$(driver_cuda)}"; exit $?; }  # tests, and for the curious

jetson=; [ -f /etc/nv_tegra_release ] && jetson=1
trt_pip=${EDGED_GPU_PIP:-}
if [ -z "$trt_pip" ] && [ -z "$jetson" ] && ! python3 -c 'import tensorrt' 2>/dev/null; then trt_pip=tensorrt; fi
missing=()
if [ "$trt_pip" = tensorrt ] || [ "$trt_pip" = auto ]; then
  cuda=$(driver_cuda)
  if trt_pip=$(trt_wheel "$cuda"); then
    echo "gpu-check: the driver supports CUDA $cuda: pip TensorRT $trt_pip"
  else
    missing+=("an NVIDIA driver for CUDA 12 or newer (R535+) for pip's TensorRT (this one: ${cuda:-no driver found})")
    trt_pip=
  fi
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
  || missing+=("Python >= 3.10 (this is $(python3 --version 2>&1); JetPack 6 has 3.10)")
python3 -c 'import ensurepip' 2>/dev/null || missing+=("python3-venv (apt-get install python3-venv)")
if [ -z "$trt_pip" ] && [ -n "$jetson" ] && ! python3 -c 'import tensorrt' 2>/dev/null; then
  missing+=("TensorRT's Python bindings (apt-get install nvidia-jetpack)")
fi
cuda_binding=cuda-bindings  # edged[tensorrt]'s wheel; a bundle without it builds pycuda
if [ -n "$BUNDLE" ] && ! ls "$EDGED_WHEELS"/cuda_bindings-*.whl >/dev/null 2>&1; then cuda_binding=pycuda; fi
if [ "$cuda_binding" = pycuda ] && ! python3 -c 'import pycuda' 2>/dev/null; then
  command -v nvcc >/dev/null || missing+=("CUDA's nvcc to build pycuda (/usr/local/cuda/bin; Jetson: nvidia-jetpack)")
  inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
  [ -f "$inc/Python.h" ] || missing+=("the Python headers to build pycuda (apt-get install python3-dev)")
  command -v g++ >/dev/null || missing+=("g++ to build pycuda (apt-get install g++)")
fi
if [ -n "${EDGED_WHEELS:-}" ] && [ ! -d "$EDGED_WHEELS" ]; then missing+=("EDGED_WHEELS=$EDGED_WHEELS: no such folder"); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-check: missing prerequisites:"
  printf '  - %s\n' "${missing[@]}"
  exit 1
fi
PIP=(-m pip install -q --disable-pip-version-check)
[ -n "${EDGED_WHEELS:-}" ] && PIP+=(--no-index --find-links "$EDGED_WHEELS")
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$VENV" || exit 1
fi
read -r -a trt <<< "$trt_pip"  # EDGED_GPU_PIP may name several specs
if [ -n "$BUNDLE" ]; then  # as edged-firstboot installs it: the bundle's requirements, then its edged wheel
  pycuda=("cuda-bindings>=12.6,<13")  # the bundle's wheel; a bundle without it: pycuda built from its source
  if [ "$cuda_binding" = pycuda ]; then
    pycuda=(pycuda)
    "$VENV/bin/python" -c 'import pycuda' 2>/dev/null && pycuda=()
  fi
  "$VENV/bin/python" "${PIP[@]}" -r "$BUNDLE/requirements.txt" "${CHECK_REQS[@]}" "${pycuda[@]}" "${trt[@]}" \
    && "$VENV/bin/python" "${PIP[@]}" --no-deps --force-reinstall "$(ls "$BUNDLE"/wheels/edged-*.whl)" \
    || { echo "gpu-check: installing the bundle's edged, ${CHECK_REQS[*]} ${pycuda[*]} ${trt[*]} into $VENV failed (above)"; exit 1; }
else
  # the extras the venv does not already see: a GPU host's onnxruntime-gpu and JetPack's OpenCV stay
  extras=tensorrt
  "$VENV/bin/python" -c 'import onnxruntime' 2>/dev/null || extras+=,onnxruntime
  "$VENV/bin/python" -c 'import cv2' 2>/dev/null || extras+=,opencv
  "$VENV/bin/python" "${PIP[@]}" -e ".[$extras]" "${CHECK_REQS[@]}" "${trt[@]}" \
    || { echo "gpu-check: installing edged[$extras] ${CHECK_REQS[*]} ${trt[*]} into $VENV failed (above)"; exit 1; }
fi
"$VENV/bin/edged" model fetch-demo >/dev/null \
  || { echo "gpu-check: no demo assets (edged model fetch-demo needs the internet once; or copy ~/.cache/edged/demo)"; exit 1; }
"$VENV/bin/edged" doctor || echo "gpu-check: edged doctor reports failures (above); the tests run anyway"

facts=$("$VENV/bin/python" - <<'EOF'
from edged.daemon.backends.tensorrt import device_facts
f = device_facts()
print(f"TensorRT {f.tensorrt}, compute capability {f.compute_capability}, L4T {f.l4t or 'n/a'}, {f.platform}")
EOF
) || { echo "gpu-check: tensorrt/CUDA binding/GPU not usable here: $facts"; exit 1; }

start=$(date +%s)
# only the plugins the tests' settings name: the venv sees the system's site-packages, whose pytest plugins
# (a pytest-benchmark, say) could otherwise break the run
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$VENV/bin/python" -m pytest -p xdist.plugin -p pytest_timeout \
  -p no:cacheprovider -rA tests/test_tensorrt.py tests/test_trt_uint8.py > /tmp/edged-gpu-check.log 2>&1
rc=$?
secs=$(( $(date +%s) - start ))

echo
echo "edged gpu-check: $facts"
printf '%-60s %s\n' "check" "result"
grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' /tmp/edged-gpu-check.log | while read -r result rest; do
  printf '%-60s %s\n' "${rest%% - *}" "$result"
done
echo "pytest exit $rc after ${secs}s (log: /tmp/edged-gpu-check.log)"
# expected skips: the no-TensorRT messages (TensorRT is here), the daemon test without mosquitto (named above)
if grep -E '^(SKIPPED|FAILED|ERROR) ' /tmp/edged-gpu-check.log | grep -v 'TensorRT is present' | grep -qv 'no mosquitto'; then
  exit 1
fi
exit "$rc"
