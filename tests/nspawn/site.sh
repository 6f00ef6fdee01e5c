#!/bin/bash
# Runs INSIDE the throwaway container after e2e.sh, in the same boot (edged installed and stopped):
# the site as shipped. mosquitto gets systemd/mosquitto/edged.conf and edged.acl verbatim and the
# certificates `edged certs` made on the host (CA, server, device e2e-01, backend), installed with the
# commands of docs/operator.md "Broker security"; the device's identity reaches edged through systemd
# credentials (the shipped unit's commented LoadCredential= lines, uncommented in a drop-in), so edged
# itself cannot read the key files. Then: results over TLS with the backend identity; `edged push`
# (the installed one, backend certificate) to a signed v4 that commits; the broker restarted with
# nothing lost (seq, one boot_id); a revoked device refused. One PASS/FAIL line per check.
# Payload (read-only at /srv/payload): pki/ (from `edged certs`), mosquitto/edged.conf + edged.acl, v4.tar.
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

# ---- the broker, as docs/operator.md "Broker security" installs it --------------------------------
cp -r $P/pki /root/pki && cd /root
install -d /etc/mosquitto/certs
install -m 0644 pki/ca.crt pki/server.crt pki/crl.pem /etc/mosquitto/certs/
install -m 0640 -g mosquitto pki/server.key /etc/mosquitto/certs/
install -m 0644 $P/mosquitto/edged.conf /etc/mosquitto/conf.d/edged.conf
install -m 0644 $P/mosquitto/edged.acl /etc/mosquitto/edged.acl
systemctl restart mosquitto
if waitfor 15 sh -c "ss -ltn 2>/dev/null | grep -q ':8883 ' || grep -q ':22B3 ' /proc/net/tcp /proc/net/tcp6"; then
  ok "mosquitto listens on 8883 with the shipped edged.conf and edged.acl ($(stat -c %a:%G /etc/mosquitto/certs/server.key) server.key)"
else bad "mosquitto with the shipped config: $(systemctl is-active mosquitto); $(tail -5 /var/log/mosquitto/mosquitto.log)"; exit 1; fi
[ "$(ps -o user= -C mosquitto | head -1)" = mosquitto ] && ok "mosquitto dropped root" || bad "mosquitto runs as $(ps -o user= -C mosquitto)"
TLS=(-h 127.0.0.1 -p 8883 --cafile pki/ca.crt)
BACK=("${TLS[@]}" --cert pki/backend.crt --key pki/backend.key)
mosquitto_sub -h 127.0.0.1 -p 1883 -t '#' -C 1 -W 2 >/dev/null 2>&1 && bad "a plain listener answers" \
  || ok "no plain MQTT: only TLS with a client certificate"

# ---- the device's identity through systemd credentials --------------------------------------------
install -d -m 0700 /etc/edged/secrets
install -m 0600 pki/ca.crt /etc/edged/secrets/ca.crt
install -m 0600 pki/e2e-01.crt /etc/edged/secrets/device.crt
install -m 0600 pki/e2e-01.key /etc/edged/secrets/device.key
{ echo '[Service]'; sed -n 's/^#\(LoadCredential=tls_.*\)$/\1/p' /etc/systemd/system/$U; } > /etc/systemd/system/$U.d/tls.conf
n=$(grep -c '^LoadCredential=tls_' /etc/systemd/system/$U.d/tls.conf)
[ "$n" = 3 ] && ok "drop-in: the unit's 3 commented LoadCredential= lines of the broker identity" || bad "drop-in has $n lines"
runuser -u edged -- cat /etc/edged/secrets/device.key >/dev/null 2>&1 && bad "edged reads the key file itself" \
  || ok "the edged user cannot read /etc/edged/secrets (root 0700)"
$PY - <<'EOF'
import yaml
path = "/etc/edged/edged.yaml"
doc = yaml.safe_load(open(path))
creds = "${CREDENTIALS_DIRECTORY}"
doc["mqtt"] = {"host": "127.0.0.1", "port": 8883, "tls": {
    "ca_file": f"{creds}/tls_ca.crt", "cert_file": f"{creds}/tls_device.crt", "key_file": f"{creds}/tls_device.key"}}
# quick probation for the push below; its latency/output judges are tested elsewhere (a loaded CI box)
doc["model"].update(probation_s=3, probation_batches=20, probation_latency_ratio=0, probation_output_ratio=0)
yaml.safe_dump(doc, open(path, "w"), sort_keys=False)
# what `edged push -c` uses: the same file with the backend's identity
doc["mqtt"]["tls"] = {"ca_file": "/root/pki/ca.crt", "cert_file": "/root/pki/backend.crt", "key_file": "/root/pki/backend.key"}
yaml.safe_dump(doc, open("/root/backend.yaml", "w"), sort_keys=False)
EOF
systemctl daemon-reload
CUR=$(journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p')
J() { journalctl --no-pager --cursor="$CUR" -u "$U" "$@"; }
systemctl start $U || { bad "start failed"; J | tail -20; }

# ---- results over TLS, read with the backend's identity -------------------------------------------
if mosquitto_sub "${BACK[@]}" -t 'edged/e2e-01/results/#' -C 3 -W 30 > /tmp/tls.json; then
  ok "results over TLS at the backend ($(wc -l < /tmp/tls.json) read, device cert via LoadCredential=)"
else bad "no results over TLS in 30 s"; J -o cat | tail -20; tail -5 /var/log/mosquitto/mosquitto.log; fi

# ---- edged push (installed, inside the container, backend certificate) to v4, until it commits ----
t=$SECONDS
if $E push $P/v4.tar --device e2e-01 --wait commit --timeout 120 -c /root/backend.yaml > /tmp/push.log 2>&1; then
  ok "edged push v4 --wait commit in $((SECONDS - t)) s: $(tail -1 /tmp/push.log)"
else bad "edged push: $(tail -15 /tmp/push.log)"; fi
# the config names ${CREDENTIALS_DIRECTORY} now: a command run beside the service sets it to the
# service's (docs/operator.md, Broker security)
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
