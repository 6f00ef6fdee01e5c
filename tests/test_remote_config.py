"""Remote configuration without a daemon (issue 33): the allow-list, the overlay merged over the file and
validated with key paths, the signed document checked (forged, replayed, another device's), the version
floor, the state dir's copy and `edged config show/clear`. The daemon's side through the shipped broker:
tests/test_remote_config_daemon.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edged.daemon.config import Config, load_config
from edged.daemon.config.remote import load_with_overlay, merged_overlays, refusals
from edged.daemon.lifecycle.remote import RemoteConfig, startup_config
from edged.deploy.config_push import signed_payload
from edged.errors import ConfigError
from edged.models.signing import SigningKey, generate_key, load_signing_key
from edged.protocol.schemas import CONFIG_DOCUMENT_SCHEMA, CONFIG_SCHEMA, CONFIG_STATE_SCHEMA, schema
from tests.conftest import edged_cli, write_config

VIDEO = "file:///nonexistent/demo.mp4"  # never opened here


def config_doc(tmp: Path, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "device_id": "cam-01",
        "state_dir": str(tmp / "state"),
        "groups": ["dock"],
        "model": {"package": str(tmp / "pkg"), "keys_dir": str(tmp / "trusted")},
        "cameras": [{"name": "lobby", "uri": VIDEO}, {"name": "gate", "uri": VIDEO}],
        "detection": {"score_threshold": 0.7},
    }
    doc.update(extra)
    return doc


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    return write_config(tmp_path / "edged.yaml", config_doc(tmp_path))


ZONE = {"name": "door", "points": [[0, 0], [100, 0], [100, 100]]}


def test_the_allow_list_names_each_refused_key_and_why(cfg_path: Path, tmp_path: Path) -> None:
    cfg = load_config(cfg_path)
    state = tmp_path / "state"
    overlay = {
        "mqtt": {"host": "evil"},
        "model": {"name": "x"},
        "bogus": 1,
        "governor": {"sysfs_root": "/tmp", "warm_c": 80},
        "cameras": {
            "lobby": {"uri": "gst://videotestsrc ! appsink", "password_file": "/etc/shadow"},
            "gate": {"uri": "file:///etc/passwd"},
            "attic": {"fps_max": 2},
        },
    }
    got = refusals(overlay, cfg)
    assert any(r.startswith("mqtt: may not change remotely (the broker") for r in got), got
    assert any(r.startswith("model: may not change remotely") for r in got)
    assert "bogus: unknown key" in got
    assert any(r.startswith("governor.sysfs_root:") for r in got) and not any("warm_c" in r for r in got)
    assert any(r.startswith("cameras.lobby.uri: gst://") and "GStreamer pipeline" in r for r in got)
    assert any(r.startswith("cameras.lobby.password_file: may not change remotely") for r in got)
    assert any(r.startswith("cameras.gate.uri: file:///etc/passwd: a file outside the state dir") for r in got)
    assert any(r.startswith("cameras.attic: no such camera here") for r in got)
    # inside the state dir, a network camera, a new zone, a threshold: nothing refused
    fine = {
        "detection": {"score_threshold": 0.4},
        "cameras": {"lobby": {"uri": f"file://{state}/clips/a.mp4", "detection": {"zones": [ZONE]}},
                    "gate": {"uri": "rtsp://10.0.0.5/stream", "fps_max": 3}},
    }  # fmt: skip
    assert refusals(fine, cfg) == []
    assert refusals({"cameras": {"gate": {"uri": f"file://{state}/../escape.mp4"}}}, cfg) != []


def test_the_overlay_merges_over_the_file_and_a_bad_value_names_its_key_path(cfg_path: Path) -> None:
    new = load_with_overlay(cfg_path, {"detection": {"iou_threshold": 0.4}, "cameras": {"gate": {"fps_max": 3}}})
    assert new.detection.score_threshold == 0.7 and new.detection.iou_threshold == 0.4  # merged key by key
    assert [c.fps_max for c in new.cameras] == [15.0, 3.0]
    bad_zone = {"name": "z", "points": [[0, 0], [10, 10], [20, 20]]}  # on one line: no area
    with pytest.raises(ConfigError) as e:
        load_with_overlay(cfg_path, {"cameras": {"gate": {"detection": {"zones": [bad_zone]}}}})
    assert "cameras.gate.detection.zones[0].points:" in str(e.value), e.value
    with pytest.raises(ConfigError, match=r"cameras.lobby.detection.bogus: unknown key"):
        load_with_overlay(cfg_path, {"cameras": {"lobby": {"detection": {"bogus": 1}}}})
    # groups first, then the device: the device's value wins, the groups' other keys stay
    both = merged_overlays(
        [{"detection": {"score_threshold": 0.3, "max_detections": 5}}, {"detection": {"score_threshold": 0.9}}]
    )
    assert both == {"detection": {"score_threshold": 0.9, "max_detections": 5}}


class Applied:
    """The daemon's seams (ours): the config in force, what apply received, the readiness answer."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.applied: list[tuple[Config, str]] = []
        self.ready_answer = ""
        self.retained: list[dict[str, Any]] = []

    def apply(self, new: Config, why: str) -> dict[str, Any]:
        self.cfg = new
        self.applied.append((new, why))
        return {"applied": [], "reopened": [], "restart_needed": []}

    def set_retained(self, suffix: str, doc: dict[str, Any]) -> None:
        assert suffix == "config/state"
        self.retained.append(doc)


