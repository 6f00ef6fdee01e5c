#!/bin/bash
# The part of the install that runs on the device itself (install.sh calls it on a running device;
# edged-firstboot.service calls it, with --enable, on the first boot of a flashed rootfs): the edged
# user and folders, the virtual environment from the bundle's wheels (seeing the system site-packages,
# where JetPack's TensorRT and GStreamer OpenCV and python3-systemd live; on a Jetson with cuda-python,
# the TensorRT backend's CUDA binding, from its wheel: nothing compiles here), the initial model, then `edged doctor` as the edged user. A failing
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

cuda_binding() { # the TensorRT backend's CUDA binding: cuda-python (requirements.txt, installed above), or a
  # prebuilt pycuda wheel the bundle was given (--wheelhouse); importing either needs no GPU, its first call does
  local py=$E/venv/bin/python v where
  if ls "$E"/wheels/pycuda-*.whl >/dev/null 2>&1 && ! "$py" -c 'import pycuda' 2>/dev/null; then
    if "${PIP[@]}" pycuda; then say "pycuda: installed from the bundle's prebuilt wheel (offline)"
    else say "pycuda: installing the bundle's prebuilt wheel failed (above)"; fi
  fi
  if v=$("$py" -c 'import cuda.bindings.driver as d, importlib.metadata as m
print(m.version("cuda-bindings"), d.__file__.rsplit("/cuda/", 1)[0])' 2>&1); then
    where=${v#* } v=${v%% *}
    if [ "${where#"$E/venv/"}" != "$where" ]; then
      say "cuda-python: cuda-bindings $v installed from the bundle's wheels (offline; nothing compiled)"
    else
      say "cuda-python: cuda-bindings $v from $where (already on the system; the bundle's wheel was not needed)"
    fi
  elif ls "$E"/wheels/cuda_bindings-*.whl >/dev/null 2>&1; then
    say "cuda-python: the bundle's cuda-bindings does not import: ${v##*$'\n'}"
  else
    say "cuda-python: not in this bundle (engine packages need cuda-bindings or pycuda; ONNX packages run)"
  fi
}
[ "${TARGET#jetson}" = "$TARGET" ] || cuda_binding

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
