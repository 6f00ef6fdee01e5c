#!/bin/bash
# edged deploy bundle installer. Run from the unpacked bundle:
#
#   sudo ./install.sh                    install onto this (running) device and start edged
#   sudo ./install.sh --no-start         install, enable, do not start
#   sudo ./install.sh --root DIR         lay the bundle into a rootfs (an L4T Linux_for_Tegra/rootfs)
#                                        before flashing: nothing is run for the target; a first-boot
#                                        one-shot (edged-firstboot.service) makes the venv there, runs
#                                        `edged doctor` and enables edged.service when it passes
#   sudo ./install.sh --device-id ID     the device id for a new /etc/edged/edged.yaml (default: hostname)
#   sudo ./install.sh --uninstall        remove what this installer installed (config, keys and
#                                        /var/lib/edged state stay)
#
# Upgrades keep /etc/edged/edged.yaml and /var/lib/edged (the model store, the spool).
# On a device, `edged doctor` runs after the install; a failing required check leaves edged disabled
# (exit 1). Jetson bundles need JetPack 6 (L4T R36, Python 3.10); JetPack 5 is refused.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")"
ROOT=/ START=1 UNINSTALL=0 DEVICE_ID=
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT=$(realpath -m "$2"); shift 2 ;;
    --no-start) START=0; shift ;;
    --uninstall) UNINSTALL=1; shift ;;
    --device-id) DEVICE_ID=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$SELF"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
R=${ROOT%/}
LIST=$R/opt/edged/installed-files
say() { echo "install.sh: $*"; }
on_target() { [ "$ROOT" = / ]; }

if [ "$UNINSTALL" = 1 ]; then
  [ -f "$LIST" ] || { echo "install.sh: nothing recorded in $LIST; nothing to remove" >&2; exit 1; }
  if on_target; then
    systemctl disable --now edged.service 2>/dev/null || true
  fi
  while read -r f; do rm -f "$R$f"; done < "$LIST"
  rm -rf "$R/opt/edged"
  rmdir "$R/etc/systemd/system/edged.service.d" 2>/dev/null || true
  rm -f "$R/etc/systemd/system/multi-user.target.wants/edged.service" \
        "$R/etc/systemd/system/multi-user.target.wants/edged-firstboot.service"
  on_target && systemctl daemon-reload
  say "removed edged; /etc/edged (config, keys, credentials) and /var/lib/edged (models, spool) are kept"
  exit 0
fi

say "checking the bundle's files"
sha256sum --quiet -c SHA256SUMS || { echo "install.sh: the bundle is corrupt (SHA256SUMS)" >&2; exit 1; }
TARGET=$(sed -n 's/.*"target": *"\([^"]*\)".*/\1/p' bundle.json | head -1)
MACHINE=$(sed -n 's/.*"machine": *"\([^"]*\)".*/\1/p' bundle.json | head -1)
release=$(sed -n 's/^# R\([0-9]*\) (release).*/\1/p' "$R/etc/nv_tegra_release" 2>/dev/null || true)
if [ "${TARGET#jetson}" != "$TARGET" ]; then
  if [ -n "$release" ] && [ "$release" -lt 36 ]; then
    echo "install.sh: $R is L4T R$release (JetPack 5 or older, Python 3.8); edged needs JetPack 6 (L4T R36," \
         "Ubuntu 22.04, Python 3.10). Flash JetPack 6 first." >&2
    exit 1
  fi
  if [ ! -e "$R/usr/bin/python3.10" ]; then
    echo "install.sh: $R has no /usr/bin/python3.10: this bundle is for JetPack 6 (Ubuntu 22.04, Python 3.10);" \
         "JetPack 5 ships Python 3.8, which edged does not support" >&2
    exit 1
  fi
  if on_target && [ "$(uname -m)" != "${MACHINE:-aarch64}" ]; then
    echo "install.sh: this bundle's wheels are for ${MACHINE:-aarch64}, this machine is $(uname -m)" >&2
    exit 1
  fi
fi

