"""Over-the-air push and hot swap, end to end: real mosquitto, real daemons (processes) running ONNX
Runtime on the demo video, the real `edged push` CLI, real SIGKILLs."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
from onnx import helper, numpy_helper
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.lifecycle.manager import SWAP_STEPS
from edged.models.demo import DemoAssets
from edged.models.package import pack_tar, verify_folder, write_package
from edged.models.signing import SigningKey, generate_key, load_signing_key
from edged.models.store import INSTALL_STEPS
from edged.protocol.ota import pack_chunk
from tests.conftest import REPO, Broker, DaemonProc, base_config, edged_cli, wait_until, write_config

MODEL = "blazeface-back"


def build(demo: DemoAssets, tmp: Path, key: SigningKey, version: int, model: Path | None = None, **extra: Any) -> Path:
    """A signed tar of the demo BlazeFace as `version` (another model file, extra files or fields on request)."""
    src = demo.packages[MODEL]
    folder = tmp / f"pkg-{version}-{time.monotonic_ns()}"
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    files = {"model.onnx": model or src.model_path, "labels.txt": src.root / "labels.txt"}
    files.update(extra.pop("files", {}))
    fields.update(version=version, **extra)
    pkg = write_package(folder, fields, files)
    return pack_tar(pkg, tmp / f"{folder.name}.tar", key.sign(pkg.manifest_bytes))


def device_doc(broker: Broker, demo: DemoAssets, tmp: Path, device: str, **model: Any) -> dict[str, Any]:
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 10}]
    doc = base_config(broker, demo, tmp, cams, device_id=device, state_dir=str(tmp / device))
    doc["model"] = {
        "name": MODEL,
        "keys_dir": str(tmp / "trusted"),
        "probation_s": 600,
        "probation_batches": 100000,
        "onnxruntime": {"threads": 1},
        **model,
    }
    doc["ota"] = {"chunk_kb": 64, "window": 4, "retry_s": 2}
    doc["telemetry"] = {"interval_s": 5}
    return doc


def install(cfg: Path, tar: Path) -> None:
    r = edged_cli("model", "install", str(tar), "-c", str(cfg))
    assert r.returncode == 0, r.stderr


def install_all(cfgs: Iterable[Path], tar: Path) -> None:
    """`install` into each device's store, four at a time: each is a second of `edged model install` start-up."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda cfg: install(cfg, tar), cfgs))


