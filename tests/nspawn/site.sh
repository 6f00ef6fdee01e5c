#!/bin/bash
# Runs INSIDE the throwaway container after e2e.sh, in the same boot (edged installed and stopped):
# the site as shipped. First docs/operator.md "A secured site from zero", its sh blocks verbatim
# ($P/from-zero.sh, made by tests/nspawn/from_zero.py; step 1's names set to this container's):
# certificates with the installed `edged certs`, mosquitto with systemd/mosquitto/edged.conf and
# edged.acl, the device's identity through LoadCredential= (root-only files edged itself cannot read),
# start, results over TLS with the backend identity. Then: `edged push` (the installed one, backend
# certificate) to a signed v4 that commits; the broker restarted with nothing lost (seq, one boot_id);
# a camera's password through the unit's cam_door LoadCredential= line, grepped for in the journal,
# every retained message and every message heard; a revoked device refused. One PASS/FAIL line per check.
# Payload (read-only at /srv/payload): from-zero.sh, src/systemd/mosquitto/, v4.tar.
set -u
U=edged.service
fail=0
ok()  { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
prop() { systemctl show -P "$1" "$U"; }
waitfor() { local end=$((SECONDS + $1)); shift; until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.3; done; }
E=/opt/edged/venv/bin/edged
PY=/opt/edged/venv/bin/python
CFG=/etc/edged/edged.yaml
P=/srv/payload
T0=$SECONDS

# ---- docs/operator.md "A secured site from zero", its sh blocks verbatim ---------------------------
# from-zero.sh is those blocks in order (tests/nspawn/from_zero.py), step 1's names set to this
# container's: the certificates made here with the installed edged, the shipped mosquitto files from
# $P/src, the device identity through the LoadCredential= drop-in, start, results over TLS.
$PY - <<'EOF'
import yaml
path = "/etc/edged/edged.yaml"
doc = yaml.safe_load(open(path))
# quick probation for the push below; its latency/output judges are tested elsewhere (a loaded CI box)
doc["model"].update(probation_s=3, probation_batches=20, probation_latency_ratio=0, probation_output_ratio=0)
yaml.safe_dump(doc, open(path, "w"), sort_keys=False)
# what `edged push -c` uses: the same file with the broker and the backend's identity
doc["mqtt"] = {"host": "127.0.0.1", "port": 8883, "tls": {
    "ca_file": "/root/pki/ca.crt", "cert_file": "/root/pki/backend.crt", "key_file": "/root/pki/backend.key"}}
yaml.safe_dump(doc, open("/root/backend.yaml", "w"), sort_keys=False)
EOF
CUR=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
J() { journalctl --no-pager --cursor="$CUR" -u "$U" "$@"; }
cd /root
# the doc's broker is a name: a site has DNS, this container only /etc/hosts
getent hosts localhost >/dev/null || echo '127.0.0.1 localhost' >> /etc/hosts
echo "INFO: localhost is $(getent hosts localhost | head -1)"
t=$SECONDS
PATH=/opt/edged/venv/bin:$PATH bash $P/from-zero.sh > /tmp/fromzero.out 2> /tmp/fromzero.err
rc=$?
grep '^PASS: ' /tmp/fromzero.out
if [ $rc = 0 ]; then ok "the doc's secured site from zero ran verbatim in $((SECONDS - t)) s"
else bad "from zero stopped at $(grep -- '^--- step' /tmp/fromzero.err | tail -1): $(tail -8 /tmp/fromzero.err | paste -sd'|')"
  J -o cat | tail -10; tail -5 /var/log/mosquitto/mosquitto.log; exit 1; fi
n=$(grep -c '"seq"' /tmp/fromzero.out)
[ "$n" = 3 ] && ok "results over TLS at the backend (step 6's mosquitto_sub read $n, device cert via LoadCredential=)" \
  || bad "step 6 read $n results"
n=$(grep -c '  ok, ' /tmp/fromzero.out)
[ "$n" = 5 ] && ok "edged certs status in step 2: CA, CRL, server, backend, device all ok" || bad "certs status: $n ok"
if ss -ltn 2>/dev/null | grep -q ':8883 ' || grep -q ':22B3 ' /proc/net/tcp /proc/net/tcp6; then
  ok "mosquitto listens on 8883 with the shipped edged.conf and edged.acl ($(stat -c %a:%G /etc/mosquitto/certs/server.key) server.key)"
else bad "mosquitto with the shipped config: $(systemctl is-active mosquitto); $(tail -5 /var/log/mosquitto/mosquitto.log)"; fi
[ "$(ps -o user= -C mosquitto | head -1)" = mosquitto ] && ok "mosquitto dropped root" || bad "mosquitto runs as $(ps -o user= -C mosquitto)"
TLS=(-h 127.0.0.1 -p 8883 --cafile pki/ca.crt)
BACK=("${TLS[@]}" --cert pki/backend.crt --key pki/backend.key)
mosquitto_sub -h 127.0.0.1 -p 1883 -t '#' -C 1 -W 2 >/dev/null 2>&1 && bad "a plain listener answers" \
  || ok "no plain MQTT: only TLS with a client certificate"
# the drop-in's LoadCredential= lines are exactly the unit's commented ones
if [ "$(grep '^LoadCredential=tls_' /etc/systemd/system/$U.d/tls.conf)" = "$(sed -n 's/^#\(LoadCredential=tls_.*\)$/\1/p' /etc/systemd/system/$U)" ]; then
  ok "drop-in: the unit's 3 commented LoadCredential= lines of the broker identity"
else bad "the doc's drop-in and the unit's commented lines differ"; fi
runuser -u edged -- cat /etc/edged/secrets/device.key >/dev/null 2>&1 && bad "edged reads the key file itself" \
  || ok "the edged user cannot read /etc/edged/secrets (root 0700)"

# ---- edged push (installed, inside the container, backend certificate) to v4, until it commits ----
t=$SECONDS
if $E push $P/v4.tar --device e2e-01 --wait commit --timeout 120 -c /root/backend.yaml > /tmp/push.log 2>&1; then
  ok "edged push v4 --wait commit in $((SECONDS - t)) s: $(tail -1 /tmp/push.log)"
else bad "edged push: $(tail -15 /tmp/push.log)"; fi
# the config names ${CREDENTIALS_DIRECTORY} (the camera below): a command run beside the service sets
# it to the service's (docs/operator.md, Broker security)
L() { runuser -u edged -- env CREDENTIALS_DIRECTORY=/run/credentials/$U $E model list -c $CFG 2>&1; }
L | grep -q '4 (current' && ok "store: $(L)" || bad "store after push: $(L)"
J -o cat | grep -q 'blazeface-back@4 passed probation.*committed' && ok "journal: $(J -o cat | grep -m1 'passed probation')" \
  || bad "no commit in the journal: $(J -o cat | grep -i probation | tail -3)"

# ---- the broker restarted mid-run: nothing lost, counted by seq within one boot_id -----------------
# a backend subscriber with a persistent session (QoS 1) keeps its queue across the restart
pid=$(prop MainPID)
rm -f /tmp/seq.json
mosquitto_sub "${BACK[@]}" -i e2e-seq -c -q 1 -t 'edged/e2e-01/results/#' > /tmp/seq.json 2>/tmp/seq.err &
SUB=$!
waitfor 30 sh -c '[ $(wc -l < /tmp/seq.json) -ge 10 ]' || bad "the counting subscriber got $(wc -l < /tmp/seq.json) results"
CUR2=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
# a restart with an outage that spans results: stopped until the daemon's STATUS= shows at least 5
# results waiting in its spool, then started (a bare `systemctl restart` is over in ~0.2 s, a frame or two)
export DOWN_AT=$EPOCHREALTIME
systemctl stop mosquitto
before=$(wc -l < /tmp/seq.json)
waitfor 30 sh -c "systemctl show -P StatusText $U | grep -Eq 'spool ([5-9]|[1-9][0-9]+)'" \
  && ok "broker down: $(prop StatusText | grep -Eo 'broker [a-z]+|spool [0-9]+' | paste -sd' ')" \
  || bad "no results spooled while the broker was down: $(prop StatusText)"
systemctl start mosquitto
waitfor 20 sh -c "ss -ltn 2>/dev/null | grep -q ':8883 ' || grep -q ':22B3 ' /proc/net/tcp /proc/net/tcp6"
export UP_AT=$EPOCHREALTIME
if waitfor 60 sh -c "[ \$(wc -l < /tmp/seq.json) -ge $((before + 30)) ]"; then
  ok "results continue after the broker restart ($before before, $(wc -l < /tmp/seq.json) in all)"
else bad "after the broker restart: $(wc -l < /tmp/seq.json) results (had $before); $(tail -3 /tmp/seq.err)"; fi
kill $SUB 2>/dev/null; wait $SUB 2>/dev/null
if $PY - <<'EOF'
import datetime as dt, json, os, sys
rows = [json.loads(l) for l in open("/tmp/seq.json") if l.strip()]
boots = {r["boot_id"] for r in rows}
seqs = sorted({r["seq"] for r in rows})
missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs)) if seqs else []
down, up = float(os.environ["DOWN_AT"]), float(os.environ["UP_AT"])
at = lambda r: dt.datetime.fromisoformat(r["captured_at"].replace("Z", "+00:00")).timestamp()
outage = sorted({r["seq"] for r in rows if down <= at(r) <= up})
print(f"  {len(rows)} results, seq {seqs[0] if seqs else '-'}..{seqs[-1] if seqs else '-'}, {len(rows) - len(seqs)} duplicates, "
      f"{len(missing)} missing {missing[:10]}, boot_ids {len(boots)}; {len(outage)} captured while the broker was down "
      f"({up - down:.1f} s)")
