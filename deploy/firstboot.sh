#!/bin/bash
# The part of the install that runs on the device itself (install.sh calls it on a running device;
# edged-firstboot.service calls it, with --enable, on the first boot of a flashed rootfs): the edged
# user and folders, the virtual environment from the bundle's wheels (seeing the system site-packages,
# where JetPack's TensorRT and GStreamer OpenCV and python3-systemd live), pycuda built against the
# device's CUDA (jetson bundles), the initial model, then `edged doctor` as the edged user. A failing
# required check ends it with status 1 and edged.service is not enabled (the first-boot unit runs again
# on the next boot; or run this again by hand once fixed). Nothing here needs the network.
set -euo pipefail
E=/opt/edged
ENABLE=0
[ "${1:-}" = --enable ] && ENABLE=1
say() { echo "firstboot: $*"; }
die() { echo "firstboot: $*" >&2; exit 1; }
field() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$E/bundle.json" | head -1; }
TARGET=$(field target) MACHINE=$(field machine)
if [ "${TARGET#jetson}" != "$TARGET" ]; then
  [ "$(uname -m)" = "${MACHINE:-aarch64}" ] || die "this bundle's wheels are for ${MACHINE:-aarch64}, this machine is $(uname -m)"
  command -v python3.10 >/dev/null || die "JetPack 6 (Ubuntu 22.04, Python 3.10) is needed; this system has \
$(python3 --version 2>&1) (JetPack 5 ships Python 3.8, which edged does not support)"
fi
systemd-sysusers /usr/lib/sysusers.d/edged.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/edged.conf
if grep -q '^device_id: FIRSTBOOT-HOSTNAME' /etc/edged/edged.yaml 2>/dev/null; then
  sed -i "s/^device_id: FIRSTBOOT-HOSTNAME/device_id: $(hostname)/" /etc/edged/edged.yaml
fi
chgrp edged /etc/edged/edged.yaml
if [ ! -x "$E/venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$E/venv"
fi
PIP=("$E/venv/bin/python" -m pip install -q --no-index --find-links "$E/wheels" --disable-pip-version-check)
"${PIP[@]}" -r "$E/requirements.txt"
"${PIP[@]}" --no-deps --force-reinstall "$(ls "$E"/wheels/edged-*.whl)"

pycuda() { # the TensorRT backend's CUDA buffers: a prebuilt wheel from the bundle, else built from its source here
  if "$E/venv/bin/python" -c 'import pycuda' 2>/dev/null; then say "pycuda: already installed"; return 0; fi
  if ls "$E"/wheels/pycuda-*.whl >/dev/null 2>&1; then "${PIP[@]}" pycuda; say "pycuda: installed (prebuilt)"; return 0; fi
  ls "$E"/wheels/pycuda-*.tar.gz >/dev/null 2>&1 || { say "pycuda: not in the bundle"; return 0; }
  local cuda=${CUDA_HOME:-/usr/local/cuda} missing=() inc
  [ -x "$cuda/bin/nvcc" ] || command -v nvcc >/dev/null \
    || missing+=("CUDA on PATH ($cuda/bin/nvcc: apt-get install nvidia-jetpack, or cuda-toolkit)")
  inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$inc/Python.h" ] || missing+=("the Python headers ($inc/Python.h: apt-get install python3-dev)")
  command -v g++ >/dev/null || missing+=("a C++ compiler (apt-get install g++)")
  if [ ${#missing[@]} -gt 0 ]; then
    say "pycuda NOT built; missing: $(printf '%s; ' "${missing[@]}")"
    say "  engine packages cannot load until it is (ONNX packages run); install those, then run $0 again"
    return 0
  fi
  say "pycuda: building from the bundle's source against $cuda (a few minutes)"
  PATH=$cuda/bin:$PATH CUDA_ROOT=$cuda "${PIP[@]}" pycuda || say "pycuda: the build failed (above)"
}
[ "${TARGET#jetson}" = "$TARGET" ] || pycuda

install -d -o edged -g edged -m 0750 /var/lib/edged
for m in "$E"/models/*.tar; do
  [ -e "$m" ] || continue
  runuser -u edged -- "$E/venv/bin/edged" model install "$m" -c /etc/edged/edged.yaml \
    || echo "firstboot: $(basename "$m") not installed (above: why); the store keeps what it has"
done
say "edged doctor (as the edged user):"
if ! runuser -u edged -- "$E/venv/bin/edged" doctor -c /etc/edged/edged.yaml; then
  die "a required check failed (the FAIL lines above): edged.service is NOT enabled. Fix it, then run $0 --enable"
fi
touch "$E/.installed"
if [ "$ENABLE" = 1 ]; then
  systemctl enable edged.service
  systemctl start --no-block edged.service || say "edged.service is enabled; starting it now failed (above)"
fi