def push(broker: Broker, tar: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return edged_cli(
        "push", str(tar), "--host", broker.host, "--port", str(broker.port), "--timeout", "240", *args, timeout=timeout
    )


def start_push(broker: Broker, tar: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "edged", "push", str(tar), "--host", broker.host, "--port", str(broker.port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )


def store_view(state: Path) -> dict[str, Any]:
    r = edged_cli("model", "list", "--json", "-c", str(state.parent / f"{state.name}.yaml"))
    assert r.returncode == 0, r.stderr
    (m,) = json.loads(r.stdout)
    return dict(m)


def assert_consistent(state: Path, allowed: set[int], after_start: bool = True) -> int:
    """Exactly one allowed version is current, nothing dangles, state.json parses; after a start (which
    recovers the store) staging is clean too."""
    d = state / "models" / MODEL
    cur = d / "current"
    assert cur.is_symlink() and cur.exists(), "current must resolve"
    v = int(os.readlink(cur).split("/")[-1])
    assert v in allowed
    verify_folder(cur)
    prev = d / "previous"
    assert not prev.is_symlink() or prev.exists(), "previous dangles"
    if after_start:
        assert not (state / "staging").exists() or not any((state / "staging").iterdir()), "staging left dirty"
    json.loads((d / "state.json").read_text())
    assert not list(d.glob(".*.tmp"))
    return v


def running(
    demo: DemoAssets, tmp: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any, version: int
) -> tuple[Path, Any, DaemonProc]:
    """Device cam-01 with `version` installed from a file, its daemon serving it, and a subscriber to it."""
    cfg = write_config(tmp / "cam-01.yaml", device_doc(broker, demo, tmp, "cam-01"))
    install(cfg, build(demo, tmp, signer, version))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, version)
    return cfg, sub, d


def serving(d: DaemonProc) -> DaemonProc:
    wait_until(lambda: "serving 1 camera(s)" in d.output(), 60, "the daemon to serve")
    return d


def versions_in_order(sub: Any) -> list[int]:
    docs = sorted(sub.results(), key=lambda r: (r["boot_id"], r["seq"]))
    return [r["model"]["version"] for r in docs]


def wait_results(sub: Any, version: int, n: int = 3, timeout: float = 60) -> None:
    wait_until(
        lambda: sum(1 for r in sub.results() if r["model"]["version"] == version) >= n,
        timeout,
        f"{n} results from version {version}",
    )


def test_push_hot_swaps_a_running_daemon_without_mixing_versions(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    v2 = build(demo, tmp_path, signer, 2)
    r = push(broker, v2, "--device", "cam-01")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()
    assert "1 of 1 device(s) succeeded" in r.stderr and "probation" in r.stderr
    wait_results(sub, 2)
    order = versions_in_order(sub)
    first2 = order.index(2)
    assert set(order[:first2]) == {1} and set(order[first2:]) == {2}, "results must flip once, never mix"
    events = [m.json() for m in sub.on("events")]
    activated = [e for e in events if e["type"] == "model_activated"]
    assert activated and activated[-1]["model"] == {"name": MODEL, "version": 2}
    assert activated[-1]["mode"] == "side_by_side"
    state = [m.json() for m in sub.on("model/state") if m.payload][-1]
    assert state["active"] == 2 and state["previous"] == 1 and state["probation"]["version"] == 2
    # the same version again is a no-op; an older one is refused with its own code
    r = push(broker, v2, "--device", "cam-01")
    assert r.returncode == 0 and "unchanged" in r.stderr, r.stderr
    r = push(broker, build(demo, tmp_path, signer, 1), "--device", "cam-01")
    assert r.returncode == 1 and "older_version" in r.stderr, r.stderr
    assert d.stop() == 0
    assert assert_consistent(tmp_path / "cam-01", {2}) == 2


def slow_variant(src: Path, out: Path, matmuls: int) -> Path:
    """The same model and outputs plus dead weight: `matmuls` chained [B*256, 768] x [768, 768] products
    whose sum is multiplied by zero and added to the first output. A real model that is just slower."""
    m = onnx.load(str(src))
    g = m.graph
    x = g.input[0].name
    first = g.output[0]
    b = first.type.tensor_type.shape.dim[0].dim_value
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((768, 768)) * 0.01).astype(np.float32), "slow_w")
    g.initializer.extend([w, numpy_helper.from_array(np.array([b * 256, 768], np.int64), "slow_shape")])
    g.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), "slow_zero"))
    nodes = [helper.make_node("Reshape", [x, "slow_shape"], ["slow_0"])]
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [f"slow_{i}", "slow_w"], [f"slow_{i + 1}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"slow_{matmuls}"], ["slow_sum"], keepdims=0),
        helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_nothing"]),
        helper.make_node("Add", [first.name, "slow_nothing"], ["slow_out"]),
    ]
    for node in g.node:  # the graph's own first output is renamed so the Add's result takes its name
        node.output[:] = [f"{o}_inner" if o == first.name else o for o in node.output]
    nodes[-1].input[0] = f"{first.name}_inner"
    nodes[-1].output[0] = first.name
    g.node.extend(nodes)
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


def test_a_golden_mismatch_is_never_activated(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    # a golden pair made from the real model, then the weights changed: it loads, but computes otherwise
    src = demo.packages[MODEL]
    folder = tmp_path / "golden"
    write_package(
        folder,
        src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True),
        {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"},
    )
    cap = cv2.VideoCapture(str(demo.video))
    for _ in range(30):
        ok, frame = cap.read()
    cap.release()
    assert ok and cv2.imwrite(str(tmp_path / "frame.png"), frame)
    r = edged_cli("model", "golden", str(folder), "--image", str(tmp_path / "frame.png"))
    assert r.returncode == 0, r.stderr
    golden = json.loads((folder / "manifest.json").read_text())["golden"]
    extra = {golden[k]: folder / golden[k] for k in ("input", "output")}
    good = build(demo, tmp_path, signer, 2, files=extra, golden=golden)
    m = onnx.load(str(src.model_path))
    biggest = max(m.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    arr = numpy_helper.to_array(biggest) * 1.5
    biggest.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), biggest.name))
    onnx.save(m, str(tmp_path / "drifted.onnx"))
    bad = build(demo, tmp_path, signer, 3, model=tmp_path / "drifted.onnx", files=extra, golden=golden)
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    r = push(broker, bad, "--device", "cam-01")
    assert r.returncode == 1 and "golden_mismatch" in r.stderr, r.stderr + d.output()
    assert store_view(tmp_path / "cam-01")["current"] == 1 and 3 in store_view(tmp_path / "cam-01")["bad"]
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 5, 30, "version 1 still serving")
    assert {r["model"]["version"] for r in sub.results()} == {1}
    rejected = sub.wait_events("model_rejected")  # spooled; the status the push returned on went straight out
    assert rejected[0]["code"] == "golden_mismatch"
    r = push(broker, good, "--device", "cam-01")  # the real model passes its golden check
    assert r.returncode == 0, r.stderr + d.output()
    assert "golden check passed" in d.output()
    assert d.stop() == 0


