#!/usr/bin/env bash
# The TensorRT checks in one command, on a machine with TensorRT and an NVIDIA GPU: a Jetson on
# JetPack 5/6 (TensorRT and OpenCV from JetPack's system site-packages), or a GPU server with the
# tensorrt wheel installed. Builds a venv that sees the system site-packages (.venv-gpu), installs
# edged with [dev,tensorrt] (pycuda compiles against the CUDA toolkit on the device), runs
# tests/test_tensorrt.py (engine build, TensorRT against ONNX Runtime, the compatibility refusal,
# the daemon on an engine package). Prints a table; exits non-zero when any check fails or is
# skipped (the one test of the no-TensorRT message is expected to skip here).
#
#     bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${EDGED_GPU_VENV:-.venv-gpu}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$VENV" || exit 1
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev,tensorrt]' || exit 1
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || { echo "gpu-check: install mosquitto"; exit 1; }
"$VENV/bin/edged" model fetch-demo >/dev/null || exit 1

facts=$("$VENV/bin/python" - <<'EOF'
from edged.daemon.backends.tensorrt import device_facts
f = device_facts()
print(f"TensorRT {f.tensorrt}, compute capability {f.compute_capability}, L4T {f.l4t or 'n/a'}, {f.platform}")
EOF
) || { echo "gpu-check: tensorrt/pycuda/GPU not usable here: $facts"; exit 1; }

start=$(date +%s)
"$VENV/bin/python" -m pytest -p no:cacheprovider -rA tests/test_tensorrt.py > /tmp/edged-gpu-check.log 2>&1
rc=$?
secs=$(( $(date +%s) - start ))

echo
echo "edged gpu-check: $facts"
printf '%-60s %s\n' "check" "result"
grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' /tmp/edged-gpu-check.log | while read -r result rest; do
  printf '%-60s %s\n' "${rest%% - *}" "$result"
done
echo "pytest exit $rc after ${secs}s (log: /tmp/edged-gpu-check.log)"
if grep -E '^(SKIPPED|FAILED|ERROR) ' /tmp/edged-gpu-check.log | grep -qv 'TensorRT is present'; then
  exit 1
fi
exit "$rc"
