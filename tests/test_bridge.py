"""Broker tiers: a site mosquitto (the shipped edged.conf and edged.acl) bridged up to a central mosquitto
(edged.conf with the shipped central.acl) by the shipped systemd/mosquitto/bridge.conf, TLS both ways with
two CAs made by `edged certs`; only addresses, ports and file paths are rewritten. A real daemon on the
site broker; consumers and the backend's commands on the central broker; an outage of the central broker
counted by `seq`."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.models.demo import DemoAssets
from tests.conftest import DaemonProc, base_config, edged_cli, wait_until, write_config
from tests.test_site import SHIPPED, SiteBroker, acked, make_site

SITE = "site1"  # bridge.conf's and central.acl's example site


@dataclass
class Tiers:
    site_pki: Path  # the site's CA: its broker, devices and a local backend
    central_pki: Path  # the central CA: the central broker, the backend, each site's bridge identity


@pytest.fixture(scope="module")
def tiers() -> Iterator[Tiers]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mosquitto started as root drops to the mosquitto user, as on a site")
    try:
        user = pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no `mosquitto` user here (the Debian/Ubuntu package makes it)")
    site = make_site(("cam-01", "backend"))
    central = make_site(("backend",))
    r = edged_cli("certs", "device", f"bridge-{SITE}", "--dir", str(central / "certs"))
    assert r.returncode == 0, r.stderr
    # as bridge.conf says: the bridge's key readable by group mosquitto (the broker reads it after dropping root)
    key = central / "certs" / f"bridge-{SITE}.key"
    os.chown(key, 0, user.pw_gid)
    key.chmod(0o640)
    yield Tiers(site / "certs", central / "certs")
    shutil.rmtree(site, ignore_errors=True)
    shutil.rmtree(central, ignore_errors=True)


def bridge_conf(central: SiteBroker, pki: Path) -> str:
    """The shipped bridge.conf with the central broker's address and the bridge's files rewritten."""
    conf = (SHIPPED / "bridge.conf").read_text()
    for old, new in {
        "address central.example.net:8883\n": f"address 127.0.0.1:{central.port}\n",
        "bridge_cafile /etc/mosquitto/certs/central-ca.crt\n": f"bridge_cafile {pki}/ca.crt\n",
        "bridge_certfile /etc/mosquitto/certs/bridge.crt\n": f"bridge_certfile {pki}/bridge-{SITE}.crt\n",
        "bridge_keyfile /etc/mosquitto/certs/bridge.key\n": f"bridge_keyfile {pki}/bridge-{SITE}.key\n",
    }.items():
        assert conf.count(old) == 1, f"the shipped bridge.conf no longer has {old!r}: update this test"
        conf = conf.replace(old, new)
    return conf


class Bridged(SiteBroker):
    """The site broker: SiteBroker (shipped edged.conf + edged.acl) with the shipped bridge.conf in conf.d/."""

    def __init__(self, workdir: Path, tiers: Tiers, central: SiteBroker) -> None:
        super().__init__(workdir, tiers.site_pki.parent)
        include = next(line for line in self.conf.read_text().splitlines() if line.startswith("include_dir "))
        (Path(include.split(" ", 1)[1]) / "bridge.conf").write_text(bridge_conf(central, tiers.central_pki))


@pytest.fixture
def brokers(tmp_path: Path, tiers: Tiers) -> Iterator[tuple[SiteBroker, SiteBroker]]:
    (tmp_path / "central").mkdir()
    (tmp_path / "site").mkdir()
    central = SiteBroker(tmp_path / "central", tiers.central_pki.parent, acl=(SHIPPED / "central.acl").read_text())
    central.start()
    site = Bridged(tmp_path / "site", tiers, central)
    site.start()
    yield site, central
    site.stop()
    central.stop()


@dataclass
class Consumer:
    """A paho client over TLS (the backend's identity) recording what it gets; `persistent` keeps its
    session (and the broker's queue for it) across its own and the broker's restarts."""

    pki: Path
    port: int
    topics: tuple[str, ...]
    name: str = "backend"
    persistent: bool = False
    got: list[mqtt.MQTTMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"consumer-{time.time_ns()}", protocol=mqtt.MQTTv5)
        self.c.tls_set(str(self.pki / "ca.crt"), str(self.pki / f"{self.name}.crt"), str(self.pki / f"{self.name}.key"))
        self.c.reconnect_delay_set(1, 2)
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = lambda c, u, mid, rcs, p: (
            self.subscribed.set() if not any(r.is_failure for r in rcs) else None
        )
        self.c.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 600 if self.persistent else 0
        self.c.connect("127.0.0.1", self.port, clean_start=not self.persistent, properties=props)
        self.c.loop_start()
        wait_until(self.subscribed.is_set, 10, f"{self.topics} subscribed on the central broker")

    def _on_connect(self, c: mqtt.Client, u: Any, flags: Any, rc: Any, p: Any) -> None:
        if not flags.session_present:
            c.subscribe([(t, 1) for t in self.topics])

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append(msg)

    def on(self, suffix: str) -> list[mqtt.MQTTMessage]:
        with self.lock:
            return [m for m in self.got if m.topic == suffix or m.topic.endswith("/" + suffix)]

    def results(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(m.payload) for m in self.got if "/results/" in m.topic]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def consumers() -> Iterator[Callable[..., Consumer]]:
    made: list[Consumer] = []

    def make(*args: Any, **kw: Any) -> Consumer:
        made.append(Consumer(*args, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def site_device(site: SiteBroker, tiers: Tiers, demo: DemoAssets, tmp: Path) -> Path:
    """cam-01 on the site broker over TLS with its site certificate, the demo video at 10 fps."""
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 10}]
    doc = base_config(site, demo, tmp, cams, device_id="cam-01", state_dir=str(tmp / "cam-01"))
    pki = tiers.site_pki
    doc["mqtt"]["tls"] = {
        "ca_file": str(pki / "ca.crt"),
        "cert_file": str(pki / "cam-01.crt"),
        "key_file": str(pki / "cam-01.key"),
    }
    return write_config(tmp / "cam-01.yaml", doc)


def test_results_go_up_and_commands_come_down_through_the_bridge(
    brokers: tuple[SiteBroker, SiteBroker],
    tiers: Tiers,
    consumers: Callable[..., Consumer],
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    site, central = brokers
    up = consumers(
        tiers.central_pki,
        central.port,
        (
            "$share/central/edged/+/results/+",
            "edged/+/status",
            "edged/+/cmd/#",
            "edged/+/reply/#",
            "edged/+/snapshot/+",
            f"bridges/{SITE}/state",
        ),
    )
    d = start_daemon(site_device(site, tiers, demo, tmp_path))
    wait_until(lambda: len(up.results()) >= 5, 90, "cam-01's results on the central broker\n" + d.output()[-3000:])
    assert {r["device"] for r in up.results()} == {"cam-01"}
    status = up.on("cam-01/status")
    assert status and json.loads(status[-1].payload)["state"] == "online"
    wait_until(lambda: [m.payload for m in up.on(f"bridges/{SITE}/state")][-1:] == [b"1"], 10, "the bridge's state")
    # the backend on the central broker commands the device on the site broker: the default reply topic,
    # and an MQTT v5 response topic with correlation data, both bridged as sent
    up.c.publish("edged/cam-01/cmd/status", b"{}", qos=1)
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = "edged/cam-01/reply/central-1"
    props.CorrelationData = b"req-1"
    props.MessageExpiryInterval = 30
    up.c.publish("edged/cam-01/cmd/snapshot", b'{"camera": "lobby"}', qos=1, properties=props)
    wait_until(lambda: bool(up.on("cmd/status/reply")) and bool(up.on("reply/central-1")), 20, "both replies upstream")
    assert json.loads(up.on("cmd/status/reply")[0].payload)["ok"] is True
    snap = up.on("reply/central-1")[0]
    assert json.loads(snap.payload)["ok"] is True, snap.payload
    assert getattr(snap.properties, "CorrelationData", b"") == b"req-1"
    wait_until(lambda: bool(up.on("snapshot/lobby")), 10, "the snapshot JPEG upstream")
    assert up.on("snapshot/lobby")[0].payload[:2] == b"\xff\xd8"
    assert d.stop() == 0


def test_central_acl_confines_a_site_bridge(brokers: tuple[SiteBroker, SiteBroker], tiers: Tiers) -> None:
    """central.acl: the bridge's identity writes what its site's devices publish, never commands, OTA data
    or another site's state; the backend commands, and cannot forge results."""
    _, central = brokers
    bridge = Consumer(tiers.central_pki, central.port, ("edged/+/cmd/+",), name=f"bridge-{SITE}")
    backend = Consumer(tiers.central_pki, central.port, ("edged/#",))
    try:
        assert not acked(bridge.c, "edged/cam-01/results/lobby").is_failure
        assert not acked(bridge.c, "edged/cam-01/cmd/status/reply").is_failure
        for topic in ("edged/cam-01/cmd/status", "edged/cam-01/ota/data", "bridges/site2/state", "backend/x"):
            assert acked(bridge.c, topic).value == 0x87, topic
        assert not acked(backend.c, "edged/cam-01/cmd/status").is_failure
        assert acked(backend.c, "edged/cam-01/results/lobby").value == 0x87
        wait_until(lambda: bool(bridge.on("cmd/status")), 5, "the backend's command at the bridge identity")
    finally:
        bridge.close()
        backend.close()


def test_a_group_offer_and_the_push_fence_cross_the_bridge(
    brokers: tuple[SiteBroker, SiteBroker], tiers: Tiers
) -> None:
    """`edged push --group` against the central broker: its retained group offer comes down to the site (a
    device that was offline reads it there, retained) and its discovery fence comes back to it."""
    site, central = brokers
    backend = Consumer(tiers.central_pki, central.port, ("edged/_push/+/sync",))
    try:
        assert not acked(backend.c, "edged/_groups/dock/ota", b'{"offer": 1}', retain=True).is_failure
        assert not acked(backend.c, "edged/_push/0123456789abcdef/sync", b"fence").is_failure
        wait_until(lambda: bool(backend.on("_push/0123456789abcdef/sync")), 10, "the fence back at the pusher")

        def at_the_site() -> list[mqtt.MQTTMessage]:  # a device connecting at the site later: retained
            dev = Consumer(tiers.site_pki, site.port, ("edged/_groups/+/ota",), name="cam-01")
            try:
                wait_until(lambda: bool(dev.on("_groups/dock/ota")), 3, "the group offer at the site")
                return dev.on("_groups/dock/ota")
            except AssertionError:
                return []
            finally:
                dev.close()

        wait_until(lambda: bool(at_the_site()), 20, "the group's offer retained on the site broker")
        got = at_the_site()
        assert got[0].payload == b'{"offer": 1}' and got[0].retain
    finally:
        backend.close()


def outage(
    brokers: tuple[SiteBroker, SiteBroker],
    tiers: Tiers,
    consumers: Callable[..., Consumer],
    demo: DemoAssets,
    tmp: Path,
    start_daemon: Callable[..., DaemonProc],
    seconds: float,
) -> None:
    """The central broker stopped for `seconds` while cam-01 publishes on the site broker: every result the
    device published (seen by a backend on the site broker) reaches a persistent consumer on the central
    broker once it is back, counted by `seq` (one boot, no gap, none missing)."""
    site, central = brokers
    up = consumers(tiers.central_pki, central.port, ("edged/+/results/+",), persistent=True)
    local = consumers(tiers.site_pki, site.port, ("edged/+/results/+",))
    d = start_daemon(site_device(site, tiers, demo, tmp))
    wait_until(lambda: len(up.results()) >= 3, 90, "results on the central broker\n" + d.output()[-3000:])
    central.stop()
    down_at, before = time.monotonic(), len(local.results())
    wait_until(
        lambda: time.monotonic() - down_at >= seconds and len(local.results()) >= before + 20,
        seconds + 60,
        f"{seconds} s of results published on the site broker while the central one is down",
    )
    central.start()
    during = len(local.results()) - before
    wait_until(lambda: len(up.results()) >= before + during, 120, "the queued results delivered upstream")
    assert d.stop() == 0
    sent = {(r["boot_id"], r["seq"]) for r in local.results()}
    wait_until(lambda: sent <= {(r["boot_id"], r["seq"]) for r in up.results()}, 60, "the last results upstream")
    got = {(r["boot_id"], r["seq"]) for r in up.results()}
    assert len({b for b, _ in got}) == 1, "one boot of the daemon"
    seqs = sorted(s for _, s in got)
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "a gap in seq upstream"
    assert max(s for _, s in sent) == seqs[-1] and during >= 20, (during, len(sent), len(got))


def test_a_central_outage_loses_nothing(brokers, tiers, consumers, demo, tmp_path, start_daemon) -> None:
    outage(brokers, tiers, consumers, demo, tmp_path, start_daemon, seconds=2)


@pytest.mark.slow
def test_a_30_s_central_outage_loses_nothing(brokers, tiers, consumers, demo, tmp_path, start_daemon) -> None:
    outage(brokers, tiers, consumers, demo, tmp_path, start_daemon, seconds=30)