sys.exit(0 if rows and len(boots) == 1 and not missing and len(outage) >= 5 else 1)
EOF
then ok "nothing lost across the broker restart: every seq present, one boot_id, the outage's results spooled and delivered"
else bad "results lost across the broker restart (or none captured during it)"; fi
journalctl --no-pager --cursor="$CUR2" -u $U -o cat | grep -q 'mqtt: disconnected' \
  && ok "journal: the daemon saw the broker go ($(journalctl --no-pager --cursor="$CUR2" -u $U -o cat | grep -m1 -o 'mqtt: disconnected ([^)]*)'))" \
  || bad "the daemon never noticed the broker restart"
[ "$(prop MainPID)" = "$pid" ] && ok "the daemon rode out the broker restart (same MainPID)" || bad "MainPID $pid -> $(prop MainPID)"

# ---- secrets never leave the device: a camera's password through LoadCredential=, then grepped for ---
# an RTSP camera whose user is in the URI and whose password is in a root-only file handed over by the
# unit's commented cam_door line. A tiny RTSP server answers every request 401 (Basic) and notes what
# it got: the daemon's probe (no credentials) and FFmpeg's retry with them, at each reconnect. Neither
# string may appear in the journal (the unit's and the whole), any retained message, or any message the
# backend heard meanwhile (events included); the camera's host:port must (proof the lines were there).
T1=$SECONDS
CAMU=camuser$RANDOM$RANDOM CAMPW=campw$RANDOM$RANDOM CAMAT=127.0.0.1:18554
printf '%s\n' "$CAMPW" > /etc/edged/secrets/cam_door.password && chmod 0600 /etc/edged/secrets/cam_door.password
{ echo '[Service]'; sed -n 's/^#\(LoadCredential=cam_door:.*\)$/\1/p' /etc/systemd/system/$U; } > /etc/systemd/system/$U.d/cam.conf
grep -q '^LoadCredential=cam_door:/etc/edged/secrets/cam_door.password$' /etc/systemd/system/$U.d/cam.conf \
  || bad "no cam_door line in the unit: $(cat /etc/systemd/system/$U.d/cam.conf)"
