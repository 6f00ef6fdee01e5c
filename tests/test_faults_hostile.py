"""Hostile input and memory admission (issue 21): what a peer or a package can do to a device must be
refused with a clear code, without the device's memory or disk growing and without blaming the model
that serves. Real mosquitto (with the shipped ACL where it matters), real daemons, real ONNX Runtime,
real tar files."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
from onnx import helper, numpy_helper
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.daemon.host.governor import admit
from edged.daemon.lifecycle.manager import activation_mb, estimate_mb
from edged.errors import EngineLoadError, PackageError
from edged.models.demo import DemoAssets
from edged.models.footprint import activation_bytes
from edged.models.package import open_package, pack_tar, write_package
from edged.models.rebatch import rebatch
from edged.models.signing import SigningKey, TrustStore
from edged.models.store import Store
from edged.protocol.ota import pack_chunk
from tests.conftest import REPO, Broker, base_config, free_port, wait_until, write_config
from tests.test_ota import MODEL, build, device_doc, install, push, wait_results


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def dropped(sub: Any) -> int:
    return int((last_telemetry(sub).get("ota") or {}).get("chunks_dropped", 0))


def last_telemetry(sub: Any) -> dict[str, Any]:
    docs = [m.json() for m in sub.on("telemetry") if m.payload]
    return docs[-1] if docs else {}


class Peer:
    """A plain MQTT v5 client on the broker (a user name when the broker runs an ACL)."""

    def __init__(self, broker: Broker, pattern: str | None = None, username: str | None = None) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.lock = threading.Lock()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"peer-{free_port()}", protocol=mqtt.MQTTv5)
        if username:
            self.c.username_pw_set(username)
        subscribed = threading.Event()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.c.on_message = self._on
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        if pattern:
            self.c.subscribe(pattern, qos=1)
            assert subscribed.wait(10), "the peer could not subscribe"

    def _on(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(m)

    def on(self, topic: str) -> list[mqtt.MQTTMessage]:
        with self.lock:
            return [m for m in self.messages if m.topic == topic]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


# ---- 9: admission counts the activations, before the warm-up ----------------------------------------
def big_batch_package(demo: DemoAssets, tmp: Path, batch: int) -> Path:
    """The demo BlazeFace (front, 128x128) rebatched to `batch`: tiny weights, big activations."""
    src = demo.packages["blazeface-front"]
    model = tmp / f"front-{batch}.onnx"
    onnx.save(rebatch(onnx.load(str(src.model_path)), batch), str(model))
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["input"]["shape"] = [batch, *src.manifest.input.shape[1:]]
    files = {"model.onnx": model, "labels.txt": src.root / "labels.txt"}
    return write_package(tmp / f"pkg-front-{batch}", fields, files).root


def run_to_exit(start_daemon: Any, cfg: Path, timeout: float = 60) -> tuple[int, float, str]:
    """Run a daemon until it exits; its exit code, its own peak RSS in MB and its log.

    The peak is the kernel's VmHWM of the daemon's own address space, read while it runs (wait4's ru_maxrss
    would not do: it survives exec, so it starts at the RSS of the forked test process, hundreds of MB late
    in a suite)."""
    d = start_daemon(cfg, "--duration", "4")
    end = time.monotonic() + timeout
    peak_kb = 0
    while True:
        try:
            status_text = Path(f"/proc/{d.proc.pid}/status").read_text()
            hwm = next((ln.split()[1] for ln in status_text.splitlines() if ln.startswith("VmHWM:")), "0")
            if b"edged\0run" in Path(f"/proc/{d.proc.pid}/cmdline").read_bytes():  # exec'd: the daemon itself
                peak_kb = max(peak_kb, int(hwm))
        except (OSError, ValueError):
            pass
        pid, status, _ = os.wait4(d.proc.pid, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status), peak_kb / 1024, d.output()
        if time.monotonic() > end:
            raise AssertionError(f"the daemon did not exit within {timeout} s:\n{d.output()[-3000:]}")
        time.sleep(0.02)


def test_a_big_batch_package_is_refused_before_its_warm_up(demo: DemoAssets, tmp_path: Path, start_daemon: Any) -> None:
    class Nowhere:  # no broker needed: neither the refusal nor a start waits for one
        host, port = "127.0.0.1", free_port()

    cams = [{"name": "a", "uri": "synthetic://?fps=5"}]
    big = big_batch_package(demo, tmp_path, 512)  # its warm-up would peak over 1.2 GB RSS
    doc = base_config(Nowhere(), demo, tmp_path, cams, memory={"budget_mb": 600})
    doc["model"]["package"] = str(big)
    rc, peak_mb, out = run_to_exit(start_daemon, write_config(tmp_path / "big.yaml", doc))
    assert rc != 0 and "does not fit the memory budget" in out and "activations" in out, out[-3000:]
    assert "Traceback" not in out and "warm-up batch" not in out
    print(f"\nrefused big-batch package: daemon peak RSS {peak_mb:.0f} MB")
    assert peak_mb < 450, f"the daemon peaked at {peak_mb:.0f} MB RSS: the big warm-up ran"
    # the demo package (batch 4) fits the same budget and serves
    doc["model"]["package"] = str(demo.packages["blazeface-back"].root)
    rc, peak_mb, out = run_to_exit(start_daemon, write_config(tmp_path / "fits.yaml", doc))
    assert rc == 0 and "warm-up batch" in out, out[-3000:]
    assert peak_mb < 600


def test_an_engine_is_admitted_on_its_recorded_device_memory(demo: DemoAssets, tmp_path: Path) -> None:
    """No GPU needed: the estimate reads the manifest (what `edged build-engine` records), not the engine."""
    src = demo.packages[MODEL]
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"\0" * 4096)
    fields.update(kind="engine", model_file="model.engine", compatibility={"device_memory_bytes": 3 << 30})
    pkg = write_package(tmp_path / "eng", fields, {"model.engine": engine, "labels.txt": src.root / "labels.txt"})
    assert activation_mb(pkg) == 3072 and 3072 < estimate_mb(pkg) < 3080
    with pytest.raises(EngineLoadError, match=r"does not fit the memory budget: 307\d\.\d MB") as exc:
        admit(pkg.ref, estimate_mb(pkg), 10.0, 1100.0, 4096)
    assert exc.value.code == "over_budget"
    onnx_pkg = open_package(src.root)  # an ONNX graph: its peak of intermediate tensors, twice
    assert activation_mb(onnx_pkg) == 2 * activation_bytes(onnx_pkg.model_path) / 2**20 > 0


def hungry_variant(src: Path, out: Path, repeats: int) -> Path:
    """The same model, input spec and outputs plus a side branch with one big intermediate tensor (the input
    tiled `repeats` times, summed, multiplied by zero and added to the first output): a real model whose
    weights are as small as before and whose working memory is not."""
    m = onnx.load(str(src))
    g = m.graph
    first = g.output[0]
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([1, 1, 1, repeats], np.int64), "hungry_repeats"),
            numpy_helper.from_array(np.array(0.0, np.float32), "hungry_zero"),
        ]
    )
    nodes = [
        helper.make_node("Tile", [g.input[0].name, "hungry_repeats"], ["hungry_big"]),
        helper.make_node("ReduceSum", ["hungry_big"], ["hungry_sum"], keepdims=0),
        helper.make_node("Mul", ["hungry_sum", "hungry_zero"], ["hungry_nothing"]),
        helper.make_node("Add", [f"{first.name}_inner", "hungry_nothing"], [first.name]),
    ]
    for node in g.node:  # the graph's own first output is renamed so the Add's result takes its name
        node.output[:] = [f"{o}_inner" if o == first.name else o for o in node.output]
    g.node.extend(nodes)
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


def vm_hwm_mb(pid: int) -> float:
    """The process's peak RSS so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_pushed_version_over_the_budget_is_rejected_and_the_old_one_serves(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    budget = 600
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["memory"] = {"budget_mb": budget}
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    # 4 x 256 x 256 x 3 floats tiled 128 times: a 384 MiB intermediate in every batch
    hungry = hungry_variant(demo.packages[MODEL].model_path, tmp_path / "hungry.onnx", 128)
    r = push(broker, build(demo, tmp_path, signer, 2, model=hungry), "--device", "cam-01")
    assert r.returncode == 1 and "over_budget" in r.stderr, r.stderr + d.output()[-3000:]
    events = sub.wait_events("model_rejected")  # the event is spooled; the status the push saw is not
    assert any(e.get("code") == "over_budget" for e in events), events
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 20, "version 1 still serving")
    assert {r["model"]["version"] for r in sub.results()} == {1}
    peak = vm_hwm_mb(d.proc.pid)
    assert peak < budget * 0.8, f"the daemon peaked at {peak:.0f} MB RSS"
    assert d.stop() == 0


