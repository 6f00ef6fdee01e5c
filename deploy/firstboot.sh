#!/bin/bash
# The part of the install that runs on the device itself (install.sh calls it on a running device;
# edged-firstboot.service calls it on the first boot of a flashed rootfs): the edged user and
# folders, the virtual environment from the bundle's wheels (seeing the system site-packages, where
# JetPack's TensorRT and GStreamer OpenCV and python3-systemd live), and the initial model.
set -euo pipefail
E=/opt/edged
systemd-sysusers /usr/lib/sysusers.d/edged.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/edged.conf
if grep -q '^device_id: FIRSTBOOT-HOSTNAME' /etc/edged/edged.yaml 2>/dev/null; then
  sed -i "s/^device_id: FIRSTBOOT-HOSTNAME/device_id: $(hostname)/" /etc/edged/edged.yaml
fi
chgrp edged /etc/edged/edged.yaml
if [ ! -x "$E/venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$E/venv"
fi
"$E/venv/bin/python" -m pip install -q --no-index --find-links "$E/wheels" --disable-pip-version-check \
  -r "$E/requirements.txt"
"$E/venv/bin/python" -m pip install -q --no-index --find-links "$E/wheels" --disable-pip-version-check \
  --no-deps --force-reinstall "$(ls "$E"/wheels/edged-*.whl)"
install -d -o edged -g edged -m 0750 /var/lib/edged
for m in "$E"/models/*.tar; do
  [ -e "$m" ] || continue
  runuser -u edged -- "$E/venv/bin/edged" model install "$m" -c /etc/edged/edged.yaml \
    || echo "firstboot: $(basename "$m") not installed (above: why); the store keeps what it has"
done
touch "$E/.installed"