mkdir -p "$R/opt/edged"
: > "$LIST.new"
put() { # put MODE SRC DEST: install one file, record it
  install -D -m "$1" "$2" "$R$3"
  echo "$3" >> "$LIST.new"
}
put 0644 systemd/edged.service /etc/systemd/system/edged.service
put 0644 systemd/edged-rollback.service /etc/systemd/system/edged-rollback.service
put 0644 systemd/edged-firstboot.service /etc/systemd/system/edged-firstboot.service
put 0644 systemd/sysusers.d/edged.conf /usr/lib/sysusers.d/edged.conf
put 0644 systemd/tmpfiles.d/edged.conf /usr/lib/tmpfiles.d/edged.conf
put 0755 firstboot.sh /opt/edged/firstboot.sh
put 0644 docs/edged.1 /usr/share/man/man1/edged.1
put 0644 docs/operator.md /opt/edged/docs/operator.md
if [ -n "$release" ] && [ -f "systemd/devices/l4t-r$release.conf" ]; then
  put 0644 "systemd/devices/l4t-r$release.conf" /etc/systemd/system/edged.service.d/devices.conf
elif [ "${TARGET#jetson}" != "$TARGET" ]; then
  say "warning: no L4T release found under $R/etc/nv_tegra_release; the GPU device drop-in is not installed"
fi
for k in keys/*.pub; do [ -e "$k" ] && put 0644 "$k" "/etc/edged/keys/$(basename "$k")"; done
mkdir -p "$R/opt/edged/wheels" "$R/opt/edged/models"
cp wheels/* "$R/opt/edged/wheels/"
cp requirements.txt bundle.json "$R/opt/edged/"
for m in models/*.tar; do [ -e "$m" ] && cp "$m" "$R/opt/edged/models/"; done
if [ ! -f "$R/etc/edged/edged.yaml" ]; then   # an upgrade keeps the device's config
  id=${DEVICE_ID:-$(on_target && hostname || echo FIRSTBOOT-HOSTNAME)}
  install -D -m 0640 config/edged.yaml "$R/etc/edged/edged.yaml"
  sed -i "s/^device_id: .*/device_id: $id/" "$R/etc/edged/edged.yaml"
  say "wrote $R/etc/edged/edged.yaml (device_id $id)"
else
  say "kept $R/etc/edged/edged.yaml"
fi
mv "$LIST.new" "$LIST"

# python3-systemd gives the daemon's journal lines their priority and fields (CAMERA, EDGED_MODEL, ERROR_CODE);
# without it `journalctl -p err` and `journalctl CAMERA=dock` find nothing. The venv sees the system's.
if [ ! -f "$R/usr/lib/python3/dist-packages/systemd/journal.py" ]; then
  if ! on_target; then
    say "note: $R has no python3-systemd (logs would lack priority and fields): chroot $R apt-get install python3-systemd"
  elif command -v apt-get >/dev/null && timeout 300 apt-get install -y -q python3-systemd >/dev/null; then
    say "installed python3-systemd (journald priorities and fields)"
  else
    say "warning: python3-systemd is not installed and apt-get could not install it: logs reach the journal" \
        "without priority or fields; apt-get install python3-systemd"
  fi
fi

if ! on_target; then
  # Nothing runs for the target here: the first boot makes the venv, installs the model, runs
  # `edged doctor`, and enables edged.service only when no required check fails.
  mkdir -p "$R/etc/systemd/system/multi-user.target.wants"
  ln -sf /etc/systemd/system/edged-firstboot.service "$R/etc/systemd/system/multi-user.target.wants/edged-firstboot.service"
  say "laid out into $R; edged-firstboot.service finishes the install on the device's first boot" \
      "(and enables edged once edged doctor passes)"
  exit 0
fi
if ! /opt/edged/firstboot.sh; then
  echo "install.sh: edged is installed but NOT enabled or started: see the doctor's FAIL lines above" >&2
  exit 1
fi
systemctl daemon-reload
systemctl enable edged.service >/dev/null
if [ "$START" = 1 ]; then
  systemctl restart edged.service   # Type=notify: returns once the model is loaded and warm
  say "edged is running: systemctl status edged"
else
  say "installed and enabled; start it with: systemctl start edged"
fi
