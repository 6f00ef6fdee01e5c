"""The site as shipped: mosquitto started with systemd/mosquitto/edged.conf and edged.acl verbatim (only
the paths and the port rewritten, below), dropping root to the `mosquitto` user as it does on a site,
with certificates made by the real `edged certs` CLI; a real daemon, `edged push`, `edged watch` and a
backend consumer over TLS; and what the ACL refuses."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pwd
import shutil
import signal
import ssl
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.deploy import certs
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import REPO, Broker, DaemonProc, edged_cli, wait_until, write_config
from tests.test_ota import build, device_doc, install, serving
from tests.test_tls import client

SHIPPED = REPO / "systemd" / "mosquitto"


def make_site(devices: tuple[str, ...] = ("cam-01", "cam-02", "backend", "homeassistant")) -> Path:
    """A site folder the `mosquitto` user can traverse (pytest's own temporary folders are 0700), with
    the PKI a user makes with `edged certs`: the CA and its empty CRL, the broker's, the clients'."""
    d = Path(tempfile.mkdtemp(prefix="edged-site-"))
    d.chmod(0o755)
    made = (["device", dev] if dev != "backend" else ["backend"] for dev in devices)
    for args in (["ca"], ["server", "localhost", "127.0.0.1"], *made):
        r = edged_cli("certs", *args, "--dir", str(d / "certs"))
        assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mosquitto started as root drops to the mosquitto user, as on a site")
    try:
        pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no `mosquitto` user here (the Debian/Ubuntu package makes it)")
    d = make_site()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class SiteBroker(Broker):
    """mosquitto with the shipped edged.conf and edged.acl; only these lines are rewritten: the
    listener (a free port on 127.0.0.1), the certificate, CRL and ACL paths. edged.conf is included from
    conf.d/ of a main config that sets the persistence folder, as Debian's mosquitto.conf does.
    No `user` line: started as root, mosquitto drops to `mosquitto` before it reads the certificates."""

    def __init__(self, workdir: Path, site: Path, acl: str | None = None) -> None:
        super().__init__(workdir)
        run = site / f"run-{uuid.uuid4().hex[:8]}"
        (run / "data").mkdir(parents=True)
        run.chmod(0o755)
        user = pwd.getpwnam("mosquitto")
        os.chown(run / "data", user.pw_uid, user.pw_gid)
        shutil.copy(SHIPPED / "edged.acl", run / "edged.acl")
        if acl is not None:  # `edged certs acl --prefix ...` in place of the shipped one
            (run / "edged.acl").write_text(acl)
        conf = (SHIPPED / "edged.conf").read_text()
        pki = site / "certs"
        for old, new in {
            "listener 8883\n": f"listener {self.port} 127.0.0.1\n",
            "cafile /etc/mosquitto/certs/ca.crt\n": f"cafile {pki}/ca.crt\n",
            "certfile /etc/mosquitto/certs/server.crt\n": f"certfile {pki}/server.crt\n",
            "keyfile /etc/mosquitto/certs/server.key\n": f"keyfile {pki}/server.key\n",
            "crlfile /etc/mosquitto/certs/crl.pem\n": f"crlfile {pki}/crl.pem\n",
            "acl_file /etc/mosquitto/edged.acl\n": f"acl_file {run}/edged.acl\n",
        }.items():
            assert conf.count(old) == 1, f"the shipped edged.conf no longer has {old!r}: update this test"
            conf = conf.replace(old, new)
        # laid out as on Debian/Ubuntu: the package's mosquitto.conf (its persistence settings) includes
        # conf.d/, where docs/operator.md installs edged.conf
        (run / "conf.d").mkdir()
        (run / "conf.d" / "edged.conf").write_text(conf)
        self.conf.write_text(f"persistence true\npersistence_location {run}/data/\ninclude_dir {run}/conf.d\n")
        self.log = workdir / "broker.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=log)
        proc = self.proc
        wait_until(lambda: proc.poll() is not None or self._listening(), 10, "mosquitto to listen or exit")
        if proc.poll() is not None:
            pytest.fail(f"mosquitto exited ({proc.returncode}) with the shipped edged.conf:\n{self.log.read_text()}")


@pytest.fixture
def shipped(tmp_path: Path, site: Path) -> Iterator[SiteBroker]:
    (tmp_path / "broker").mkdir()
    b = SiteBroker(tmp_path / "broker", site)
    b.start()
    yield b
    b.stop()


Client = tuple[mqtt.Client, list[mqtt.MQTTMessage]]


@pytest.fixture
def connect(site: Path) -> Iterator[Callable[[SiteBroker, str], Client]]:
    made: list[mqtt.Client] = []

    def make(b: SiteBroker, name: str) -> Client:
        c, got = client(site / "certs", name, b.port)
        made.append(c)
        wait_until(c.is_connected, 10, f"{name} connected over TLS")
        return c, got

    yield make
    for c in made:
        c.disconnect()
        c.loop_stop()


def acked(c: mqtt.Client, topic: str, payload: bytes = b"{}", retain: bool = False) -> Any:
    """Publish at QoS 1 and return the PUBACK's reason code (0x87 Not authorized when the ACL refuses)."""
    codes: dict[int, Any] = {}
    c.on_publish = lambda cl, u, mid, rc, p: codes.__setitem__(mid, rc)
    info = c.publish(topic, payload, qos=1, retain=retain)
    wait_until(lambda: info.mid in codes, 5, f"the PUBACK for {topic}")
    return codes[info.mid]


def subscribed(c: mqtt.Client, *topics: str) -> None:
    done: list[Any] = []
    c.on_subscribe = lambda cl, u, mid, rcs, p: done.append(rcs)
    c.subscribe([(t, 1) for t in topics])
    wait_until(lambda: bool(done), 5, f"SUBACK for {topics}")


def topics(got: list[mqtt.MQTTMessage]) -> list[str]:
    return [m.topic for m in list(got)]


def test_a_fresh_site_starts_with_the_shipped_config_and_certs(shipped: SiteBroker, site: Path, connect) -> None:
    pki = site / "certs"
    key = (pki / "server.key").stat()
    assert stat.S_IMODE(key.st_mode) == 0o640 and key.st_gid == pwd.getpwnam("mosquitto").pw_gid
    assert stat.S_IMODE((pki / "ca.key").stat().st_mode) == 0o600  # the CA's key stays root's
    crl = x509.load_pem_x509_crl((pki / "crl.pem").read_bytes())
    assert len(crl) == 0 and crl.next_update_utc is not None
    assert shipped.proc is not None
    uid = next(
        line.split()[2]
        for line in Path(f"/proc/{shipped.proc.pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert int(uid) == pwd.getpwnam("mosquitto").pw_uid, "mosquitto must have dropped root"
    backend, _ = connect(shipped, "backend")
    assert backend.is_connected()


def backend_config(b: SiteBroker, site: Path, doc: dict[str, Any], path: Path) -> Path:
    """The same config with the backend's identity: what `edged push -c` and `edged watch -c` use."""
    pki = site / "certs"
    tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "backend.crt"), "key_file": str(pki / "backend.key")}
    return write_config(path, {**doc, "mqtt": {"host": b.host, "port": b.port, "tls": tls}})


def test_every_flow_through_the_shipped_acl(
    shipped: SiteBroker,
    site: Path,
    connect,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    pki = site / "certs"
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/#")
    doc = device_doc(shipped, demo, tmp_path, "cam-01")
    doc["groups"] = ["dock"]
    doc["telemetry"] = {"interval_s": 1}
    doc["homeassistant"] = {"enabled": True}
    tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "cam-01.crt"), "key_file": str(pki / "cam-01.key")}
    doc["mqtt"]["tls"] = tls
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    ha, ha_seen = connect(shipped, "homeassistant")  # Home Assistant's MQTT integration, its own identity
    subscribed(ha, "homeassistant/#", "edged/+/status", "edged/+/ha/+")
    d = start_daemon(cfg)

    def on(suffix: str) -> list[mqtt.MQTTMessage]:
        return [m for m in list(seen) if m.topic == f"edged/cam-01/{suffix}"]

    # the device's publications reach the backend: results, retained status, telemetry, model state
    wait_until(lambda: len(on("results/lobby")) >= 3, 60, "results at the backend\n" + d.output())
    wait_until(lambda: bool(on("telemetry")) and bool(on("model/state")), 10, "telemetry and model/state")
    assert json.loads(on("status")[0].payload)["state"] == "online"
    # Home Assistant discovery through the shipped ACL: the device's discovery configs, its camera's
    # state and its availability reach Home Assistant's identity (which reads nothing else of it)
    wait_until(lambda: "edged/cam-01/ha/lobby" in topics(ha_seen), 20, "the camera's Home Assistant state")
    configs = [m for m in list(ha_seen) if m.topic.startswith("homeassistant/sensor/cam-01/")]
    assert configs and all(m.topic.endswith("/config") for m in configs), topics(ha_seen)
    docs = [json.loads(m.payload) for m in configs]  # the camera's sensors, and the device's diagnostic ones
    assert all(d["state_topic"] == "edged/cam-01/ha/lobby" for d in docs if "entity_category" not in d)
    assert {d["state_topic"] for d in docs if "entity_category" in d} == {
        "edged/cam-01/telemetry",
        "edged/cam-01/status",
    }
    assert "edged/cam-01/status" in topics(ha_seen)
    assert not any("/results/" in t or "/telemetry" in t for t in topics(ha_seen))
    ha_seen.clear()  # the configs are retained: a Home Assistant that (re)subscribes gets them again
    subscribed(ha, "homeassistant/sensor/cam-01/+/config")
    wait_until(lambda: len(ha_seen) >= len(configs), 10, "the retained discovery configs")
    assert all(m.retain for m in ha_seen) and {m.topic for m in ha_seen} == {m.topic for m in configs}
    # a command and its replies: the default reply topic, and a response topic in the device's namespace
    backend.publish("edged/cam-01/cmd/status", b"{}", qos=1)
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = "edged/cam-01/reply/backend-7"
    props.CorrelationData = b"req-7"
    backend.publish("edged/cam-01/cmd/snapshot", b'{"camera": "lobby"}', qos=1, properties=props)
    wait_until(lambda: bool(on("cmd/status/reply")) and bool(on("reply/backend-7")), 10, "both replies")
    assert json.loads(on("cmd/status/reply")[0].payload)["ok"] is True
    # QoS 1 is at least once: a reply may arrive twice (a redelivery), but it is one reply to one command
    replies = on("reply/backend-7")
    assert len({m.payload for m in replies}) == 1, [m.payload for m in replies]
    snap_reply = replies[0]
    assert (
        json.loads(snap_reply.payload)["ok"] is True
        and getattr(snap_reply.properties, "CorrelationData", b"") == b"req-7"
    )
    wait_until(lambda: bool(on("snapshot/lobby")), 10, "the snapshot JPEG")
    assert on("snapshot/lobby")[0].payload[:2] == b"\xff\xd8"
    # `edged watch` with the backend's identity prints the device's results
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    watch = edged_cli("watch", "-c", str(ops), "--count", "2", "--duration", "30", timeout=60)
    assert watch.returncode == 0 and "watch: 2 results" in watch.stderr, watch.stdout + watch.stderr
    # `edged push` with the backend's identity: group discovery (retained status), the offer
    # (cmd/ota), the chunks (ota/data), the device's requests, status and its reply on reply/_push/<id>
    v2 = build(demo, tmp_path, signer, 2)
    r = edged_cli("push", str(v2), "--group", "dock", "-c", str(ops), "--timeout", "120", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr + d.output()[-3000:]
    assert "1 of 1 device(s) succeeded" in r.stderr
    wait_until(
        lambda: any(json.loads(m.payload)["model"]["version"] == 2 for m in on("results/lobby")), 60, "v2 results"
    )
    # the last will: a device that dies says so through the broker
    killed = time.time()
    d.stop(signal.SIGKILL)
    wait_until(lambda: json.loads(on("status")[-1].payload)["state"] == "offline", 10, "the last will")
    # `edged fleet` through the shipped ACL: the dead device is offline since the broker published its will
    # (the will's Message Expiry Interval says when), not since some earlier status
    r = edged_cli("fleet", "-c", str(ops), "--format", "json", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = [x for x in json.loads(r.stdout) if x["device"] == "cam-01"]
    assert row["state"] == "offline" and row["model"] == "blazeface-back@2", row
    since = dt.datetime.fromisoformat(row["since"].replace("Z", "+00:00")).timestamp()
    assert killed - 2 <= since <= time.time() + 1, (row, killed)


def test_a_canary_wave_through_the_shipped_acl(
    shipped: SiteBroker,
    site: Path,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """`edged push --group dock --canary 1` with the backend's identity to two devices behind the shipped
    ACL: the canary installs, passes its probation and commits, then the second wave; both end on v2."""
    pki = site / "certs"
    doc: dict[str, Any] = {}
    daemons = []
    for dev in ("cam-01", "cam-02"):
        doc = device_doc(shipped, demo, tmp_path, dev, probation_s=3, probation_batches=10, probation_latency_ratio=3)
        doc["groups"] = ["dock"]
        doc["cameras"][0]["fps_max"] = 5
        tls = {
            "ca_file": str(pki / "ca.crt"),
            "cert_file": str(pki / f"{dev}.crt"),
            "key_file": str(pki / f"{dev}.key"),
        }
        doc["mqtt"]["tls"] = tls
        cfg = write_config(tmp_path / f"{dev}.yaml", doc)
        install(cfg, build(demo, tmp_path, signer, 1))
        daemons.append(start_daemon(cfg))
    for d in daemons:
        serving(d)
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    v2 = build(demo, tmp_path, signer, 2)
    r = edged_cli("push", str(v2), "--group", "dock", "--canary", "1", "-c", str(ops), "--timeout", "120", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr + "".join(d.output()[-2000:] for d in daemons)
    assert "group 'dock': 2 online" in r.stderr and "2 of 2 device(s) succeeded" in r.stderr, r.stderr
    assert r.stderr.index("canaries committed") < r.stderr.index("2 of 2"), r.stderr
    for d in daemons:
        assert d.stop() == 0
    for dev in ("cam-01", "cam-02"):
        assert os.readlink(tmp_path / dev / "models" / "blazeface-back" / "current").endswith("2"), dev


def test_the_shipped_acl_confines_each_device(shipped: SiteBroker, connect) -> None:
    backend, seen = connect(shipped, "backend")
    cam1, got1 = connect(shipped, "cam-01")
    cam2, got2 = connect(shipped, "cam-02")
    subscribed(backend, "edged/#")
    subscribed(cam1, "edged/cam-01/cmd/+", "edged/cam-01/ota/data")
    subscribed(cam2, "edged/cam-01/#", "edged/+/cmd/#")  # the broker filters what it may not deliver
    denied = 135  # PUBACK 0x87 Not authorized
    # another device cannot publish into cam-01's topics, send it an OTA offer or OTA data
    assert acked(cam2, "edged/cam-01/results/lobby", b'{"forged": true}').value == denied
    assert acked(cam2, "edged/cam-01/cmd/ota", b'{"transfer": "x"}').value == denied
    assert acked(cam2, "edged/cam-01/ota/data", b"\x00\x02{}").value == denied
    assert acked(cam2, "edged/cam-01/status", b'{"state": "offline"}').value == denied
    # nor announce entities or states in Home Assistant in its name
    assert acked(cam2, "homeassistant/sensor/cam-01/x/config").value == denied
    assert acked(cam2, "edged/cam-01/ha/lobby").value == denied
    assert not acked(cam2, "homeassistant/sensor/cam-02/x/config", b"").is_failure
    # nor can a device command itself or feed itself OTA data, nor the backend forge a device's results
    assert acked(cam1, "edged/cam-01/cmd/ota", b'{"transfer": "x"}').value == denied
    assert acked(cam1, "edged/cam-01/ota/data", b"\x00\x02{}").value == denied
    assert acked(backend, "edged/cam-01/results/lobby", b'{"forged": true}').value == denied
    # what each may do does work: cam-01 publishes its results, the backend commands and serves it
    assert not acked(cam1, "edged/cam-01/results/lobby", b'{"mine": true}').is_failure
    assert not acked(backend, "edged/cam-01/cmd/status").is_failure
    assert not acked(backend, "edged/cam-01/ota/data", b"\x00\x02{}").is_failure
    # each device answers an `edged push` offer on its own reply topic, never on another's (nor on the
    # shared one older pushers named, which let any device answer for any other)
    assert not acked(cam2, "edged/cam-02/reply/_push/0123456789abcdef").is_failure
    assert acked(cam2, "edged/cam-01/reply/_push/0123456789abcdef").value == denied
    assert acked(cam2, "edged/_push/0123456789abcdef/reply").value == denied
    wait_until(lambda: "edged/cam-01/cmd/status" in topics(got1), 5, "cam-01's own command")
    wait_until(lambda: "edged/cam-01/results/lobby" in topics(seen), 5, "cam-01's own result")
    # cam-02's own command, sent last, reaches it through the same subscription: whatever of cam-01's
    # the broker were to deliver wrongly would have come before it
    backend.publish("edged/cam-02/cmd/status", b"{}", qos=1)
    wait_until(lambda: "edged/cam-02/cmd/status" in topics(got2), 5, "cam-02's own command")
    assert topics(got1) == ["edged/cam-01/cmd/status", "edged/cam-01/ota/data"]
    assert [m.payload for m in seen if m.topic == "edged/cam-01/results/lobby"] == [b'{"mine": true}']
    assert "edged/cam-01/cmd/ota" not in topics(seen)
    assert topics(got2) == ["edged/cam-02/cmd/status"], "cam-02 must read neither cam-01's topics nor commands"


def test_a_crl_past_its_next_update_refuses_everyone_until_renewed(site: Path, tmp_path: Path) -> None:
    own = make_site(("backend",))  # its own CA: the module's site keeps its good CRL
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)
    certs.write_crl(own / "certs", days=1, valid_from=past)
    (tmp_path / "broker").mkdir()
    b = SiteBroker(tmp_path / "broker", own)
    b.start()
    try:
        with contextlib.suppress(ssl.SSLError, OSError):  # TLS 1.2 fails in connect(), 1.3 right after
            c, _ = client(own / "certs", "backend", b.port)
            wait_until(lambda: "certificate verify failed" in b.log.read_text(), 10, "the broker to refuse us")
            assert not c.is_connected()
            c.disconnect()
            c.loop_stop()
        assert "certificate verify failed" in b.log.read_text()
        assert edged_cli("certs", "crl", "--dir", str(own / "certs")).returncode == 0
        assert b.proc is not None
        b.proc.send_signal(signal.SIGHUP)  # mosquitto reads its CRL again (as the mosquitto user)
        wait_until(lambda: "Reloading config" in b.log.read_text(), 10, "mosquitto to reload")
        c, _ = client(own / "certs", "backend", b.port)
        wait_until(c.is_connected, 10, "the client accepted under the renewed CRL")
        c.disconnect()
        c.loop_stop()
    finally:
        b.stop()
        shutil.rmtree(own, ignore_errors=True)


def test_certs_status_warns_before_a_crl_or_certificate_ends(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    certs.make_ca(pki)
    certs.make_cert(pki, "server", hosts=["localhost"])
    certs.make_cert(pki, "cam-01", days=10)
    certs.make_cert(pki, "cam-old", days=30, valid_from=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=60))
    certs.write_crl(pki, days=3)
    r = edged_cli("certs", "status", "--dir", str(pki))
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert any(line.startswith("CRL") and "WARN: ends in" in line for line in out.splitlines()), out
    assert any(line.startswith("client cam-01") and "WARN: ends in" in line for line in out.splitlines()), out
    assert any(line.startswith("client cam-old") and "EXPIRED" in line for line in out.splitlines()), out
    assert any(line.startswith("server") and "ok," in line for line in out.splitlines()), out
    assert f"edged certs crl --dir {pki}" in r.stderr
    # renew the CRL, revoke the expired certificate, look 5 days ahead: nothing left to do
    for args in (["crl"], ["revoke", str(pki / "cam-old.crt")]):
        assert edged_cli("certs", *args, "--dir", str(pki)).returncode == 0
    r = edged_cli("certs", "status", "--dir", str(pki), "--warn-days", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "revoked" in next(line for line in r.stdout.splitlines() if line.startswith("client cam-old"))
    # a CRL past its next update, and none at all
    certs.write_crl(pki, days=1, valid_from=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2))
    r = edged_cli("certs", "status", "--dir", str(pki))
    assert r.returncode == 1 and "PAST its next update" in r.stdout, r.stdout
    (pki / "crl.pem").unlink()
    r = edged_cli("certs", "status", "--dir", str(pki))
    assert r.returncode == 1 and "crl.pem is missing" in r.stderr, r.stderr


def test_certs_refuses_a_client_name_that_is_no_topic_level_or_a_ca_file(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    certs.make_ca(pki)
    for name in ("server", "ca", "_push", "a/b", "cam+1"):
        r = edged_cli("certs", "device", name, "--dir", str(pki))
        assert r.returncode == 1 and "cannot be a client's name" in r.stderr, (name, r.stderr)
    assert not (pki / "server.crt").exists() and (pki / "ca.key").stat().st_size > 0


def test_the_backend_has_its_own_verb_and_no_device_takes_its_name(tmp_path: Path) -> None:
    """edged.acl gives the user `backend` every device's topics: `edged certs device backend` would hand
    those rights to a device, so it is refused and `edged certs backend` issues that certificate."""
    pki = tmp_path / "pki"
    certs.make_ca(pki)
    r = edged_cli("certs", "device", "backend", "--dir", str(pki))
    assert r.returncode == 1 and "edged certs backend" in r.stderr, r.stderr
    assert not (pki / "backend.crt").exists()
    r = edged_cli("certs", "backend", "--dir", str(pki), "--days", "30")
    assert r.returncode == 0, r.stderr
    cert = x509.load_pem_x509_certificate((pki / "backend.crt").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=backend"
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    assert stat.S_IMODE((pki / "backend.key").stat().st_mode) == 0o600
    assert "user backend\n" in (SHIPPED / "edged.acl").read_text()  # the principal it is for


def test_a_broker_key_without_the_mosquitto_group_says_what_to_run(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    certs.make_ca(pki)
    certs.make_cert(pki, "server", hosts=["localhost"])
    note = certs.share_with_broker(pki / "server.key", group="no-such-group-edged")
    assert "install -m 0640 -g no-such-group-edged server.key /etc/mosquitto/certs/" in note
    assert stat.S_IMODE((pki / "server.key").stat().st_mode) == 0o600


def test_the_shipped_acl_is_edged_certs_acl_for_the_default_prefix() -> None:
    r = edged_cli("certs", "acl")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (SHIPPED / "edged.acl").read_text(), "systemd/mosquitto/edged.acl: run `edged certs acl` > it"
    for bad in ("", "a/+/b", "x#", "a//b", "backend", "backend/x", "with space"):
        r = edged_cli("certs", "acl", "--prefix", bad)
        assert r.returncode == 1 and "cannot be a topic prefix" in r.stderr, (bad, r.stderr)


def test_an_acl_for_another_prefix_confines_devices_under_it(site: Path, tmp_path: Path, connect) -> None:
    """A site whose devices set mqtt.topic_prefix `site7/dock` runs mosquitto with `edged certs acl
    --prefix site7/dock`: each device writes under it, into no other device's topics, and no longer under
    `edged/`; the backend reads it all."""
    r = edged_cli("certs", "acl", "--prefix", "site7/dock")
    assert r.returncode == 0, r.stderr
    (tmp_path / "broker").mkdir()
    b = SiteBroker(tmp_path / "broker", site, acl=r.stdout)
    b.start()
    try:
        backend, seen = connect(b, "backend")
        subscribed(backend, "site7/dock/#")
        cam1, got1 = connect(b, "cam-01")
        subscribed(cam1, "site7/dock/cam-01/cmd/+")
        assert not acked(cam1, "site7/dock/cam-01/results/lobby", b'{"mine": true}').is_failure
        assert not acked(cam1, "site7/dock/cam-01/reply/_push/0123456789abcdef").is_failure
        assert acked(cam1, "site7/dock/cam-02/reply/_push/0123456789abcdef").value == 0x87
        assert acked(cam1, "site7/dock/cam-02/results/lobby").value == 0x87
        assert acked(cam1, "edged/cam-01/results/lobby").value == 0x87  # the shipped prefix is not this site's
        assert acked(cam1, "site7/dock/cam-01/cmd/status").value == 0x87
        assert not acked(backend, "site7/dock/cam-01/cmd/status").is_failure
        assert acked(backend, "site7/dock/cam-01/results/lobby").value == 0x87
        wait_until(lambda: "site7/dock/cam-01/cmd/status" in topics(got1), 5, "the backend's command at cam-01")
        wait_until(lambda: "site7/dock/cam-01/results/lobby" in topics(seen), 5, "cam-01's result at the backend")
        assert [m.payload for m in seen if m.topic == "site7/dock/cam-01/results/lobby"] == [b'{"mine": true}']
    finally:
        b.stop()