@pytest.fixture
def signer2(tmp_path: Path) -> SigningKey:
    key_path, pub = generate_key(tmp_path / "signer")
    (tmp_path / "trusted").mkdir(exist_ok=True)
    (tmp_path / "trusted" / pub.name).write_text(pub.read_text())
    return load_signing_key(key_path)


def receiver(cfg_path: Path, ready_s: float = 5) -> tuple[RemoteConfig, Applied]:
    cfg = load_config(cfg_path)
    cfg = cfg.model_copy(update={"remote_config": cfg.remote_config.model_copy(update={"ready_timeout_s": ready_s})})
    seams = Applied(cfg)
    r = RemoteConfig(
        cfg, cfg_path, seams, threading.Event(), lambda: seams.cfg, lambda: 0, lambda n: seams.ready_answer
    )
    r.applier = seams
    return r, seams


DESIRED = "edged/cam-01/config/desired"


def test_signed_documents_forged_replayed_misdirected_and_kept(
    cfg_path: Path, signer2: SigningKey, tmp_path: Path
) -> None:
    r, seams = receiver(cfg_path)
    dev = {"device": "cam-01"}
    ok = signed_payload(signer2, dev, 5, {"detection": {"score_threshold": 0.42}})
    assert r.handle(DESIRED, ok)["state"] == "applied"
    assert seams.cfg.detection.score_threshold == 0.42 and seams.retained[-1]["versions"] == {"device": 5}
    assert r.handle(DESIRED, ok)["state"] == "unchanged"  # the retained copy again at a reconnect
    env_ok = json.loads(ok)  # the wire's documents against their shipped JSON Schemas
    jsonschema.validate(env_ok, schema(CONFIG_DOCUMENT_SCHEMA))
    jsonschema.validate(json.loads(env_ok["document"]), schema(CONFIG_SCHEMA))
    # forged: the document altered after signing
    env = json.loads(signed_payload(signer2, dev, 6, {"detection": {"score_threshold": 0.5}}))
    env["document"] = env["document"].replace("0.5", "0.05")
    out = r.handle(DESIRED, json.dumps(env).encode())
    assert out["state"] == "refused" and "does not match the document" in out["reasons"][0], out
    # signed by a key this device does not trust
    other = load_signing_key(generate_key(tmp_path / "other")[0])
    out = r.handle(DESIRED, signed_payload(other, dev, 7, {"detection": {"score_threshold": 0.5}}))
    assert out["state"] == "refused" and "does not trust" in out["reasons"][0]
    # replayed: an older version, signed and valid
    out = r.handle(DESIRED, signed_payload(signer2, dev, 4, {"detection": {"score_threshold": 0.1}}))
    assert out["state"] == "refused" and out["reasons"][0].startswith("version: 4 is not newer than 5"), out
    # another device's document, and a group document on the device's topic
    out = r.handle(DESIRED, signed_payload(signer2, {"device": "cam-02"}, 9, {"detection": {}}))
    assert out["state"] == "refused" and out["reasons"][0].startswith("target.device")
    out = r.handle(DESIRED, signed_payload(signer2, {"group": "dock"}, 9, {"detection": {}}))
    assert out["state"] == "refused" and out["reasons"][0].startswith("target: a group:dock document")
    assert seams.cfg.detection.score_threshold == 0.42 and len(seams.applied) == 1  # nothing else changed
    for doc in seams.retained:
        jsonschema.validate(doc, schema(CONFIG_STATE_SCHEMA))
    # a group's document merges under the device's
    group = "edged/_groups/dock/config"
    out = r.handle(
        group,
        signed_payload(signer2, {"group": "dock"}, 1, {"detection": {"score_threshold": 0.2, "max_detections": 7}}),
    )
    assert out["state"] == "applied" and seams.cfg.detection.max_detections == 7
    assert seams.cfg.detection.score_threshold == 0.42  # the device's own document wins
    # kept with the state: a start serves it
    started, why = startup_config(load_config(cfg_path), cfg_path)
    assert why == "" and started.detection.score_threshold == 0.42 and started.detection.max_detections == 7
    # edged config show / clear on the device
    show = edged_cli("config", "show", "-c", str(cfg_path))
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    assert (
        shown["documents"]["device"]["version"] == 5 and shown["overlay_in_force"]["detection"]["max_detections"] == 7
    )
    clear = edged_cli("config", "clear", "-c", str(cfg_path))
    assert clear.returncode == 0 and "dropped device, group:dock" in clear.stdout, clear
    assert startup_config(load_config(cfg_path), cfg_path)[0].detection.score_threshold == 0.7
    out = r.handle(DESIRED, ok)  # the broker's retained copy at the next connect: still refused (the floor)
    assert out["state"] == "refused" and "not newer than 5" in out["reasons"][0]


