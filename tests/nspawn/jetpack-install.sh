#!/bin/bash
# Install a jetson-jp6 bundle into a JetPack-layout rootfs (tests/nspawn/jetpack-rootfs.sh) the way a
# device gets it: `install.sh --root` into the rootfs (nothing run for the target), then the first
# boot's work (`firstboot.sh --enable`: venv from the bundle's wheels with the system site-packages,
# cuda-python among them, the model, `edged doctor`) in a chroot, offline (no network namespace). Never boots systemd. The cached rootfs is
# the read-only lower layer of an overlay in a private mount and network namespace: nothing is
# written into the cache, and every mount disappears with this script.
#
#   sudo tests/nspawn/jetpack-install.sh ROOTFS BUNDLE_DIR OUT_DIR
#
# OUT_DIR gets install.log, firstboot.log (+ .rc), doctor.json (+ .rc), doctor-trt.txt (+ .rc),
# firstboot-trt.log (+ .rc), probe.txt and enabled (the wants link, if firstboot enabled edged).
set -euo pipefail
ROOTFS=$1 BUNDLE=$2 OUT=$3
[ "$(id -u)" = 0 ] || { echo "jetpack-install: must run as root" >&2; exit 2; }
[ -x "$ROOTFS/usr/bin/python3.10" ] || { echo "jetpack-install: $ROOTFS is not a finished rootfs" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
W=$(mktemp -d "$OUT/overlay.XXXXXX")
exec unshare --mount --net --fork --propagation private bash -s "$ROOTFS" "$BUNDLE" "$OUT" "$W" <<'INNER'
set -euo pipefail
ROOTFS=$1 BUNDLE=$2 OUT=$3 W=$4
mkdir -p "$W/upper" "$W/work" "$W/root"
mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$W/upper,workdir=$W/work" "$W/root"
R=$W/root
# The one file of JetPack's nvidia-l4t-core that the installer and the doctor read.
printf '%s\n' "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024" \
  "# KERNEL_VARIANT: oot" > "$R/etc/nv_tegra_release"
echo jetpack-test > "$R/etc/hostname"
"$BUNDLE/install.sh" --root "$R" --device-id orin-test >"$OUT/install.log" 2>&1
mount -t proc proc "$R/proc"
mount --bind /dev "$R/dev"
ip link set lo up 2>/dev/null || true
in_root() { chroot "$R" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"; }
set +e
in_root /opt/edged/firstboot.sh --enable >"$OUT/firstboot.log" 2>&1; echo $? >"$OUT/firstboot.rc"
[ -L "$R/etc/systemd/system/multi-user.target.wants/edged.service" ] && touch "$OUT/enabled"
in_root runuser -u edged -- /opt/edged/venv/bin/edged doctor -c /etc/edged/edged.yaml --json >"$OUT/doctor.json" 2>"$OUT/doctor.err"
echo $? >"$OUT/doctor.rc"
in_root runuser -u edged -- /opt/edged/venv/bin/python -c '
import cv2, numpy, onnxruntime
print("numpy", numpy.__version__, numpy.__file__)
print("cv2", cv2.__version__, cv2.__file__)
print("onnxruntime", onnxruntime.__version__)
print("cv2 on numpy:", cv2.resize(numpy.zeros((4, 4, 3), numpy.uint8), (2, 2)).shape)
import cuda.bindings.driver as d  # imports without a GPU or libcuda
print("cuda-bindings", d.__file__)
try:
    print("cuInit:", d.cuInit(0))
except Exception as exc:  # no libcuda here: the first driver call says so
    print("cuInit:", type(exc).__name__, exc)
' >"$OUT/probe.txt" 2>&1
# A model that needs TensorRT (built on the device): the doctor fails it, and the first boot refuses to enable edged.
in_root env EDGED_MODEL__BUILD_ON_DEVICE=true runuser -u edged -- /opt/edged/venv/bin/edged doctor -c /etc/edged/edged.yaml \
  >"$OUT/doctor-trt.txt" 2>&1
echo $? >"$OUT/doctor-trt.rc"
rm -f "$R/opt/edged/.installed" "$R/etc/systemd/system/multi-user.target.wants/edged.service"
sed -i 's/^  keys_dir: \/etc\/edged\/keys/  keys_dir: \/etc\/edged\/keys\n  build_on_device: true/' "$R/etc/edged/edged.yaml"
in_root /opt/edged/firstboot.sh --enable >"$OUT/firstboot-trt.log" 2>&1; echo $? >"$OUT/firstboot-trt.rc"
[ -L "$R/etc/systemd/system/multi-user.target.wants/edged.service" ] && touch "$OUT/enabled-trt"
umount "$R/dev" "$R/proc"
umount "$R"
exit 0
INNER
