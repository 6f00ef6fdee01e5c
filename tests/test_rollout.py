"""Rollouts that survive the pusher (issue 20 item 2): waves, the state file, kill and resume, a device
offline during the push catching up through the group's retained offer, a failing wave aborting the
rest. Real mosquitto, real daemons on the demo model, the real `edged push` CLI killed with SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.deploy.rollout import allowed_failures, parse_waves, plan_waves
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import REPO, Broker, DaemonProc, Message, Subscriber, edged_cli, free_port, wait_until, write_config
from tests.fleet import (
    PUSH_TIMEOUT_S,
    WAIT_OFFLINE_S,
    current,
    fleet,
    offers,
    push_cmd,
    retained_offline,
    wait_fleet_serving,
)
from tests.test_mirror import nginx_factory  # noqa: F401  (fixture: a real nginx)
from tests.test_ota import build, device_doc, install, serving
from tests.test_site import acked, connect, shipped, site, subscribed  # noqa: F401  (fixtures: a real site)


def test_waves_thresholds_and_the_plan() -> None:
    assert parse_waves("1,10,50,100") == [1, 10, 50, 100]
    assert parse_waves("25") == [25, 100]
    for bad in ("10,5", "0,100", "x", "150"):
        with pytest.raises(ValueError, match="--waves"):
            parse_waves(bad)
    assert allowed_failures("3", 1000) == 3 and allowed_failures("2%", 1000) == 20 and allowed_failures("2%", 20) == 0
    with pytest.raises(ValueError, match="--max-failures"):
        allowed_failures("-1", 10)
    devs = [f"d{i:02}" for i in range(20)]
    plan = plan_waves(devs, 0, [1, 10, 50, 100])
    assert [len(w) for w in plan] == [1, 1, 8, 10] and [d for w in plan for d in w] == devs
    plan = plan_waves(devs, 2, [50, 100])
    assert [len(w) for w in plan] == [2, 9, 9]
    assert plan_waves(devs[:3], 0, [1, 10, 50, 100]) == [["d00"], ["d01"], ["d02"]]  # no empty wave


def rollout_kill_resume_catch_up(
    n: int,
    broker: Broker,
    demo: DemoAssets,
    tmp: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    names = [f"cam-{i:02}" for i in range(1, n + 1)]
    late = names[-1]  # offline during the push
    cfgs = fleet(broker, demo, tmp, signer, names)
    sub = subscribe(broker, "edged/#")
    daemons = {dev: start_daemon(cfgs[dev]) for dev in names[:-1]}
    retained_offline(broker, late, ["dock"])
    wait_fleet_serving(list(daemons.values()))
    v2 = build(demo, tmp, signer, 2)
    state = tmp / "rollout.json"
    first_wave = max(1, (n - 1) // 4)
    pct = str(100 * first_wave // (n - 1))
    cmd = push_cmd(broker, str(v2), "--group", "dock", "--waves", f"{pct},100", "--state", str(state))
    log = tmp / "push1.log"
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO)

    def downloading_in_last_wave() -> bool:  # killed while the last wave's devices download, if it can be seen
        text = log.read_text()
        last = text.partition("wave 2/2")[2]
        return any(s in last for s in ("downloading", "verifying", "installing", "probation")) or p.poll() is not None

    # the first wave ends within the pusher's timeout; then the last one starts
    wait_until(downloading_in_last_wave, PUSH_TIMEOUT_S + 120, "the rollout's last wave to download")
    assert p.poll() is None, log.read_text()
    p.send_signal(signal.SIGKILL)  # killed in the middle: nothing flushed at exit
    p.wait(10)
    doc = json.loads(state.read_text())
    assert doc["status"] == "running" and doc["wave"] == 1, doc
    first = doc["plan"][0]
    assert len(first) == first_wave and all(doc["outcomes"][d]["state"] == "committed" for d in first), doc
    assert late in doc["offline"] and all(late not in w for w in doc["plan"]), doc

    # resumed; the late device comes back while it runs and takes the group's retained offer
    log2 = tmp / "push2.log"
    with open(log2, "w") as out:
        p2 = subprocess.Popen(
            push_cmd(broker, "--resume", str(state), "--wait-offline", str(WAIT_OFFLINE_S)),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
    wait_until(lambda: "group 'dock'" in log2.read_text() or p2.poll() is not None, 60, "the resumed discovery")
    daemons[late] = start_daemon(cfgs[late])
    # the last wave (its timeout), then the late device (the offline wait): one after the other
    rc = p2.wait(PUSH_TIMEOUT_S + WAIT_OFFLINE_S + 120)
    assert rc == 0, log2.read_text() + "".join(d.output()[-3000:] for d in daemons.values())
    text = log2.read_text()
    assert f"{n} of {n} device(s) succeeded" in text, text
    for dev in names:
        assert current(tmp, dev) == 2, dev
    sent = offers(sub)
    for dev in first:  # committed before the kill: never offered again
        assert sent.get(dev) == 1, (dev, sent)
    assert late not in sent, sent  # caught up through the group's offer alone
    assert "taking group dock's offer" in daemons[late].output()

    def offers_to_group() -> list[Message]:
        return sub.on("_groups/dock/ota")

    assert any(m.payload for m in offers_to_group())
    # nobody serves the group's offer once the pusher is gone: withdrawn
    wait_until(lambda: offers_to_group()[-1].payload == b"", 10, "the group's offer withdrawn")
    final = json.loads(state.read_text())
    assert final["status"] == "done" and final["outcomes"][late]["state"] in ("probation", "committed"), final
    for d in daemons.values():
        assert d.stop() == 0


def test_a_rollout_killed_and_resumed_and_an_offline_device_catches_up(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    rollout_kill_resume_catch_up(5, broker, demo, tmp_path, signer, start_daemon, subscribe)


@pytest.mark.slow
@pytest.mark.start_early(400)
@pytest.mark.timeout(1800)  # 20 daemons on a 2-core machine: the pusher's own bounds (above) add up past 600 s
def test_a_rollout_to_20_daemons_killed_and_resumed(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    rollout_kill_resume_catch_up(20, broker, demo, tmp_path, signer, start_daemon, subscribe)


def test_a_failing_wave_aborts_the_rest(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    """cam-01 already runs v3, so it refuses v2 (older): the first wave fails, the second is never offered,
    the group's offer is withdrawn, exit 3; running the same command again does not resume an abort."""
    cfgs = fleet(broker, demo, tmp_path, signer, ["cam-02"])
    cfgs.update(fleet(broker, demo, tmp_path, signer, ["cam-01"], version=3))
    sub = subscribe(broker, "edged/#")
    daemons = [serving(start_daemon(cfgs[dev])) for dev in ("cam-01", "cam-02")]
    v2 = build(demo, tmp_path, signer, 2)
    state = tmp_path / "rollout.json"
    args = (str(v2), "--group", "dock", "--waves", "50,100", "--state", str(state))
    r = subprocess.run(push_cmd(broker, *args), capture_output=True, text=True, cwd=REPO, timeout=240)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "ABORTED after wave 1/2" in r.stderr and "older" in r.stderr, r.stderr
    assert "skipped" in r.stderr and "left untouched" in r.stderr, r.stderr
    assert offers(sub) == {"cam-01": 1}
    assert current(tmp_path, "cam-02") == 1 and current(tmp_path, "cam-01") == 3
    doc: dict[str, Any] = json.loads(state.read_text())
    assert doc["status"] == "aborted" and doc["outcomes"]["cam-02"]["state"] == "skipped", doc
    assert not [m for m in sub.on("_groups/dock/ota") if m.payload], "no group offer before the last wave"
    again = edged_cli(*push_cmd(broker, *args)[3:])
    assert again.returncode == 2 and "aborted" in again.stderr, again.stderr
    assert offers(sub) == {"cam-01": 1}
    for d in daemons:
        assert d.stop() == 0