def test_invalid_documents_are_refused_with_key_paths_and_change_nothing(cfg_path: Path, signer2: SigningKey) -> None:
    r, seams = receiver(cfg_path)
    dev = {"device": "cam-01"}
    cases: dict[str, dict[str, Any]] = {
        "cameras.lobby.detection.nonsense: unknown key": {"cameras": {"lobby": {"detection": {"nonsense": 1}}}},
        "cameras.gate.detection.zones[0].points:": {"cameras": {"gate": {"detection": {"zones": [
            {"name": "z", "points": [[0, 0], [10, 10], [20, 20]]}]}}}},
        "cameras.lobby.uri: gst://": {"cameras": {"lobby": {"uri": "gst://videotestsrc ! appsink"}}},
        "cameras.gate.uri: file:///etc/hosts: a file outside the state dir": {"cameras": {"gate": {"uri": "file:///etc/hosts"}}},
        "mqtt: may not change remotely": {"mqtt": {"tls": {"ca_file": "/tmp/ca.pem"}}},
        "bogus: unknown key": {"bogus": {"x": 1}},
        "model: may not change remotely": {"model": {"keys_dir": "/tmp"}},
    }  # fmt: skip
    for version, (want, overlay) in enumerate(cases.items(), start=1):
        out = r.handle(DESIRED, signed_payload(signer2, dev, version, overlay))
        assert out["state"] == "refused", (want, out)
        assert any(reason.startswith(want) for reason in out["reasons"]), (want, out["reasons"])
    assert seams.applied == [] and seams.cfg.detection.score_threshold == 0.7


def test_a_device_not_ready_in_time_goes_back_to_the_last_good_config(cfg_path: Path, signer2: SigningKey) -> None:
    r, seams = receiver(cfg_path, ready_s=5)
    before = seams.cfg
    seams.ready_answer = "camera gate: down (connection refused)"
    out = r.handle(
        DESIRED,
        signed_payload(signer2, {"device": "cam-01"}, 3, {"cameras": {"gate": {"uri": "rtsp://127.0.0.1:9/x"}}}),
    )
    assert out["state"] == "reverted" and out["reasons"] == ["not ready: camera gate: down (connection refused)"], out
    assert [why for _, why in seams.applied] == [
        "config document device v3 applied",
        "config document device v3 reverted",
    ]
    assert seams.cfg is before and r.store.versions() == {}