# ---- 10: junk on ota/data and cmd/ ------------------------------------------------------------------
JUNK_ROUNDS, JUNK_MB = 2, 32
JUNK_TOPICS = ("ota/data",) * 6 + ("cmd/status", "cmd/ota", "cmd/nonesuch", "cmd/ota")  # 10 x 32 MiB a round


def test_junk_chunks_without_a_transfer_are_dropped_and_a_push_still_works(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    """A hostile client publishes 2 x 10 messages of 32 MiB to the device's ota/data and cmd/ topics. The
    daemon's CONNECT names its Maximum Packet Size (the largest message it takes, an OTA offer here), so
    mosquitto drops them instead of sending them: none reaches the daemon (only the small marker chunk
    after each round is counted as dropped, no command is answered `too_large`), its RSS stays within a
    few MB, it stays connected, and a real push right after still succeeds: its 1 MiB chunks (over the
    576 KiB the defaults give) fit, as the size follows `ota.chunk_kb`."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["telemetry"] = {"interval_s": 1}
    doc["ota"] = {"chunk_kb": 1024}
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/+")  # status, telemetry: not the junk (this process holds what it gets)
    results = subscribe(broker, "edged/cam-01/results/#")
    replies = subscribe(broker, "edged/cam-01/cmd/+/reply")
    d = start_daemon(cfg)
    wait_results(results, 1)
    wait_until(lambda: bool(last_telemetry(sub)), 15, "telemetry")
    before = rss_mb(d.proc.pid)
    header = {"transfer": "junk", "file": "model.onnx", "offset": 0}
    junk = {
        "ota/data": pack_chunk(header, bytes(JUNK_MB << 20)),
        "cmd": b'{"camera": "' + b"a" * (JUNK_MB << 20) + b'"}',
    }
    marker = pack_chunk(header, b"x")  # small: delivered, and dropped by the daemon as not asked for
    seen: list[float] = []
    hostile = Peer(broker)
    try:
        for n in range(1, JUNK_ROUNDS + 1):
            for topic in JUNK_TOPICS:
                payload = junk["cmd" if topic.startswith("cmd/") else topic]
                hostile.c.publish(f"edged/cam-01/{topic}", payload, qos=1).wait_for_publish(30)
            hostile.c.publish("edged/cam-01/ota/data", marker, qos=1).wait_for_publish(30)
            hostile.c.publish("edged/cam-01/cmd/status", b"{}", qos=1).wait_for_publish(30)
            wait_until(lambda: dropped(sub) >= n, 60, f"telemetry counting marker {n}")  # noqa: B023
            wait_until(lambda: len(replies.on("cmd/status/reply")) >= n, 30, f"the reply to status {n}")  # noqa: B023
            seen.append(rss_mb(d.proc.pid))
    finally:
        hostile.close()
    print(f"\nRSS {before:.1f} -> {seen[0]:.1f} -> {seen[1]:.1f} MB")
    tel = last_telemetry(sub)
    assert tel["ota"]["chunks_dropped"] == JUNK_ROUNDS, f"junk reached the daemon: {tel['ota']}"
    answered = [m.json() for m in replies.messages]
    assert len(answered) == JUNK_ROUNDS and all(a["ok"] for a in answered), f"junk commands were answered: {answered}"
    assert tel["mqtt"]["connects"] == 1, tel["mqtt"]
    # a few MB of ordinary drift (the camera and inference run on); paho held each 32 MiB message whole
    # before (+50..80 MB after 20 of them) and queued them for good before that (+546 MB)
    assert max(seen) - before < 8, f"RSS {before:.0f} -> {seen[0]:.0f} -> {seen[1]:.0f} MB after the junk"
    assert tel["ota"]["queued_bytes"] == 0 and tel["ota"]["transfer"] is None
    assert d.output().count("ota: dropped") == 1  # logged once, throttled
    big = tmp_path / "padding.bin"
    big.write_bytes(os.urandom(3 << 20))  # three whole 1 MiB chunks
    r = push(broker, build(demo, tmp_path, signer, 2, files={"padding.bin": big}), "--device", "cam-01")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()[-3000:]
    wait_results(results, 2)
    assert d.stop() == 0


# ---- 11: reply topics confined to the device's own ---------------------------------------------------
def test_response_topics_are_confined_under_the_shipped_acl(
    demo: DemoAssets, tmp_path: Path, start_daemon: Any
) -> None:
    acl = tmp_path / "edged.acl"
    acl.write_text((REPO / "systemd" / "mosquitto" / "edged.acl").read_text())
    broker = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}\nlog_type all")
    broker.start()
    try:
        doc = base_config(broker, demo, tmp_path, [{"name": "cam", "uri": "synthetic://?fps=5"}])
        doc["mqtt"]["username"] = "test-01"  # the ACL's %u: what a certificate's CN is on a site broker
        d = start_daemon(write_config(tmp_path / "c.yaml", doc))
        backend = Peer(broker, "edged/#", username="backend")
        wait_until(lambda: bool(backend.on("edged/test-01/telemetry")), 60, "the device online")
        sent = {
            "other": "edged/other-02/results/cam",  # another device's results
            "sys": "$SYS/broker/x",
            "backend": "backend/replies",  # not a topic a device may write
            "shared": "edged/_push/0123abcd/reply",  # older pushers' reply topic, writable by any device
            "push": "edged/test-01/reply/_push/0123abcd",  # `edged push`'s reply topic for this device
            "own": "edged/test-01/reply/backend",  # the device's own reply namespace
        }
        for corr, topic in sent.items():
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.ResponseTopic = topic
            props.CorrelationData = corr.encode()
            backend.c.publish("edged/test-01/cmd/status", b"{}", qos=1, properties=props)

        def replies(topic: str) -> dict[str, Any]:
            return {
                bytes(getattr(m.properties, "CorrelationData", b"")).decode(): json.loads(m.payload)
                for m in backend.on(topic)
            }

        default = "edged/test-01/cmd/status/reply"
        wait_until(lambda: len(replies(default)) == 4, 20, "the four refusals on the default reply topic")
        for corr in ("other", "sys", "backend", "shared"):
            reply = replies(default)[corr]
            assert not reply["ok"] and reply["error"]["code"] == "bad_response_topic", reply
            assert sent[corr][:12] in reply["error"]["message"]
        wait_until(lambda: bool(replies(sent["push"])) and bool(replies(sent["own"])), 20, "the allowed replies")
        assert replies(sent["push"])["push"]["ok"] and replies(sent["own"])["own"]["ok"]
        assert not backend.on(sent["other"])
        log = (tmp_path / "broker.log").read_text(errors="replace")  # mosquitto logs every publish it denies
        assert "Denied PUBLISH from" not in log, [ln for ln in log.splitlines() if "Denied" in ln]
        n = len(backend.on("edged/test-01/telemetry"))
        wait_until(lambda: len(backend.on("edged/test-01/telemetry")) > n, 15, "fresh telemetry")
        tel = json.loads(backend.on("edged/test-01/telemetry")[-1].payload)
        assert tel["mqtt"]["connects"] == 1, tel["mqtt"]
        backend.close()
        assert d.stop() == 0
    finally:
        broker.stop()


# ---- 12: a package tar with undeclared members; a nested signature -----------------------------------
class Zeros(io.RawIOBase):
    """`size` zero bytes, read in pieces: a 200 MiB member without holding 200 MiB."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_a_tar_with_an_undeclared_member_is_refused_before_it_is_written(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    src = demo.packages[MODEL]
    tgz = tmp_path / "stuffed.tar.gz"
    with tarfile.open(tgz, "w:gz", compresslevel=1) as tar:
        for name in ("manifest.json", *src.manifest.files):
            tar.add(src.root / name, arcname=name)
        info = tarfile.TarInfo("padding.bin")
        info.size = 200 << 20
        tar.addfile(info, Zeros(info.size))
    assert tgz.stat().st_size < 2 << 20  # compresses to almost nothing
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(PackageError, match=r"'padding.bin' \(209715200 bytes\) is not declared") as exc:
        open_package(tgz, scratch=staging)
    assert exc.value.code == "undeclared_file"
    assert du(staging) < 1 << 20, f"staging holds {du(staging)} bytes"
    # a declared file whose tar entry is larger than declared: refused by its header, nothing written
    pkg = open_package(src.root)
    longer = tmp_path / "longer.tar"
    with tarfile.open(longer, "w") as tar:
        tar.add(src.root / "manifest.json", arcname="manifest.json")
        info = tarfile.TarInfo("model.onnx")
        info.size = pkg.manifest.files["model.onnx"].size + (50 << 20)
        tar.addfile(info, Zeros(info.size))
        tar.add(src.root / "labels.txt", arcname="labels.txt")
    with pytest.raises(PackageError, match="the manifest says") as exc:
        open_package(longer, scratch=staging)
    assert exc.value.code == "too_long" and du(staging) < 1 << 20
    ok = pack_tar(pkg, tmp_path / "ok.tar")  # a package tar as `edged model pack` writes it still opens
    assert open_package(ok, scratch=staging).manifest.name == MODEL
    # the store (`edged model install`, an OTA-free install) refuses the same: a signed tar plus one member
    signed = build(demo, tmp_path, signer, 2)
    with tarfile.open(signed, "a") as tar:
        info = tarfile.TarInfo("extra.bin")
        info.size = 1 << 20
        tar.addfile(info, Zeros(info.size))
    store = Store(tmp_path / "state")
    with pytest.raises(PackageError, match=r"'extra\.bin' .* is not declared") as exc:
        store.stage(signed, TrustStore.load(tmp_path / "trusted"))
    assert exc.value.code == "undeclared_file" and not any(store.staging.rglob("*.bin"))


def test_a_deeply_nested_signature_in_an_ota_offer_is_a_bad_signature(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    with tarfile.open(build(demo, tmp_path, signer, 2)) as tar:
        manifest = tar.extractfile("manifest.json").read()  # type: ignore[union-attr]
    nested = b"[" * 2000 + b"]" * 2000  # under the 4096-byte cap, far deeper than json's recursion limit
    offer = {
        "transfer": "nested",
        "manifest": base64.b64encode(manifest).decode(),
        "sig": base64.b64encode(nested).decode(),
    }
    peer = Peer(broker)
    try:
        peer.c.publish("edged/cam-01/cmd/ota", json.dumps(offer), qos=1)
        wait_until(lambda: bool(sub.on("cmd/ota/reply")), 20, "the reply to the offer")
    finally:
        peer.close()
    reply = sub.on("cmd/ota/reply")[-1].json()
    assert not reply["ok"] and reply["error"]["code"] == "bad_signature", reply
    wait_until(
        lambda: any(m.json().get("type") == "model_rejected" for m in sub.on("events")), 10, "the rejection event"
    )
    event = next(m.json() for m in sub.on("events") if m.json().get("type") == "model_rejected")
    assert event["code"] == "bad_signature" and event["transfer"] == "nested"
    status = [m.json() for m in sub.on("ota/status") if m.payload][-1]
    assert status["state"] == "rejected" and status["error"]["code"] == "bad_signature"
    assert "RecursionError" not in d.output() and "Traceback" not in d.output()
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 20, "version 1 still serving")
    assert d.stop() == 0


@pytest.mark.parametrize(
    "header",
    [
        b'{"transfer": "t", "file": "model.onnx", "offset": Infinity}',
        b'{"transfer": "t", "file": "model.onnx", "offset": NaN}',
        b'{"transfer": "t", "file": "model.onnx", "offset": 1e400}',
        b'{"transfer": "t", "file": "model.onnx", "offset": true}',
        b'{"transfer": "t", "file": "model.onnx", "offset": -1}',
        b'{"transfer": ["t"], "file": "model.onnx", "offset": 0}',
        b'{"transfer": "t", "file": "model.onnx"}',
        b"[" * 30000 + b"]" * 30000,
        b"\xff\xfe",
    ],
    ids=["infinity", "nan", "huge", "bool", "negative", "list", "no-offset", "deep", "not-utf8"],
)
def test_a_hostile_chunk_header_is_malformed_never_another_error(header: bytes) -> None:
    """Every header a hostile peer can send on ota/data is a ProtocolError, code malformed (dropped and counted
    on the network thread), never an OverflowError or RecursionError that escapes to paho's callback."""
    import struct

    from edged.errors import Code, ProtocolError
    from edged.protocol.ota import chunk_key

    with pytest.raises(ProtocolError) as exc:
        chunk_key(struct.pack(">H", len(header)) + header + b"data")
    assert exc.value.code == Code.MALFORMED


def test_a_well_formed_chunk_header_gives_its_key() -> None:
    from edged.protocol.ota import chunk_key, pack_chunk

    payload = pack_chunk({"transfer": "t1", "file": "model.onnx", "offset": 4096}, b"abc")
    key, start = chunk_key(payload)
    assert key == ("t1", "model.onnx", 4096) and payload[start:] == b"abc"
