"""Faults at start-up and the probation's verdict on them (issue 21): nothing lost, no healthy model blamed.

Real daemon processes (`python -m edged run`), real signals, a real mosquitto, the real store on disk, real
read-only mounts. A long warm-up comes from a real, slow model (the demo model plus dead matrix products,
see tests/test_ota.slow_variant) and `inference.warmup_batches`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
import yaml
from onnx import helper, numpy_helper
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.config import load_config
from edged.daemon.lifecycle.loader import resolve_package
from edged.errors import ConfigError, PackageError
from edged.models.demo import DemoAssets
from edged.models.package import pack_tar, write_package
from edged.models.signing import SigningKey, TrustStore
from edged.models.store import Store
from tests.conftest import Broker, DaemonProc, base_config, edged_cli, wait_until, write_config
from tests.test_ota import MODEL, build, device_doc, install, serving, slow_variant, store_view, wait_results


def state_doc(state_dir: Path) -> dict[str, Any]:
    return dict(json.loads((state_dir / "models" / MODEL / "state.json").read_text()))


def on_probation(demo: DemoAssets, tmp: Path, signer: SigningKey, broker: Broker, **cfg: Any) -> tuple[Path, Path]:
    """Device cam-01 with version 1 committed and version 2 on probation (a slow model with `slow=N` dead
    matrix products); returns (config, state dir)."""
    slow = cfg.pop("slow", 0)
    inference = cfg.pop("inference", None)
    doc = device_doc(broker, demo, tmp, "cam-01", **cfg)
    if inference:
        doc["inference"].update(inference)
    path = write_config(tmp / "cam-01.yaml", doc)
    install(path, build(demo, tmp, signer, 1))
    model = slow_variant(demo.packages[MODEL].model_path, tmp / "slow.onnx", slow) if slow else None
    install(path, build(demo, tmp, signer, 2, model=model))
    state = tmp / "cam-01"
    assert state_doc(state)["pending"] == 2
    return path, state


def exited(d: DaemonProc, timeout: float = 60) -> int:
    try:
        return d.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the daemon still runs after {timeout} s:\n{d.output()[-3000:]}") from None


# --- A: only crashes the model could have caused count on probation ----------------------------------


def test_failed_starts_that_never_reach_the_model_are_not_probation_crashes(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, start_daemon
) -> None:
    """A corrupt spool.db (opened before the model) and an MQTT TLS file that is missing (found after the
    model is loaded): three starts each, and version 2 is still on probation with no crash counted."""
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    for _ in range(3):
        (state / "spool.db").write_bytes(b"this is not an SQLite database " * 64)
        d = start_daemon(cfg)

        def ended_or_serving(d: DaemonProc = d) -> bool:
            return d.proc.poll() is not None or "serving 1 camera(s)" in d.output()

        wait_until(ended_or_serving, 60, "the start to fail, or to serve")
        if d.proc.poll() is None:  # a daemon that quarantines the bad spool serves: stop it
            assert d.stop() == 0
        st = state_doc(state)
        assert (st["pending"], st["probation_crashes"], st["probation_boot"]) == (2, 0, None), d.output()[-3000:]
    (state / "spool.db").unlink()
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["mqtt"]["tls"] = {"ca_file": str(tmp_path / "no-such-ca.pem")}
    tls_cfg = write_config(tmp_path / "tls.yaml", doc)
    for _ in range(3):
        d = start_daemon(tls_cfg)
        assert exited(d) == 1, d.output()
        assert "no-such-ca.pem" in d.output() and "Traceback" not in d.output()
        assert "not counted against blazeface-back on probation" in d.output()
    st = state_doc(state)
    assert (st["pending"], st["probation_crashes"], st["probation_boot"]) == (2, 0, None)
    assert store_view(state)["current"] == 2


# --- B: SIGTERM in the warm-up, and one daemon per state directory ------------------------------------


def test_sigterm_during_the_warm_up_is_a_clean_stop_not_a_crash(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, start_daemon
) -> None:
    cfg, state = on_probation(demo, tmp_path, signer, broker, slow=60, inference={"warmup_batches": 100})
    d = start_daemon(cfg)
    wait_until(lambda: "warming up" in d.output(), 60, "the warm-up to begin")
    d.proc.send_signal(signal.SIGTERM)
    assert exited(d, 30) == 0, d.output()
    assert "stop requested during the warm-up" in d.output() and "stopped cleanly before serving" in d.output()
    st = state_doc(state)
    assert (st["pending"], st["probation_crashes"], st["probation_boot"]) == (2, 0, None)
    # the next start (a restart after that stop) counts nothing either
    d = start_daemon(cfg)
    wait_until(lambda: "warming up" in d.output(), 60, "the warm-up to begin")
    assert state_doc(state)["probation_crashes"] == 0
    d.proc.send_signal(signal.SIGINT)
    assert exited(d, 30) == 0, d.output()


def test_a_second_daemon_on_the_same_state_dir_refuses_and_blames_nothing(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    sub = subscribe(broker, "edged/cam-01/#")
    first = serving(start_daemon(cfg))
    wait_results(sub, 2)
    before = state_doc(state)
    spool = (state / "spool.db").stat()
    second = start_daemon(cfg)
    assert exited(second, 60) == 1, second.output()
    out = second.output()
    assert f"another edged (pid {first.proc.pid}) holds the lock {state / 'edged.lock'}" in out, out
    assert "Traceback" not in out and "model store" not in out
    assert state_doc(state) == before, "the second daemon must not touch the store"
    assert (state / "spool.db").stat().st_ino == spool.st_ino
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 5, 30, "the first daemon to keep serving")
    assert {r["boot_id"] for r in sub.results()[n:]} == {sub.results()[0]["boot_id"]}
    assert first.proc.poll() is None
    assert first.stop() == 0
    st = state_doc(state)
    assert (st["pending"], st["probation_crashes"], st["probation_boot"]) == (2, 0, None)


# --- C: SIGHUP before ready ------------------------------------------------------------------------------


def test_sighup_during_the_warm_up_is_applied_once_ready(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg, _ = on_probation(demo, tmp_path, signer, broker, slow=60, inference={"warmup_batches": 15})
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_until(lambda: "warming up" in d.output(), 60, "the warm-up to begin")
    d.proc.send_signal(signal.SIGHUP)  # what `systemctl reload edged` sends
    d.proc.send_signal(signal.SIGHUP)
    serving(d)
    wait_until(lambda: "config reloaded from" in d.output(), 30, "the deferred reload")
    out = d.output()
    assert out.count("received SIGHUP while starting") == 1 and out.count("config reloaded from") == 1, out
    assert out.index("received SIGHUP while starting") < out.index("serving 1 camera(s)")
    wait_results(sub, 2)
    assert d.stop() == 0


def test_a_burst_of_signals_while_serving_reloads_and_stops_cleanly(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """Signals act on a thread of their own, never inside whatever the main thread was doing (a handler that
    logs or sets an event there can deadlock or raise): 300 SIGHUPs in a burst, then SIGTERM -> exit 0."""
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    for _ in range(300):
        d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded from" in d.output(), 30, "a reload")
    assert d.stop(timeout=30) == 0, d.output()[-3000:]
    assert "Traceback" not in d.output(), d.output()[-3000:]


# --- D: a rollback command that cannot be done leaves store and serving as they were ---------------------


def front_as(demo: DemoAssets, tmp: Path, key: SigningKey, version: int) -> Path:
    """The 128x128 BlazeFace packaged under MODEL: the same model name, another input spec."""
    src = demo.packages["blazeface-front"]
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields.update(name=MODEL, version=version)
    pkg = write_package(
        tmp / f"front-{version}", fields, {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    )
    return pack_tar(pkg, tmp / f"front-{version}.tar", key.sign(pkg.manifest_bytes))


class Command:
    """Sends `…/cmd/<verb>` over MQTT and collects the replies on `…/cmd/<verb>/reply`."""

    def __init__(self, broker: Broker, root: str) -> None:
        self.root = root
        self.replies: list[dict[str, Any]] = []
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.c.on_message = lambda c, u, m: self.replies.append(json.loads(m.payload))
        self.c.connect(broker.host, broker.port)
        self.c.subscribe(f"{root}/cmd/+/reply", qos=1)
        self.c.loop_start()

    def call(self, verb: str) -> dict[str, Any]:
        n = len(self.replies)
        self.c.publish(f"{self.root}/cmd/{verb}", b"{}", qos=1).wait_for_publish(10)
        wait_until(lambda: len(self.replies) > n, 30, f"a reply to {verb}")
        return self.replies[n]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def command(broker: Broker) -> Iterator[Command]:
    c = Command(broker, "edged/cam-01")
    yield c
    c.close()


def test_a_refused_rollback_command_changes_neither_the_store_nor_what_serves(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon, command: Command
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, front_as(demo, tmp_path, signer, 1))
    install(cfg, build(demo, tmp_path, signer, 2))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 2)
    reply = command.call("rollback")
    assert reply["ok"] is False and reply["error"]["code"] == "input_changed", reply
    view = store_view(tmp_path / "cam-01")
    assert (view["current"], view["bad"]) == (2, []), view  # the store still says what serves
    assert "edged model rollback" in reply["error"]["message"]
    assert state_doc(tmp_path / "cam-01")["pending"] == 2
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 30, "version 2 still serving")
    assert {r["model"]["version"] for r in sub.results()[n:]} == {2}

    def last_state() -> dict[str, Any]:
        return dict([m.json() for m in sub.on("model/state") if m.payload][-1])

    wait_until(lambda: last_state().get("last", {}).get("type") == "model_rollback_failed", 10, "model/state")
    st = last_state()
    assert st["active"] == 2 and st["previous"] == 1 and st["bad"] == [] and st["probation"]["version"] == 2
    failed = sub.wait_events("model_rollback_failed")  # spooled; model/state and the reply went straight out
    assert failed[0]["code"] == "input_changed"
    # a rollback that can be done: version 3 (same input as 2) installed and reloaded, then rolled back
    install(cfg, build(demo, tmp_path, signer, 3))
    d.proc.send_signal(signal.SIGHUP)
    wait_results(sub, 3)
    reply = command.call("rollback")
    assert reply["ok"] is True and reply["result"]["from"] == 3 and reply["result"]["to"] == 2, reply
    n = len(sub.results())
    wait_until(lambda: sum(1 for r in sub.results()[n:] if r["model"]["version"] == 2) > 3, 30, "version 2 again")
    view = store_view(tmp_path / "cam-01")
    assert (view["current"], view["bad"]) == (2, [3]), view
    wait_until(lambda: last_state()["active"] == 2 and last_state()["bad"] == [3], 10, "model/state after it")
    assert d.stop() == 0


def fails_on_real_frames(src: Path, out: Path) -> Path:
    """The demo model plus a Reshape into rows of 1 value for an all-zero batch (the warm-up) and of 7
    values for anything else, which 786,432 input values do not divide: it loads and warms up, and every
    batch of real frames fails inside ONNX Runtime. A real model with a real runtime error."""
    m = onnx.load(str(src))
    g = m.graph
    x, first = g.input[0].name, g.output[0]
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "bad_zero"),
            numpy_helper.from_array(np.array([6], np.int64), "bad_six"),
            numpy_helper.from_array(np.array([1], np.int64), "bad_one"),
            numpy_helper.from_array(np.array([-1], np.int64), "bad_rest"),
        ]
    )
    g.node.extend(
        [
            helper.make_node("Abs", [x], ["bad_abs"]),
            helper.make_node("ReduceMax", ["bad_abs"], ["bad_max"], keepdims=0),
            helper.make_node("Greater", ["bad_max", "bad_zero"], ["bad_nonzero"]),
            helper.make_node("Cast", ["bad_nonzero"], ["bad_flag"], to=onnx.TensorProto.INT64),
            helper.make_node("Reshape", ["bad_flag", "bad_one"], ["bad_flag1"]),
            helper.make_node("Mul", ["bad_flag1", "bad_six"], ["bad_six_or_zero"]),
            helper.make_node("Add", ["bad_six_or_zero", "bad_one"], ["bad_rows"]),
            helper.make_node("Concat", ["bad_rest", "bad_rows"], ["bad_shape"], axis=0),
            helper.make_node("Reshape", [x, "bad_shape"], ["bad_reshaped"]),
            helper.make_node("ReduceSum", ["bad_reshaped"], ["bad_sum"], keepdims=0),
            helper.make_node("Mul", ["bad_sum", "bad_zero"], ["bad_nothing"]),
        ]
    )
    for node in g.node:  # the first output gets the dead term added, so the Reshape is never pruned
        node.output[:] = [f"{o}_inner" if o == first.name else o for o in node.output]
    g.node.append(helper.make_node("Add", [f"{first.name}_inner", "bad_nothing"], [first.name]))
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


def test_a_probation_verdict_whose_previous_takes_another_input_rolls_back_and_restarts(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, front_as(demo, tmp_path, signer, 1))
    broken = fails_on_real_frames(demo.packages[MODEL].model_path, tmp_path / "broken.onnx")
    install(cfg, build(demo, tmp_path, signer, 2, model=broken))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    assert exited(d, 60) == 3, d.output()  # systemd's Restart=on-failure starts it again
    assert "stopped for a restart" in d.output()
    rolled = sub.wait_events("model_rolled_back")  # sent before the exit; maybe still on its way here
    assert rolled[0]["code"] == "probation_failed" and rolled[0]["restart"] is True, rolled
    view = store_view(tmp_path / "cam-01")
    assert (view["current"], view["bad"]) == (1, [2]), view
    d = start_daemon(cfg)  # what the restart does: version 1, with cameras sized for it
    wait_results(sub, 1)
    assert d.stop() == 0


def test_a_probation_verdict_whose_rollback_is_refused_leaves_no_crash_behind_a_clean_stop(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """Version 2 fails on real frames, but version 1's files are damaged on disk, so the rollback is refused
    and version 2 keeps serving; a clean stop then clears the probation marker like any clean stop (it was no
    crash, and the next start must not count one)."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    broken = fails_on_real_frames(demo.packages[MODEL].model_path, tmp_path / "broken.onnx")
    install(cfg, build(demo, tmp_path, signer, 2, model=broken))
    v1 = tmp_path / "cam-01" / "models" / MODEL / "versions" / "1" / "model.onnx"
    v1.chmod(0o644)
    v1.write_bytes(v1.read_bytes()[:-1] + b"!")
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_until(
        lambda: any(m.json()["type"] == "model_rollback_failed" for m in sub.on("events")), 60, "the refused rollback"
    )
    assert d.stop() == 0, d.output()
    st = state_doc(tmp_path / "cam-01")
    assert (st["pending"], st["probation_boot"], st["probation_crashes"]) == (2, None, 0), st


