#!/usr/bin/env bash
# The demo: set everything up, start a local mosquitto, run the daemon on the demo config for
# about 20 s while `edged watch` prints what arrives over MQTT, and write an annotated snapshot.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

mkdir -p .demo
port=18830
broker_pid=""
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" > .demo/mosquitto.conf
  mosq=$(command -v mosquitto || echo /usr/sbin/mosquitto)
  "$mosq" -c .demo/mosquitto.conf >.demo/mosquitto.log 2>&1 &
  broker_pid=$!
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  echo "demo: mosquitto on 127.0.0.1:$port (pid $broker_pid)"
else
  echo "demo: using the broker already listening on 127.0.0.1:$port"
fi
cleanup() { [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true; }
trap cleanup EXIT

video=~/.cache/edged/demo/video/demo.mp4
.venv/bin/edged watch -c examples/demo.yaml --duration 24 --only-detections \
  --snapshot demo-snapshot.jpg --video "$video" &
watch_pid=$!
sleep 1
echo "demo: running the daemon for 20 s (log: .demo/daemon.log)"
.venv/bin/edged run -c examples/demo.yaml --duration 20 2>.demo/daemon.log || { tail -20 .demo/daemon.log; exit 1; }
wait "$watch_pid"
echo
grep -E " INFO .*(loaded on|serving [0-9]+ camera|stopped cleanly)" .demo/daemon.log | sed 's/^/daemon: /'
tail -1 .demo/daemon.log | sed 's/^/daemon: /'
echo "demo: annotated snapshot written to $(pwd)/demo-snapshot.jpg"
