#!/bin/bash
# Runs INSIDE the throwaway container (systemd is PID 1 there): a daemon whose only camera stops
# delivering is restarted by systemd (issue 26 item 3). The host deploy bundle installed with its
# install.sh; the camera an MJPEG server (tests/mjpeg_server.py, the bundle's Python) in a transient
# unit; inference.serving_timeout_s: 10 and WatchdogSec=4. One PASS/FAIL line per check; exit 1 if any
# failed. Payload (read-only at /srv/payload): bundle.tar, mjpeg_server.py.
set -u
U=edged.service
fail=0
ok()  { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
prop() { systemctl show -P "$1" "$U"; }
waitfor() { local end=$((SECONDS + $1)); shift; until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.3; done; }
CFG=/etc/edged/edged.yaml
PY=/opt/edged/venv/bin/python

[ "$(cat /proc/1/comm)" = systemd ] && ok "liveness: PID 1 is systemd" || bad "PID 1 is not systemd"
waitfor 20 systemctl is-active --quiet mosquitto || bad "no mosquitto"
if ! [ -x /opt/edged/venv/bin/edged ]; then  # not installed by an earlier test of this boot
  mkdir -p /tmp/lb && tar xf /srv/payload/bundle.tar -C /tmp/lb
  /tmp/lb/edged-bundle/install.sh --no-start --device-id e2e-01 > /tmp/liveness-install.log 2>&1 \
    || { bad "install.sh failed:"; cat /tmp/liveness-install.log; exit 1; }
fi
systemctl stop $U 2>/dev/null
cam() { systemd-run --unit=mjpeg-cam --quiet $PY /srv/payload/mjpeg_server.py 8090 --fps 10; }
cam
waitfor 20 sh -c "$PY -c 'import socket; socket.create_connection((\"127.0.0.1\", 8090), 1)' 2>/dev/null" \
  && ok "liveness: the MJPEG camera serves" || bad "no MJPEG camera: $(journalctl -u mjpeg-cam --no-pager | tail -5)"
sed -i -e 's|uri: synthetic://.*|uri: http://127.0.0.1:8090/\n    stall_timeout_s: 1\n    reconnect_max_s: 1|' \
  -e 's/fps_max: 5/fps_max: 10/' $CFG
printf 'inference:\n  serving_timeout_s: 10\n' >> $CFG
mkdir -p /etc/systemd/system/$U.d
printf '[Service]\nWatchdogSec=4\nRestartSec=1\nTimeoutAbortSec=3\n' > /etc/systemd/system/$U.d/liveness.conf
systemctl daemon-reload
systemctl reset-failed $U 2>/dev/null
CUR=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
J() { journalctl --no-pager --cursor="$CUR" -u "$U" "$@"; }

systemctl start $U && ok "liveness: edged started" || { bad "start failed"; J | tail -30; }
mosquitto_sub -h 127.0.0.1 -t 'edged/e2e-01/results/#' -C 3 -W 30 > /dev/null \
  && ok "liveness: results from the MJPEG camera" || { bad "no results in 30 s"; J | tail -20; }
n0=$(prop NRestarts) pid=$(prop MainPID)
sleep 12  # serving longer than serving_timeout_s: no restart while frames come
[ "$(prop NRestarts)" = "$n0" ] && [ "$(prop MainPID)" = "$pid" ] \
  && ok "liveness: no restart while the camera delivers" || bad "restarted while serving: NRestarts $(prop NRestarts)"

# ---- the camera stops delivering: not serving, so systemd restarts the daemon ------------------
systemctl stop mjpeg-cam
t=$SECONDS
if waitfor 60 sh -c "[ \$(systemctl show -P NRestarts $U) -gt $n0 ] && [ \$(systemctl show -P MainPID $U) != $pid ]"; then
  ok "liveness: no frame for serving_timeout_s: systemd restarted edged after $((SECONDS - t)) s (NRestarts $n0 -> $(prop NRestarts), MainPID $pid -> $(prop MainPID))"
else bad "no restart without frames (NRestarts $(prop NRestarts), $(prop ActiveState)/$(prop SubState))"; J | tail -20; fi
J -o cat | grep -q "not petting systemd's watchdog: serving: no camera has delivered a frame" \
  && ok "liveness: journal: $(J -o cat | grep -m1 "not petting" | cut -c1-160)" || bad "no 'not petting' line for serving"
J -o cat | grep -qi 'watchdog timeout' && ok "liveness: journal: systemd's watchdog timeout" || bad "no watchdog timeout"

# ---- the camera back: serving again, and it stays up ---------------------------------------------
cam
waitfor 30 systemctl is-active --quiet $U || bad "edged not active after the restart"
mosquitto_sub -h 127.0.0.1 -t 'edged/e2e-01/results/#' -C 3 -W 40 > /dev/null \
  && ok "liveness: results again once the camera is back" || { bad "no results after the camera came back"; J | tail -20; }
n1=$(prop NRestarts) pid=$(prop MainPID)
sleep 12
[ "$(prop NRestarts)" = "$n1" ] && [ "$(prop MainPID)" = "$pid" ] \
  && ok "liveness: stays up once serving again" || bad "restarted again: NRestarts $n1 -> $(prop NRestarts)"

systemctl stop $U mjpeg-cam
rm -f /etc/systemd/system/$U.d/liveness.conf
systemctl daemon-reload
exit $fail