@pytest.mark.parametrize("outage_s", [5, pytest.param(20, marks=pytest.mark.slow)])
def test_ota_completes_across_a_broker_outage_and_a_daemon_restart(
    outage_s: float, demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"] = {"chunk_kb": 4, "window": 1, "retry_s": 2}  # slow enough (~3,000 round trips) to interrupt twice
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    payload = tmp_path / "calibration.bin"
    payload.write_bytes(np.random.default_rng(1).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes())
    v2 = build(demo, tmp_path, signer, 2, files={"calibration.bin": payload})
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)

    def fraction() -> float:
        docs = [m.json() for m in sub.on("ota/status") if m.payload]
        done = [x["bytes"] / x["total"] for x in docs if x.get("total")]
        return max(done, default=0.0)

    pusher = start_push(broker, v2, "--device", "cam-01", "--timeout", "300")
    wait_until(lambda: fraction() > 0.1, 60, "10 % transferred")
    broker.stop()
    time.sleep(outage_s)  # the outage itself: longer than the OTA's retry_s (2 s), so both ends retry
    broker.start()
    sub.messages.clear()
    wait_until(lambda: fraction() > 0.4, 120, "the transfer to go on after the outage")
    at_kill = fraction()
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    d2 = start_daemon(cfg)
    out, _ = pusher.communicate(timeout=300)
    assert pusher.returncode == 0, out + d2.output()
    resumed = re.search(r"resuming transfer \S+ of \S+ at (\d+) of (\d+) bytes", d2.output())
    assert resumed, d2.output()
    have, total = int(resumed[1]), int(resumed[2])
    assert 0.3 * total < have < total, (have, total, at_kill)  # from the persisted progress, not from zero
    wait_results(sub, 2)
    assert d2.stop() == 0
    assert assert_consistent(tmp_path / "cam-01", {2}) == 2
    installed = tmp_path / "cam-01" / "models" / MODEL / "current" / "calibration.bin"
    assert installed.read_bytes() == payload.read_bytes()
    assert not (tmp_path / "cam-01" / "ota").exists() or not any((tmp_path / "cam-01" / "ota").iterdir())


@pytest.mark.parametrize("step", INSTALL_STEPS + SWAP_STEPS)
def test_sigkill_at_every_step_of_an_ota_swap(
    step: str, demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg, env={"EDGEDTEST_CRASH_AT": step})
    wait_results(sub, 1)
    pusher = start_push(broker, build(demo, tmp_path, signer, 2), "--device", "cam-01", "--timeout", "60")
    assert d.proc.wait(60) == -signal.SIGKILL, d.output()
    before = {r["boot_id"] for r in sub.results()}
    pusher.kill()
    pusher.communicate()
    state = tmp_path / "cam-01"
    assert_consistent(state, {1, 2}, after_start=False)  # right after the kill: exactly one of old/new
    d2 = serving(start_daemon(cfg))

    def fresh() -> list[int]:  # versions in the new run's results (the spool may still deliver the old run's)
        docs = sorted((r for r in sub.results() if r["boot_id"] not in before), key=lambda r: r["seq"])
        return [r["model"]["version"] for r in docs]

    # the download had finished before every step: the restart finishes the install, whatever the step
    wait_until(lambda: fresh().count(2) > 3, 90, "version 2 serving after the restart")
    assert fresh() == sorted(fresh()), "one flip at most, never back and forth"
    assert d2.stop() == 0
    assert assert_consistent(state, {2}) == 2
    assert not (state / "ota").exists() or not any((state / "ota").iterdir())