def test_a_state_file_of_another_package_is_refused_and_the_default_one_is_replaced(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edged.daemon.config import MqttConfig
    from edged.deploy.rollout import default_state_path, new_rollout, start_rollout

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    from edged.models.signing import generate_key, load_signing_key

    other = load_signing_key(generate_key(tmp_path / "other")[0])
    a, b = build(demo, tmp_path, signer, 2), build(demo, tmp_path, other, 2)  # the same version, signed again
    _, ref, r = new_rollout(a, "dock", [], [100.0], 0, "0", "swap")
    r.path = tmp_path / "named.json"
    r.status = "stopped"
    r.save()
    out = tmp_path / "out.txt"
    cfg = MqttConfig(host="127.0.0.1", port=1)  # nothing is sent: refused before connecting
    with open(out, "w") as f:
        assert start_rollout(cfg, b, [], "dock", 0, "swap", 10, out=f, state=r.path) == 2
    assert "another package" in out.read_text()
    r.status = "aborted"
    r.reason = "2 failure(s)"
    r.save()
    with open(out, "w") as f:
        assert start_rollout(cfg, None, [], None, 0, "swap", 10, out=f, resume=r.path) == 2
    assert "aborted (2 failure(s))" in out.read_text()
    assert (
        default_state_path(ref, "dock", [], "h_1")
        == tmp_path / "xdg" / "edged" / "rollouts" / f"{ref}-group-dock-h_1.json"
    )


def test_sigterm_stops_a_rollout_that_resumes_later(
    broker: Broker, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """SIGTERM means Ctrl-C: the state is saved as stopped, exit 130, the resume command printed."""
    state = tmp_path / "rollout.json"
    cmd = push_cmd(broker, str(build(demo, tmp_path, signer, 2)), "--device", "ghost", "--state", str(state))
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stderr is not None
    lines = []
    for line in p.stderr:
        lines.append(line)
        if "wave 1/1" in line:
            break
    p.send_signal(signal.SIGTERM)
    rest = p.communicate(timeout=30)[1]
    assert p.returncode == 130, "".join(lines) + rest
    assert f"edged push --resume {state}" in rest
    doc = json.loads(state.read_text())
    assert doc["status"] == "stopped" and doc["plan"] == [["ghost"]], doc


def test_a_rollout_runs_in_one_push_at_a_time(
    broker: Broker, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """While an `edged push` runs a rollout, resuming it (or naming its state file) from another is refused;
    the same command from another operator (the default state file) is a rollout of its own."""
    state = tmp_path / "rollout.json"
    pkg = str(build(demo, tmp_path, signer, 2))
    p = subprocess.Popen(
        push_cmd(broker, pkg, "--device", "ghost", "--state", str(state)), stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    assert p.stderr is not None
    for line in p.stderr:
        if "wave 1/1" in line:
            break
    try:
        for args in (["--resume", str(state)], [pkg, "--device", "ghost", "--state", str(state)]):
            r = subprocess.run(push_cmd(broker, *args), capture_output=True, text=True, cwd=REPO, timeout=60)
            assert r.returncode == 2 and "an edged push runs this rollout now" in r.stderr, r.stderr
        assert json.loads(state.read_text())["status"] == "running"
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    assert p.returncode == 130


def test_a_group_offer_older_than_the_device_runs_is_refused_once(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    """A retained group offer of v2 to a device on v3: refused (older_version) on its ota/status, and not
    taken again when the device connects again (a restart)."""
    from edged.models.store.files import read_head
    from edged.protocol.ota import group_offer_payload, offer_args

    cfgs = fleet(broker, demo, tmp_path, signer, ["cam-01"], version=3)
    sub = subscribe(broker, "edged/cam-01/ota/status")
    manifest, sig = read_head(build(demo, tmp_path, signer, 2))
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"ops-{free_port()}", protocol=mqtt.MQTTv5)
    c.connect(broker.host, broker.port)
    c.loop_start()
    payload = group_offer_payload("dock", offer_args("rollout-older", manifest, sig))
    c.publish("edged/_groups/dock/ota", payload, qos=1, retain=True).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()
    d = serving(start_daemon(cfgs["cam-01"]))

    def refused() -> list[dict[str, Any]]:
        docs = [m.json() for m in sub.on("ota/status") if m.payload]
        return [x for x in docs if x["transfer"] == "rollout-older" and x["state"] == "rejected"]

    wait_until(lambda: bool(refused()), 30, "the group offer refused")
    assert refused()[0]["error"]["code"] == "older_version"
    assert d.stop() == 0
    d2 = serving(start_daemon(cfgs["cam-01"]))
    wait_until(lambda: "offer rollout-older was taken before" in d2.output(), 30, "the offer seen again")
    assert d2.stop() == 0
    assert "taking group dock's offer" in d.output() and "taking group dock's offer" not in d2.output()
    assert current(tmp_path, "cam-01") == 3


def test_the_shipped_acl_carries_a_group_offer_and_the_fence(shipped: Any, connect: Any) -> None:  # noqa: F811
    """The backend writes a group's retained offer and discovery's fence; every device reads the offer and
    none can write it (a device could otherwise offer to the whole group)."""
    backend, seen = connect(shipped, "backend")
    cam1, got1 = connect(shipped, "cam-01")
    subscribed(backend, "edged/_push/+/sync")
    assert not acked(backend, "edged/_push/0123456789abcdef/sync", b"fence").is_failure
    wait_until(lambda: any(m.topic.endswith("/sync") for m in list(seen)), 5, "the fence back")
    assert acked(cam1, "edged/_groups/dock/ota").value == 0x87
    assert acked(cam1, "edged/_push/0123456789abcdef/sync").value == 0x87
    subscribed(cam1, "edged/_groups/dock/ota")
    assert not acked(backend, "edged/_groups/dock/ota", b'{"offer": 1}').is_failure
    wait_until(lambda: any(m.topic == "edged/_groups/dock/ota" for m in list(got1)), 5, "the offer at the device")


def test_with_a_mirror_a_device_back_after_the_pusher_left_catches_up_from_the_web_server(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
    nginx_factory: Any,  # noqa: F811
) -> None:
    """`edged push --group --mirror`: the pusher serves no bytes, so the group's retained offer outlives it
    (no expiry, not withdrawn): a device that was offline for the whole push comes back after `edged push`
    has exited, takes the group's offer and downloads the files from nginx."""
    cfgs = fleet(broker, demo, tmp_path, signer, ["cam-01", "cam-02"])
    sub = subscribe(broker, "edged/#")
    d1 = serving(start_daemon(cfgs["cam-01"]))
    retained_offline(broker, "cam-02", ["dock"])
    www = tmp_path / "www"
    web = nginx_factory(www)
    v2 = build(demo, tmp_path, signer, 2)
    state = tmp_path / "rollout.json"
    cmd = push_cmd(broker, str(v2), "--group", "dock", "--mirror", str(www), "--mirror-url", web.url + "/")
    r = subprocess.run([*cmd, "--state", str(state)], capture_output=True, text=True, cwd=REPO, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr  # cam-02 stayed offline
    assert "1 of 2 device(s) succeeded" in r.stderr, r.stderr
    outcome = json.loads(state.read_text())["outcomes"]["cam-02"]
    assert outcome["state"] == "offline" and "from the mirror when it is back" in outcome["error"], outcome
    assert current(tmp_path, "cam-01") == 2
    got = [m for m in sub.on("_groups/dock/ota")]
    assert got and got[-1].payload, "the group's offer is still retained after the pusher left"
    assert json.loads(got[-1].payload)["urls"], got[-1].payload
    before = len(web.requests())
    d2 = start_daemon(cfgs["cam-02"])  # back after the push: nobody serves chunks over MQTT any more
    wait_until(lambda: current(tmp_path, "cam-02") == 2, 120, "cam-02 on v2 from the mirror\n" + d2.output()[-3000:])
    gets = [q for q in web.requests()[before:] if q[1] == "GET" and q[0] in (200, 206)]
    assert gets, web.requests()
    assert "taking group dock's offer" in d2.output()
    assert d1.stop() == 0 and d2.stop() == 0


def test_the_pusher_forgets_the_chunks_paho_dropped_at_a_reconnect_and_sends_again(
    broker: Broker, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """paho's reconnect() drops the QoS 0 chunks it had not written without an on_publish for them: the
    bounded sender must not count them for good (it would stop sending, and every device would stall)."""
    from edged.daemon.config import MqttConfig
    from edged.deploy.push import Device
    from edged.deploy.rollout.pusher import RolloutPusher

    pkg = build(demo, tmp_path, signer, 2)
    p = RolloutPusher(MqttConfig(host=broker.host, port=broker.port), pkg, max_out_bytes=1 << 20)
    try:
        p.connect()
        name = max(p.manifest.files, key=lambda n: p.manifest.files[n].size)
        size = p.manifest.files[name].size
        dev = Device("cam-01", total=p.total)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)  # the broker stops reading: chunks pile up in paho
        try:
            for _ in range(64):
                p._send(dev, name, 0, size)
            wait_until(lambda: p.out_bytes >= p.max_out_bytes, 10, "chunks held in paho's queue")
        finally:
            broker.proc.send_signal(signal.SIGKILL)
            broker.proc.send_signal(signal.SIGCONT)
            broker.proc.wait(10)
        broker.start()
        wait_until(lambda: p._connected.is_set() and p.out_bytes == 0, 30, f"reconnected, {p.out_bytes} B held")
        served = dev.served
        p._serve(dev, {"transfer": p.transfer, "file": name, "offset": 0, "length": size})  # asked again
        wait_until(lambda: dev.served > served, 10, "a chunk sent after the reconnect")
    finally:
        p.close()


def test_a_group_offer_the_broker_refuses_is_reported_not_taken_for_published(
    tmp_path: Path, demo: DemoAssets, signer: SigningKey
) -> None:
    """A broker whose ACL does not let the pusher write `<prefix>/_groups/+/ota` answers the retained group
    offer with 0x87: `edged push` says so (offline devices will not take it) instead of reporting it out."""
    import io

    from edged.daemon.config import MqttConfig
    from edged.deploy.rollout import _publish_group_offer
    from edged.deploy.rollout.pusher import RolloutPusher

    acl = tmp_path / "acl"
    acl.write_text("topic readwrite edged/_push/#\n")
    b = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}")
    b.start()
    out = io.StringIO()
    p = RolloutPusher(MqttConfig(host=b.host, port=b.port), build(demo, tmp_path, signer, 2), out)
    try:
        p.connect()
        _publish_group_offer(p, "dock", 60)
        assert p.group_offered is None
        assert "WARNING: the broker refused it" in out.getvalue() and "edged/_groups/+/ota" in out.getvalue()
    finally:
        p.close()
        b.stop()


def test_a_group_offer_whose_download_stopped_short_is_taken_again_at_the_next_connect(
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    nginx_factory: Any,  # noqa: F811
) -> None:
    """A device back after `edged push --mirror` exited takes the group's offer while the mirror is down: its
    download stalls (bytes kept). The mirror comes back; at its next connect (a broker restart here) the
    retained offer, taken before, is taken again because its transfer stopped short, and the device catches
    up — not only at its next restart."""
    b = Broker(tmp_path, persistence=True)  # the retained offer survives the broker's restart
    b.start()
    try:
        cfgs = fleet(b, demo, tmp_path, signer, ["cam-01"])
        doc = device_doc(b, demo, tmp_path, "cam-02", probation_s=3, probation_batches=10, probation_latency_ratio=3)
        doc["groups"] = ["dock"]
        doc["cameras"][0]["fps_max"] = 4
        doc["ota"].update(retry_s=0.5, give_up_s=2)
        cfg2 = write_config(tmp_path / "cam-02.yaml", doc)
        install(cfg2, build(demo, tmp_path, signer, 1))
        d1 = serving(start_daemon(cfgs["cam-01"]))
        retained_offline(b, "cam-02", ["dock"])
        www = tmp_path / "www"
        web = nginx_factory(www)
        v2 = build(demo, tmp_path, signer, 2)
        cmd = push_cmd(b, str(v2), "--group", "dock", "--mirror", str(www), "--mirror-url", web.url + "/")
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240)
        assert r.returncode == 1 and "1 of 2 device(s) succeeded" in r.stderr, r.stdout + r.stderr
        web.stop()  # the mirror is down when cam-02 comes back
        d2 = start_daemon(cfg2)
        try:
            wait_until(lambda: "refused: no byte of" in d2.output(), 60, "cam-02's download stalled")
        except AssertionError:
            raise AssertionError(d2.output()[-4000:]) from None
        assert current(tmp_path, "cam-02") == 1
        web.start()
        b.stop()  # cam-02 connects again: the broker sends the retained group offer again
        b.start()
        wait_until(lambda: current(tmp_path, "cam-02") == 2, 120, "cam-02 on v2\n" + d2.output()[-3000:])
        assert "stopped short here: taken again" in d2.output()
        assert d1.stop() == 0 and d2.stop() == 0
    finally:
        b.stop()
