"""The bounds on an OTA transfer (issue 26): an HTTP(S) download's overall deadline
(``ota.http_min_rate_kib_s``) against a real nginx that drips the file a byte a second, which
``ota.give_up_s`` (silence) never sees; and the ``cancel`` command (``edged push --cancel``) on a real
daemon over a real mosquitto, for a download over HTTP and for chunks over MQTT."""

from __future__ import annotations

import base64
import json
import os
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.config import OtaConfig, load_config
from edged.errors import Code, ConfigError, EdgedError
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import Broker, edged_cli, wait_until, write_config
from tests.test_mirror import Nginx, downloader, fill, statuses
from tests.test_ota import build, device_doc, install, push, start_push, wait_results

SLOWER = 3  # the margins hold on a machine this many times slower than a quiet one


@pytest.fixture
def dripping(tmp_path: Path) -> Iterator[Nginx]:
    """nginx serving ``tmp_path/www`` one byte a second (its limit_rate), headers included."""
    web = Nginx(tmp_path, tmp_path / "www", limit_rate="1")
    (tmp_path / "www").mkdir(exist_ok=True)
    web.start()
    yield web
    web.stop()


def test_a_drip_fails_at_its_deadline_and_a_cancel_stops_a_download_at_once(tmp_path: Path, dripping: Nginx) -> None:
    www = tmp_path / "www"
    (www / "sha256").mkdir(parents=True)
    body = os.urandom(64 * 1024)
    (www / "sha256" / "x").write_bytes(body)
    web = dripping
    url = f"{web.url}/sha256/x"
    # deadline: ota.http_timeout_s 1 s + 64 KiB at 32 KiB/s = 3 s; the drip never goes silent for give_up_s
    t0 = time.monotonic()
    with pytest.raises(EdgedError, match=r"slower than ota\.http_min_rate_kib_s \(32 KiB/s\) allows") as e:
        fill(downloader(http_min_rate_kib_s=32, http_timeout_s=1, give_up_s=600), [url], tmp_path / "a", len(body))
    took = time.monotonic() - t0
    assert e.value.code == Code.STALLED and "deadline of 3 s" in str(e.value), e.value
    assert 3.0 <= took < 3.0 + 3 * SLOWER * 2, took
    # a cancel from another thread: the download (no deadline here) returns at once, the file short
    dl = downloader(http_min_rate_kib_s=0, give_up_s=600)
    (tmp_path / "b").mkdir()
    cancelled: dict[str, float] = {}

    def cancel_soon() -> None:
        # once the GET is under way (its connection made), so the cancel cuts a read the drip blocks
        deadline = time.monotonic() + 30 * SLOWER
        while dl._sock is None and time.monotonic() < deadline:
            time.sleep(0.05)
        cancelled["at"] = time.monotonic()
        dl.cancel()

    threading.Thread(target=cancel_soon, daemon=True).start()
    part, _ = fill(dl, [url], tmp_path / "b", len(body))
    assert part.done < len(body)
    assert time.monotonic() - cancelled["at"] < 1.0 * SLOWER, "the cancel did not cut the blocked read at once"


def test_a_cap_below_the_minimum_rate_is_refused_naming_both_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"http_rate_kib_s \(4\) is below http_min_rate_kib_s \(8\)"):
        OtaConfig(http_rate_kib_s=4)
    assert OtaConfig(http_rate_kib_s=4, http_min_rate_kib_s=0).http_rate_kib_s == 4  # 0: no deadline
    assert OtaConfig().http_min_rate_kib_s == 8  # the default: a real slow link passes, a drip does not
    cfg = write_config(tmp_path / "c.yaml", {"ota": {"http_rate_kib_s": 2, "http_min_rate_kib_s": 16}})
    with pytest.raises(ConfigError, match=r"ota.*http_rate_kib_s \(2\) is below http_min_rate_kib_s \(16\)"):
        load_config(cfg)