rm -f /tmp/rtsp.log
python3 - > /tmp/rtsp.err 2>&1 <<'EOF' &
import socketserver
class H(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            lines = []
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                lines.append(line.decode("latin-1").strip())
            if not lines:
                return
            auth = next((l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("authorization:")), "-")
            cseq = next((l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("cseq:")), "1")
            with open("/tmp/rtsp.log", "a") as f:
                f.write(f"{lines[0].split()[0]} {auth}\n")
            self.wfile.write(f'RTSP/1.0 401 Unauthorized\r\nCSeq: {cseq}\r\nWWW-Authenticate: Basic realm="door"\r\n\r\n'.encode())
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("127.0.0.1", 18554), H).serve_forever()
EOF
RTSP=$!
CAMU=$CAMU CAMAT=$CAMAT $PY - <<'EOF'
import os, yaml
path = "/etc/edged/edged.yaml"
doc = yaml.safe_load(open(path))
doc["cameras"].append({"name": "door", "uri": f"rtsp://{os.environ['CAMU']}@{os.environ['CAMAT']}/stream1",
                       "password_file": "${CREDENTIALS_DIRECTORY}/cam_door", "stall_timeout_s": 3, "reconnect_max_s": 2})
yaml.safe_dump(doc, open(path, "w"), sort_keys=False)
EOF
systemctl daemon-reload
CUR3=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
mosquitto_sub "${BACK[@]}" -t 'edged/#' -v > /tmp/heard.txt 2>/dev/null &
EV=$!
systemctl restart $U || bad "restart with the door camera failed: $(J -o cat | tail -5)"
AUTH=$(printf '%s:%s' "$CAMU" "$CAMPW" | base64 -w0)
if waitfor 45 sh -c "[ \$(grep -c '^DESCRIBE -$' /tmp/rtsp.log 2>/dev/null || echo 0) -ge 3 ]"; then
  ok "camera door fails and retries: $(grep -c '^DESCRIBE -$' /tmp/rtsp.log) probes, $(wc -l < /tmp/rtsp.log) RTSP requests answered 401"