def test_crashes_on_probation_roll_back_at_the_next_start(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    install(cfg, build(demo, tmp_path, signer, 2))
    sub = subscribe(broker, "edged/cam-01/#")
    for _ in (1, 2):  # model.probation_max_crashes = 1: the second crash is one too many
        serving(start_daemon(cfg)).stop(signal.SIGKILL)
    d = start_daemon(cfg)
    wait_results(sub, 1)
    assert "crashed 2 times while blazeface-back@2 was on probation" in d.output()
    rolled = [m.json() for m in sub.on("events") if m.json()["type"] == "model_rolled_back"]
    assert rolled and rolled[0]["code"] == "probation_crashes" and rolled[0]["to"] == 1
    assert d.stop() == 0
    view = store_view(tmp_path / "cam-01")
    assert (view["current"], view["bad"]) == (1, [2])
    # a clean stop on probation is not a crash
    install(cfg, build(demo, tmp_path, signer, 3))
    for _ in range(3):
        assert serving(start_daemon(cfg)).stop() == 0
    assert store_view(tmp_path / "cam-01")["current"] == 3


def test_reload_serves_a_version_installed_from_a_file(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg, sub, d = running(demo, tmp_path, signer, broker, subscribe, start_daemon, 1)
    install(cfg, build(demo, tmp_path, signer, 2))
    d.proc.send_signal(signal.SIGHUP)  # what `systemctl reload edged` sends
    wait_results(sub, 2)
    order = versions_in_order(sub)
    assert order == sorted(order)
    state = [m.json() for m in sub.on("model/state") if m.payload][-1]
    assert state["active"] == 2 and state["probation"]["version"] == 2
    # a rollback by hand, then a reload: the previous version serves, and it is not on probation
    r = edged_cli("model", "rollback", MODEL, "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    n = len(sub.results())
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: sum(1 for x in sub.results()[n:] if x["model"]["version"] == 1) > 3, 60, "version 1 again")
    state = [m.json() for m in sub.on("model/state") if m.payload][-1]
    assert state["active"] == 1 and state["probation"] is None and state["bad"] == [2]
    assert d.stop() == 0


@pytest.mark.parametrize("n", [4, pytest.param(10, marks=[pytest.mark.slow, pytest.mark.start_early(175)])])
def test_fleet_push_to_n_daemons_and_a_canary_that_rolls_back(
    n: int, demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """A group of n daemons (4 in the default run: two canaries and two more; 10 in the slow one)."""
    from tests.fleet import FPS_MAX, fleet_video  # tests.fleet imports this module

    ids = [f"dev-{i:02d}" for i in range(n)]
    video = fleet_video(demo, tmp_path)
    cfgs = {}
    for dev in ids:
        # 10 daemons share 2 cores here: batch times swing 1.6x under load, so the regression bar is 3x; the demo
        # video at 2 frames/s (tests/fleet.py: about half a daemon's CPU at 5) is enough for a probation of 10 batches
        doc = device_doc(broker, demo, tmp_path, dev, probation_s=4, probation_batches=10, probation_latency_ratio=3)
        doc["cameras"][0].update(uri=f"file://{video}", fps_max=FPS_MAX)
        doc["groups"] = ["fleet"]
        cfgs[dev] = write_config(tmp_path / f"{dev}.yaml", doc)
    install_all(cfgs.values(), build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/+/model/state")
    daemons = [start_daemon(cfgs[dev]) for dev in ids]
    for d in daemons:
        serving(d)

    def active(dev: str) -> int | None:
        docs = [m.json() for m in sub.on(f"{dev}/model/state") if m.payload]
        return docs[-1]["active"] if docs else None

    # a staged push to the group: two canaries first, the rest once they have committed
    r = push(broker, build(demo, tmp_path, signer, 2), "--group", "fleet", "--canary", "2")
    assert r.returncode == 0, r.stderr
    assert f"group 'fleet': {n} online" in r.stderr and f"{n} of {n} device(s) succeeded" in r.stderr
    assert all(f"ok   {dev}" in r.stderr for dev in ids), r.stderr
    assert r.stderr.index("canaries committed") < r.stderr.index(f"{n} of {n}")
    wait_until(lambda: all(active(dev) == 2 for dev in ids), 30, "every device on version 2")
    # version 3 is correct but several times slower: the canary's probation rolls it back; nobody else gets it
    slow = slow_variant(demo.packages[MODEL].model_path, tmp_path / "slow.onnx", matmuls=14)
    r = push(broker, build(demo, tmp_path, signer, 3, model=slow), "--group", "fleet", "--canary", "1")
    assert r.returncode == 3, r.stderr  # the rollout aborted (deploy/rollout/__init__.py)
    assert "rolled_back" in r.stderr and "latency regression" in r.stderr, r.stderr
    assert r.stderr.count("skipped") >= n - 1 and f"0 of {n} device(s) succeeded" in r.stderr, r.stderr
    wait_until(lambda: active(ids[0]) == 2, 30, "the canary back on version 2")
    for d in daemons:
        assert d.stop() == 0
    for dev in ids:
        view = store_view(tmp_path / dev)
        assert view["current"] == 2, (dev, view)
        assert view["versions"] == ([1, 2, 3] if dev == ids[0] else [1, 2])


def tree(root: Path) -> dict[str, str]:
    """Every path under root with its size or link target: what 'nothing changed on disk' means here."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.startswith(("spool.db", "staging", "ota")) or rel.endswith("/output.json"):
            continue  # the result spool and the output record change all the time; scratch is not the store
        out[rel] = "-> " + os.readlink(p) if p.is_symlink() else (str(p.stat().st_size) if p.is_file() else "dir")
    return out


class HostilePusher:
    """A peer that offers a properly signed package and then answers chunk requests with bytes that are
    too long (never to be written) and then wrong (caught by the hash)."""

    def __init__(self, broker: Broker, tar: Path, device: str) -> None:
        with tarfile.open(tar) as t:
            self.members = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
        self.root = f"edged/{device}"
        self.too_long = 0
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.c.on_message = self._on
        subscribed = threading.Event()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.c.connect(broker.host, broker.port)
        self.c.subscribe(f"{self.root}/ota/req", qos=1)
        self.c.loop_start()
        assert subscribed.wait(10), "the hostile pusher could not subscribe"
        offer = {
            "transfer": "hostile",
            "manifest": base64.b64encode(self.members["manifest.json"]).decode(),
            "sig": base64.b64encode(self.members["manifest.sig"]).decode(),
        }
        self.c.publish(f"{self.root}/cmd/ota", json.dumps(offer), qos=1)

    def _on(self, c: Any, u: Any, msg: Any) -> None:
        req = json.loads(msg.payload)
        data = self.members[req["file"]][req["offset"] : req["offset"] + req["length"]]
        if self.too_long < 3:  # more than was asked for, past the declared end
            self.too_long += 1
            data = data + b"X" * 4096
        else:
            data = bytes(255 - b for b in data)  # the right length, the wrong bytes
        header = {"transfer": req["transfer"], "file": req["file"], "offset": req["offset"]}
        c.publish(f"{self.root}/ota/data", pack_chunk(header, data), qos=0)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_every_refusal_over_the_air_leaves_the_device_as_it_was(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    _, sub, d = running(demo, tmp_path, signer, broker, subscribe, start_daemon, 5)
    state = tmp_path / "cam-01"
    before = tree(state)
    stranger_path, _ = generate_key(tmp_path / "stranger")
    six = build(demo, tmp_path, signer, 6)
    flipped = tmp_path / "flipped.tar"
    with tarfile.open(six) as src, tarfile.open(flipped, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "manifest.json":
                data = data.replace(b'"version": 6', b'"version": 7')
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    cases = {
        "bad_signature": flipped,
        "unknown_key": build(demo, tmp_path, load_signing_key(stranger_path), 6),
        "expired": build(demo, tmp_path, signer, 6, expires="2020-01-01T00:00:00Z"),
        "older_version": build(demo, tmp_path, signer, 4),
        "incompatible": build(
            demo, tmp_path, signer, 6, kind="engine", compatibility={"platform": "riscv64", "tensorrt": "10.3.0"}
        ),
    }
    for code, tar in cases.items():
        r = push(broker, tar, "--device", "cam-01")
        assert r.returncode == 1 and f"rejected ({code}:" in r.stderr, (code, r.stderr)
        assert tree(state) == before, f"{code} changed the device's disk"
    hostile = HostilePusher(broker, six, "cam-01")
    try:
        wait_until(
            lambda: any(m.json().get("error", {}).get("code") == "hash_mismatch" for m in sub.on("ota/status")),
            60,
            "the device to refuse the wrong bytes",
        )
    finally:
        hostile.close()
    assert hostile.too_long == 3
    assert tree(state) == before and not any((state / "ota").iterdir())
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 30, "version 5 still serving")
    assert {r["model"]["version"] for r in sub.results()} == {5}
    assert d.stop() == 0
    codes = [e["code"] for e in (m.json() for m in sub.on("events")) if e["type"] == "model_rejected"]
    assert codes == [*cases, "hash_mismatch"], codes  # each refusal is an event too
    last = [m.json() for m in sub.on("model/state") if m.payload][-1]
    assert last["active"] == 5 and last["last"]["code"] == "hash_mismatch"


def test_a_daemon_without_a_store_says_why_it_takes_no_push(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["model"] = {"package": str(demo.packages[MODEL].root), "onnxruntime": {"threads": 1}}
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(write_config(tmp_path / "cam-01.yaml", doc))
    wait_results(sub, 1)
    r = push(broker, build(demo, tmp_path, signer, 2), "--device", "cam-01")
    assert r.returncode == 1 and "not_supported" in r.stderr and "model.package" in r.stderr, r.stderr
    assert d.stop() == 0


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_in_place_on_a_terminal_and_prints_changes_otherwise() -> None:
    from edged.deploy.push import Device, Progress

    devs = [Device("orin-07", total=4 << 20), Device("orin-08", total=4 << 20)]
    tty = _Tty()
    bar = Progress(tty, devs)
    bar.draw(final=True)
    devs[0].bytes, devs[0].state = 2 << 20, "downloading"
    bar.draw(final=True)
    frames = tty.getvalue().split("\x1b[2F")  # the second frame starts by going up over the first
    assert len(frames) == 2 and frames[1].count("\n") == 2
    assert "orin-07" in frames[1] and "[############------------]  50.0%" in frames[1] and "downloading" in frames[1]
    log = io.StringIO()
    plain = Progress(log, devs)
    for _ in range(3):
        plain.draw(final=True)  # nothing changed: nothing more printed
    assert log.getvalue().count("\n") == 2 and "\x1b" not in log.getvalue()
    devs[1].finish("rejected", "older_version: replayed?")
    plain.draw(final=True)
    assert log.getvalue().splitlines()[-1].endswith("rejected (older_version: replayed?)")


def test_an_offer_does_not_outlive_its_pusher(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, subscribe, start_daemon
) -> None:
    """A push to a device that is offline gives up after --timeout; the offer waiting in the device's session
    expires with it (MQTT v5 Message Expiry Interval), so the device, back an hour later, does not start a
    transfer nobody serves."""
    import paho.mqtt.publish as publish_one

    broker = Broker(tmp_path, persistence=True)
    broker.start()
    try:
        cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
        install(cfg, build(demo, tmp_path, signer, 1))
        d = serving(start_daemon(cfg))  # creates the device's persistent session
        assert d.stop() == 0
        r = push(broker, build(demo, tmp_path, signer, 2), "--device", "cam-01", "--timeout", "2", timeout=60)
        assert r.returncode == 1 and "timed_out" in r.stdout + r.stderr, r.stdout + r.stderr
        # mosquitto counts expiry in whole seconds: the offer (expiry 2 s, sent at most 2 s before the push
        # ended) is gone 1.5 s after that at the latest; the property under test is a time, so is the wait
        gone_at = time.monotonic() + 1.5
        sub = subscribe(broker, "edged/#")
        wait_until(lambda: time.monotonic() >= gone_at, 5, "the offer's expiry")
        d = serving(start_daemon(cfg))
        # a command sent now is delivered after anything still queued in the session: its reply means the
        # offer, had it survived, would have been answered already
        publish_one.single("edged/cam-01/cmd/status", b"{}", qos=1, hostname=broker.host, port=broker.port,
                           protocol=mqtt.MQTTv5)  # fmt: skip
        wait_until(lambda: sub.on("cmd/status/reply"), 30, "the status reply")
        assert not [m for m in sub.messages if "/_push/" in m.topic or m.topic.endswith("/ota/status")]
        assert "edged.daemon.lifecycle.ota" not in d.output(), d.output()[-2000:]  # no transfer began
        assert d.stop() == 0
    finally:
        broker.stop()
