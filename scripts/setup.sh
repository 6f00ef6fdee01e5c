#!/usr/bin/env bash
# Set up a development/demo environment on Debian or Ubuntu: system packages (when missing),
# a virtualenv in .venv with edged and its dev tools, and the demo models and video.
# Sourced by demo.sh and test.sh; safe to run again (everything is cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_sub >/dev/null || need+=(mosquitto-clients)  # mosquitto_sub/_pub, README's subscribe examples
command -v npm >/dev/null || need+=(npm)
command -v systemd-analyze >/dev/null || need+=(systemd)  # unit checks only; systemd is never booted here
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's mosquitto package may start a system broker; ours run on their own ports, so leave it be.

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import edged.daemon, pytest, jsonschema, mypy' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.edged-installed ]; then
  echo "setup: installing edged and its dev tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
  touch .venv/.edged-installed
fi
.venv/bin/edged model fetch-demo