else bad "camera door: $(cat /tmp/rtsp.log 2>&1 | sort | uniq -c | head -5) $(tail -3 /tmp/rtsp.err)"; fi
grep -q "^[A-Z]* Basic $AUTH\$" /tmp/rtsp.log && ok "the password from LoadCredential= reached the camera (Basic user:password seen by the server)" \
  || bad "the camera never got the credentials: $(sort /tmp/rtsp.log | uniq -c | cut -c1-80 | paste -sd'|')"
waitfor 10 sh -c "mosquitto_sub $(printf '%q ' "${BACK[@]}") -t edged/e2e-01/telemetry -C 1 -W 3 | grep -q '\"door\".*\"down\"'" \
  || echo "INFO: telemetry never showed door down"
kill $EV $RTSP 2>/dev/null; wait $EV $RTSP 2>/dev/null
mosquitto_sub "${BACK[@]}" -t '#' --retained-only -v -W 3 > /tmp/retained.txt 2>/dev/null
journalctl --no-pager -u $U -o verbose > /tmp/j-unit.txt
journalctl --no-pager -o verbose > /tmp/j-all.txt
grep '^edged/e2e-01/events ' /tmp/heard.txt > /tmp/events.txt
secret() { # secret WHAT FILE [NEED]: neither the user nor the password in FILE; NEED (if given) in it
  if grep -q -e "$CAMU" -e "$CAMPW" -e "$AUTH" "$2"; then bad "$1 holds the camera's credentials: $(grep -m1 -o -e ".\{0,60\}$CAMU.\{0,20\}" -e ".\{0,60\}$CAMPW.\{0,20\}" "$2")"
  elif [ -n "${3:-}" ] && ! grep -q -e "$3" "$2"; then bad "$1 ($(wc -l < "$2") lines) never names the camera ($3)"
  else ok "redaction: $1 ($(wc -l < "$2") lines) has neither the camera's user nor password${3:+, and names $3 ($(grep -c -e "$3" "$2") lines)}"; fi
}
secret "journalctl -u edged" /tmp/j-unit.txt "$CAMAT"
secret "the whole journal" /tmp/j-all.txt "$CAMAT"
secret "every retained message (backend, '#')" /tmp/retained.txt "$CAMAT"
secret "every message the backend heard on edged/# meanwhile" /tmp/heard.txt "$CAMAT"
secret "the events" /tmp/events.txt
grep -q '^edged/e2e-01/telemetry .*rtsp://\*\*\*@' /tmp/retained.txt && ok "retained telemetry shows the door camera as rtsp://***@$CAMAT" \
  || echo "INFO: retained telemetry: $(grep -o '"door"[^}]*' /tmp/retained.txt | head -1 | cut -c1-200)"
echo "INFO: the redaction checks took $((SECONDS - T1)) s"

# ---- a revoked device is refused -------------------------------------------------------------------
$E certs revoke pki/e2e-01.crt --dir pki >/dev/null && $E certs crl --dir pki >/dev/null \
  && install -m 0644 pki/crl.pem /etc/mosquitto/certs/ && systemctl kill -s HUP mosquitto \
  && ok "revoked e2e-01 (edged certs revoke, edged certs crl, SIGHUP)" || bad "revoke"
CUR=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
systemctl restart $U
mosquitto_sub "${BACK[@]}" -t 'edged/e2e-01/results/#' -C 1 -W 8 > /tmp/revoked.json 2>/dev/null &
R=$!
if waitfor 30 sh -c "journalctl --no-pager --cursor='$CUR' -u $U -o cat | grep -qi 'cannot connect.*certificate.revoked'"; then
  ok "the broker refuses the revoked device (journal: $(J -o cat | grep -i -m1 'cannot connect.*certificate.revoked' | grep -o 'cannot connect.*' | cut -c1-150))"
else bad "no revocation in the journal: $(J -o cat | tail -5)"; fi
wait $R
[ ! -s /tmp/revoked.json ] && ok "the revoked device publishes nothing (backend heard no result in 8 s)" \
  || bad "results from a revoked device: $(head -c 200 /tmp/revoked.json)"
systemctl is-active --quiet $U && ok "edged stays up, retrying with backoff" || bad "edged $(prop ActiveState)"
systemctl stop $U
echo "INFO: site checks took $((SECONDS - T0)) s"
exit $fail
