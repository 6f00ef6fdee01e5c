#!/bin/bash
# Make (once) and cache an Ubuntu 22.04 rootfs with the Python layout of a JetPack 6 image: the base
# JetPack 6 is built on (Ubuntu 22.04, Python 3.10), python3-numpy 1.x and python3-opencv (built with
# GStreamer, against numpy 1.x) in /usr/lib/python3/dist-packages, python3-venv, gst-inspect-1.0.
# What JetPack adds on top (TensorRT's bindings, CUDA, the NVIDIA GStreamer elements, nv_tegra_release)
# is NOT there: this machine has no GPU and no NVIDIA packages, so the doctor must say so.
# x86_64 (the packages this machine can execute); the JetPack 6 arm64 rootfs has the same layout.
#
#   sudo tests/nspawn/jetpack-rootfs.sh      prints the rootfs path; never boots or chroots into it
set -euo pipefail
CACHE=${EDGED_NSPAWN_CACHE:-/var/cache/edged-nspawn}
ROOTFS=$CACHE/rootfs-jammy-jetpack-layout
MIRROR=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
# dbus-user-session: debootstrap does not resolve dconf-service's "default-dbus-session-bus | dbus-session-bus"
INCLUDE=python3,python3-venv,python3-numpy,python3-opencv,gstreamer1.0-tools,systemd,util-linux,ca-certificates,dbus,dbus-user-session
die() { echo "jetpack-rootfs: ERROR: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root"
command -v debootstrap >/dev/null || die "needs debootstrap (apt-get install debootstrap)"
if [ -x "$ROOTFS/usr/bin/python3.10" ]; then echo "$ROOTFS"; exit 0; fi
[ ! -e "$ROOTFS" ] || die "$ROOTFS exists but is not a finished rootfs; remove it by hand"
mkdir -p "$CACHE"
part=$ROOTFS.partial
rm -rf --one-file-system "$part"
keyring=$CACHE/ubuntu-archive-keyring.gpg
if [ ! -s "$keyring" ]; then  # Debian carries no Ubuntu keyring: take it from Ubuntu's own package
  tmp=$(mktemp -d)
  deb=ubuntu-keyring_2021.03.26_all.deb
  curl -fsSL -o "$tmp/$deb" "$MIRROR/pool/main/u/ubuntu-keyring/$deb" || die "cannot fetch $deb from $MIRROR"
  dpkg-deb -x "$tmp/$deb" "$tmp/x"
  cp "$tmp/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$keyring"
  rm -rf "$tmp"
fi
echo "jetpack-rootfs: debootstrap jammy -> $ROOTFS (once, a few minutes; needs $MIRROR)" >&2
debootstrap --variant=minbase --components=main,universe --keyring="$keyring" --include="$INCLUDE" \
  jammy "$part" "$MIRROR" >"$CACHE/debootstrap-jammy.log" 2>&1 \
  || die "debootstrap failed, see $CACHE/debootstrap-jammy.log"
mv "$part" "$ROOTFS"
echo "$ROOTFS"
