#!/usr/bin/env bash
# Set up a development/demo environment on Debian or Ubuntu: system packages (when missing),
# a virtualenv in .venv with edged, its CPU extras (ONNX Runtime and OpenCV from PyPI: edged[cpu]) and its dev
# tools, and the demo models and video.
# Sourced by demo.sh and test.sh; safe to run again (everything is cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_sub >/dev/null || need+=(mosquitto-clients)  # mosquitto_sub/_pub, docs/subscriber.md's examples
[ -f /usr/include/mosquitto_plugin.h ] || need+=(mosquitto-dev)  # headers: tests/test_suback.py builds a broker plugin that refuses a SUBSCRIBE
command -v npm >/dev/null || need+=(npm)
command -v systemd-analyze >/dev/null || need+=(systemd)  # unit checks only; systemd is never booted here
# The GStreamer capture path (daemon/capture/gstreamer/pipeline.py) and its tests: GStreamer, its plugins, PyGObject, and
# gst-rtsp-server for the tests' RTSP camera; plugins-ugly for x264enc, the clip encoder (daemon/capture/encoded.py).
gst_pkgs=(gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
  gstreamer1.0-plugins-ugly gstreamer1.0-libav python3-gi gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gir1.2-gst-rtsp-server-1.0)
gst_pkgs+=(python3-systemd)  # daemon/host/systemd.py: libsystemd's sd_notify and journald, as on the device
for p in "${gst_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's mosquitto package may start a system broker; ours run on their own ports, so leave it be.

# nginx for the tests of package downloads over HTTP (tests/test_mirror.py start their own, on 127.0.0.1
# with a config in a temporary folder). Installed with a policy-rc.d that forbids starting services, so
# Debian's package starts no system nginx; one already there (a container's) is kept as it is.
if ! [ -x /usr/sbin/nginx ]; then
  echo "setup: installing nginx-light (no service started)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  own_policy=""
  if ! [ -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nginx-light >/dev/null || rc=$?
  [ -z "$own_policy" ] || $sudo rm -f /usr/sbin/policy-rc.d
  [ "${rc:-0}" = 0 ] || exit "$rc"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import edged.daemon, onnxruntime, cv2, pytest, jsonschema, mypy' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.edged-installed ]; then
  echo "setup: installing edged and its dev tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[cpu,dev]'  # ONNX Runtime and OpenCV from PyPI
  touch .venv/.edged-installed
fi

# PyGObject for the venv (which has no system site-packages): Debian's own `gi`, and only it, through a
# .pth. It is built against this system's libgirepository and GStreamer, the same ones JetPack's venv
# (--system-site-packages, DESIGN §1) uses, and needs no compiler; a pip PyGObject would need
# libgirepository1.0-dev, libcairo2-dev and a C toolchain, and PyGObject >= 3.51 needs a newer GLib than
# Debian 12's. Only where the venv's Python is another minor version than /usr/bin/python3 (the C
# extension would not load) is it built from PyPI.
sys_gi=$(/usr/bin/python3 -c 'import gi, os; print(os.path.dirname(gi.__file__))' 2>/dev/null || true)
sys_ver=$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])' 2>/dev/null || true)
venv_ver=$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')
if ! .venv/bin/python -W ignore -c 'import gi' 2>/dev/null; then
  if [ -n "$sys_gi" ] && [ "$sys_ver" = "$venv_ver" ]; then
    echo "setup: linking Debian's PyGObject ($sys_gi) into .venv"
    mkdir -p .venv/system-gi
    ln -sfn "$sys_gi" .venv/system-gi/gi
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$PWD/.venv/system-gi" > "$site/edged-system-gi.pth"
  else
    echo "setup: building PyGObject for .venv (Python $venv_ver, system $sys_ver)"
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      libgirepository1.0-dev libcairo2-dev pkg-config gcc >/dev/null
    .venv/bin/python -m pip install -q --disable-pip-version-check 'PyGObject<3.51'
  fi
fi

# python3-systemd the same way (daemon/host/systemd.py uses it where importable, its own sd_notify elsewhere).
sys_sd=$(/usr/bin/python3 -c 'import systemd.daemon, os; print(os.path.dirname(systemd.__file__))' 2>/dev/null || true)
if [ -n "$sys_sd" ] && [ "$sys_ver" = "$venv_ver" ] && ! .venv/bin/python -c 'import systemd.daemon' 2>/dev/null; then
  echo "setup: linking Debian's python3-systemd ($sys_sd) into .venv"
  mkdir -p .venv/system-systemd
  ln -sfn "$sys_sd" .venv/system-systemd/systemd
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$PWD/.venv/system-systemd" > "$site/edged-system-systemd.pth"
fi

.venv/bin/edged model fetch-demo