# --- E: a corrupt current, an engine without compatibility, a corrupt state.json -------------------------


def test_a_corrupt_committed_model_falls_back_to_the_intact_previous(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    Store(state).commit(MODEL)  # version 2 passed its probation
    model = state / "models" / MODEL / "versions" / "2" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    model.chmod(0o644)
    model.write_bytes(bytes(data))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    rolled = [m.json() for m in sub.on("events") if m.json()["type"] == "model_rolled_back"]
    assert rolled and rolled[0]["code"] == "current_corrupt" and rolled[0]["to"] == 1, rolled
    assert "sha256 does not match" in rolled[0]["reason"]
    assert d.stop() == 0
    view = store_view(state)
    assert (view["current"], view["bad"]) == (1, [2])


def test_an_engine_package_without_compatibility_is_refused_at_install(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    engine = demo.packages[MODEL].model_path  # the bytes do not matter: refused before they are read
    tar = build(demo, tmp_path, signer, 1, kind="engine", compatibility={}, files={"model.engine": engine})
    r = edged_cli("model", "install", str(tar), "-c", str(cfg))
    assert r.returncode == 1 and "declares no compatibility" in r.stderr, r.stderr
    assert not (tmp_path / "cam-01" / "models" / MODEL / "versions").exists()
    store = Store(tmp_path / "cam-01")
    with pytest.raises(PackageError, match="declares no compatibility") as exc:
        store.install(tar, TrustStore.load(tmp_path / "trusted"))
    assert exc.value.code == "compatibility_missing"


def test_a_corrupt_state_json_keeps_the_versions_marked_bad(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker
) -> None:
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    v2 = build(demo, tmp_path, signer, 2)
    install(cfg, build(demo, tmp_path, signer, 1))
    install(cfg, v2)
    r = edged_cli("model", "rollback", MODEL, "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    path = tmp_path / "cam-01" / "models" / MODEL / "state.json"
    path.write_bytes(path.read_bytes()[:40])  # truncated
    view = store_view(tmp_path / "cam-01")  # recovers the store first, as a start does
    assert (view["current"], view["bad"]) == (1, [2]), view
    r = edged_cli("model", "install", str(v2), "-c", str(cfg))
    assert r.returncode == 1 and "never retried" in r.stderr, r.stderr


# --- F: a read-only state directory ----------------------------------------------------------------------


def mount_ro(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only file system")
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {r.stderr.strip()}")
    r = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["umount", str(path)], check=False)
        pytest.skip(f"cannot remount read-only here: {r.stderr.strip()}")


@pytest.mark.parametrize("ran_before", [False, True], ids=["fresh", "lock-file-there"])
def test_a_read_only_state_dir_is_one_clear_error(
    ran_before: bool, demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, start_daemon
) -> None:
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    if ran_before:
        (state / "edged.lock").write_text("4242\n")  # left by an earlier run
    before = state_doc(state)
    mount_ro(state)
    try:
        t0 = time.monotonic()
        d = start_daemon(cfg)
        assert exited(d, 60) == 1, d.output()
        out = d.output()
        assert f"state_dir {state}: cannot write the lock file {state / 'edged.lock'}" in out, out
        assert "Read-only file system" in out and "Traceback" not in out, out
        assert time.monotonic() - t0 < 30
    finally:
        subprocess.run(["umount", str(state)], check=False)
    assert state_doc(state) == before


def test_a_config_with_no_model_is_a_config_error(demo: DemoAssets, tmp_path: Path) -> None:
    """The validator asks for exactly one of model.package and model.name; a Config built around it (model_copy
    does not validate) gets a ConfigError that names the two keys when the model is resolved, not an assert."""

    class Nowhere:
        host, port = "127.0.0.1", 1

    cfg = load_config(
        write_config(
            tmp_path / "c.yaml", base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://"}])
        )
    )
    no_model = cfg.model_copy(update={"model": cfg.model.model_copy(update={"package": None, "name": None})})
    with pytest.raises(ConfigError, match=r"exactly one of model\.package .* or model\.name"):
        resolve_package(no_model)


def test_a_thermal_exit_on_probation_is_not_a_model_crash(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, start_daemon
) -> None:
    """A device that runs too hot while version 2 is on probation: the governor's critical action `exit`
    stops the daemon (non-zero, for systemd), three times over as systemd restarts it into the same heat.
    No crash is counted, and what edged-rollback.service runs after the restart limit rolls nothing back:
    heat is not the model's fault."""
    from tests import sysfs_fixtures as fx

    root = fx.orin_nano_jp6(tmp_path / "sys-root")
    governor = {
        "sysfs_root": str(root),
        "interval_s": 0.2,
        "warm_c": 70,
        "hot_c": 80,
        "critical_c": 90,
        "critical_action": "exit",
    }
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    doc = yaml.safe_load(cfg.read_text())
    doc["governor"] = governor
    write_config(cfg, doc)
    for _ in range(3):
        fx.set_temp(root, "tj-thermal", 50.0)
        d = start_daemon(cfg)
        serving(d)
        fx.set_temp(root, "tj-thermal", 95.0)
        assert exited(d) != 0, d.output()[-3000:]
        assert "critical temperature" in d.output()
    s = state_doc(state)
    assert s["pending"] == 2 and s["probation_crashes"] == 0 and s.get("probation_boot") is None, s
    r = edged_cli("model", "rollback", "--if-probation", "-c", str(cfg))
    assert r.returncode == 1 and "no run died with it loaded" in r.stderr, r.stderr
    assert store_view(state)["current"] == 2


def test_a_second_stage_that_fails_at_start_is_not_the_primarys_crash(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, start_daemon
) -> None:
    """Version 2 of the primary on probation and a second stage (`stages:`) whose package its decoder refuses (PP-OCR's
    recogniser with the space class dropped from its manifest): each start fails naming the stage, and none counts as
    a crash of the primary, which did nothing wrong (ModelLoader.start_failed, EdgedError.stage)."""
    cfg, state = on_probation(demo, tmp_path, signer, broker)
    rec = demo.packages["ppocr-rec"]
    fields = json.loads(rec.manifest_bytes)
    del fields["files"]
    fields["decoder"]["params"]["space"] = False
    write_package(tmp_path / "bad-ocr", fields, {name: rec.root / name for name in rec.manifest.files})
    doc = yaml.safe_load(cfg.read_text())
    doc["stages"] = [{"name": "ocr", "model": {"package": str(tmp_path / "bad-ocr")}, "on_labels": ["face"]}]
    write_config(cfg, doc)
    for _ in range(2):
        d = start_daemon(cfg)
        assert exited(d, 120) == 1, d.output()[-3000:]
        assert "stage 'ocr': ctc:" in d.output() and "Traceback" not in d.output(), d.output()[-3000:]
        assert "not counted against blazeface-back on probation" in d.output()
    s = state_doc(state)
    assert (s["pending"], s["probation_crashes"], s.get("probation_boot")) == (2, 0, None), s