def test_a_drip_fed_download_gives_up_at_its_deadline_and_a_newer_version_is_accepted(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon, dripping: Nginx
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    # the deadline of each file: 2 s + its size at 256 KiB/s (the ~590 KiB model: about 4.3 s)
    doc["ota"].update(retry_s=0.5, give_up_s=3600, http_timeout_s=2, http_min_rate_kib_s=256)
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    www = tmp_path / "www"
    web = dripping
    v2 = build(demo, tmp_path, signer, 2)
    t0 = time.monotonic()
    # the mirror drips every byte (its answers to a HEAD too: the check is left out, as where only devices reach it)
    r = push(broker, v2, "--device", "cam-01", "--mirror", str(www), "--mirror-url", web.url + "/", "--no-mirror-check")
    took = time.monotonic() - t0
    assert r.returncode == 1 and "failed (stalled:" in r.stderr and "ota.http_min_rate_kib_s (256 KiB/s)" in r.stderr, (
        r.stderr + d.output()[-3000:]
    )
    failed = [s for s in statuses(sub) if s["state"] == "failed"]
    assert failed and failed[-1]["error"]["code"] == "stalled", statuses(sub)
    assert "slower than ota.http_min_rate_kib_s (256 KiB/s) allows" in failed[-1]["error"]["message"]
    # the first file's deadline is at most 2 s + 590 KiB / 256 KiB/s: the push's own start and the daemon's
    # reply come on top (a machine three times slower: that much more)
    assert took < 10 + 20 * SLOWER, took
    assert d.proc.poll() is None
    # the device is free: a newer version is accepted and served (over MQTT chunks)
    r = push(broker, build(demo, tmp_path, signer, 3), "--device", "cam-01")
    assert r.returncode == 0 and "probation" in r.stderr and "busy" not in r.stderr, r.stderr + d.output()[-3000:]
    wait_results(sub, 3)
    assert d.stop() == 0


class SilentPusher:
    """A peer that offers a properly signed package over MQTT and never serves a chunk: the device's chunk
    transfer runs (waiting on ``ota.give_up_s``) until something stops it."""

    def __init__(self, broker: Broker, tar: Path, device: str, transfer: str) -> None:
        with tarfile.open(tar) as t:
            members = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        offer = {
            "transfer": transfer,
            "manifest": base64.b64encode(members["manifest.json"]).decode(),
            "sig": base64.b64encode(members["manifest.sig"]).decode(),
        }
        self.c.publish(f"edged/{device}/cmd/ota", json.dumps(offer), qos=1).wait_for_publish(10)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def cancel(broker: Broker, *args: str) -> Any:
    return edged_cli("push", "--cancel", "--host", broker.host, "--port", str(broker.port), *args, timeout=120)


def test_edged_push_cancel_stops_a_download_over_http_and_a_chunk_transfer_and_frees_the_device(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon, dripping: Nginx
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"].update(retry_s=0.5, give_up_s=3600, http_min_rate_kib_s=0)  # nothing but a cancel ends these
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    ota_dir = tmp_path / "cam-01" / "ota"

    def state_of(transfer: str) -> str:
        return next((s["state"] for s in reversed(statuses(sub)) if s["transfer"] == transfer), "")

    # nothing runs: a clear refusal
    r = cancel(broker, "--device", "cam-01")
    assert r.returncode == 1 and "no_transfer: no transfer runs: nothing to cancel" in r.stderr, r.stderr
    # 1. a download from a mirror that drips: the pusher follows it, the cancel ends both
    www = tmp_path / "www"
    web = dripping
    v2 = build(demo, tmp_path, signer, 2)
    p = start_push(broker, v2, "--device", "cam-01", "--mirror", str(www), "--mirror-url", web.url + "/",
                   "--no-mirror-check", "--timeout", "600")  # fmt: skip
    wait_until(lambda: any(s["state"] == "accepted" for s in statuses(sub)), 60, "the device to accept the offer")
    (http_transfer,) = {s["transfer"] for s in statuses(sub)}
    wait_until(lambda: any(ota_dir.glob("*/package")), 30, "the download to start")
    t0 = time.monotonic()
    r = cancel(broker, "--device", "cam-01")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr + d.output()[-3000:]
    assert re.search(rf"ok +cam-01 +cancelled transfer {http_transfer} of blazeface-back@2", r.stderr), r.stderr
    assert took < 10 * SLOWER, took  # the CLI's start and the broker's round trip; the device stops at once
    assert state_of(http_transfer) == "cancelled" and not any(ota_dir.iterdir()), "its files are dropped"
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1 and "cancelled" in out, out
    # 2. chunks over MQTT from a pusher that never serves them
    silent = SilentPusher(broker, build(demo, tmp_path, signer, 3), "cam-01", "silent-3")
    try:
        wait_until(lambda: state_of("silent-3") == "accepted", 60, "the chunk transfer to start")
        wait_until(lambda: bool(sub.on("ota/req")), 30, "the device to ask for chunks")
        r = cancel(broker, "--device", "cam-01")
        assert r.returncode == 0 and "cancelled transfer silent-3 of blazeface-back@3" in r.stderr, r.stderr
        assert state_of("silent-3") == "cancelled" and not any(ota_dir.iterdir())
    finally:
        silent.close()
    # the device is free, and still serves version 1: version 3 pushed next is accepted and served
    r = push(broker, build(demo, tmp_path, signer, 3), "--device", "cam-01")
    assert r.returncode == 0 and "probation" in r.stderr, r.stderr + d.output()[-3000:]
    wait_results(sub, 3)
    assert d.stop() == 0


def test_push_cancel_needs_devices_and_nothing_else() -> None:
    for args in ((), ("pkg.tar", "--device", "cam-01"), ("--group", "dock")):
        r = edged_cli("push", "--cancel", *args)
        assert r.returncode == 2 and "--cancel takes --device ID" in r.stderr, r.stderr
