"""A fleet of real daemons in one group, and the `edged push` around them: what the rollout tests
(tests/test_rollout.py) and the shadow rollout tests (tests/test_shadow_rollout.py) share. Real mosquitto,
real daemons on the demo model, the real `edged push` CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import cv2
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import Broker, DaemonProc, Subscriber, cpu_seconds, free_port, wait_progress, write_config
from tests.test_ota import MODEL, build, device_doc, install_all

# The pusher's own bounds: a device's outcome within PUSH_TIMEOUT_S of its offer, an offline device followed for
# WAIT_OFFLINE_S. A pusher always ends by itself within them, so a test waits for it longer than they add up to.
PUSH_TIMEOUT_S = 180
WAIT_OFFLINE_S = 150

# A fleet's daemons serve slowly: what a rollout needs of them is a probation's batches (10 at 2 frames/s is 5 s).
# One daemon on the demo video (15 frames/s) cost 0.14 CPU-s/s at fps_max 1, 0.16 at 2 and 0.28 at 4 (measured
# 2026-12-02, the machine shared with other work): a realtime file camera decodes every frame of its file whatever
# its fps_max. So a fleet's cameras read the demo video re-encoded at FPS_MAX (every 7th or 8th frame, the same
# faces): 20 daemons at 4 frames/s of the 15 frames/s file asked for 5.6 of the machine's 2 cores.
FPS_MAX = 2


def fleet_video(demo: DemoAssets, tmp: Path) -> Path:
    """The demo video at FPS_MAX frames/s (made once per test folder)."""
    out = tmp / f"demo-{FPS_MAX}fps.mp4"
    if out.exists():
        return out
    cap = cv2.VideoCapture(str(demo.video))
    step = max(1, round(cap.get(cv2.CAP_PROP_FPS) / FPS_MAX))
    size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    part = out.with_suffix(".part.mp4")
    writer = cv2.VideoWriter(str(part), cv2.VideoWriter.fourcc(*"mp4v"), FPS_MAX, size)
    index = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if index % step == 0:
            writer.write(frame)
        index += 1
    cap.release()
    writer.release()
    assert index > step, f"{demo.video}: {index} frames read"
    part.rename(out)
    return out


def fleet(
    broker: Broker,
    demo: DemoAssets,
    tmp: Path,
    signer: SigningKey,
    names: list[str],
    version: int = 1,
    empty: frozenset[str] = frozenset(),
    wrong_mean: frozenset[str] = frozenset(),
) -> dict[str, Path]:
    """Device configs in group dock, `version` installed, short probation, a slow frame rate. Each device's
    camera is the demo video (faces), or for the devices named in `empty` a synthetic test pattern (no face,
    so no shadow evidence). The devices named in `wrong_mean` serve `version` built with a wrong `mean` in its
    manifest (`wrong_mean_build`: false faces, the real ones missed), so a correct candidate disagrees with
    what they serve."""
    cfgs = {}
    v1 = build(demo, tmp, signer, version)
    v1_wrong = wrong_mean_build(demo, tmp, signer, version) if wrong_mean else None
    video = fleet_video(demo, tmp)
    for dev in names:
        doc = device_doc(broker, demo, tmp, dev, probation_s=3, probation_batches=10, probation_latency_ratio=3)
        doc["groups"] = ["dock"]
        cam = doc["cameras"][0]
        cam["fps_max"] = FPS_MAX
        cam["uri"] = f"file://{video}"
        if dev in empty:
            cam.pop("loop", None)
            cam["uri"] = "synthetic://?width=640&height=360"
        cfgs[dev] = write_config(tmp / f"{dev}.yaml", doc)
    install_all([cfg for dev, cfg in cfgs.items() if dev not in wrong_mean], v1)
    if v1_wrong is not None:
        install_all([cfgs[dev] for dev in wrong_mean], v1_wrong)
    return cfgs


WRONG_MEAN = [255.0, 255.0, 255.0]  # what a manifest with a preprocessing mistake says (the model wants 127.5)


def wrong_mean_build(demo: DemoAssets, tmp: Path, signer: SigningKey, version: int) -> Path:
    """The demo model as `version`, its manifest's `mean` WRONG_MEAN: on the demo video it sees several times
    the faces the correct one sees, nearly none of them the same (tests/test_shadow_runner.py measures it)."""
    spec = demo.packages[MODEL].manifest.input.model_dump(by_alias=True, exclude_none=True)
    return build(demo, tmp, signer, version, input={**spec, "mean": WRONG_MEAN})


def push_cmd(broker: Broker, *args: str) -> list[str]:
    host = ["--host", broker.host, "--port", str(broker.port), "--timeout", str(PUSH_TIMEOUT_S)]
    return [sys.executable, "-m", "edged", "push", *args, *host]


def current(tmp: Path, dev: str) -> int:
    """The version a device of `fleet(..., tmp, ...)` serves now."""
    return int(os.readlink(tmp / dev / "models" / MODEL / "current").rsplit("/", 1)[-1])


def offers(sub: Subscriber) -> dict[str, int]:
    """Directed offers (cmd/ota) each device was sent."""
    counts: dict[str, int] = {}
    for m in sub.on("cmd/ota"):
        dev = m.topic.split("/")[1]
        counts[dev] = counts.get(dev, 0) + 1
    return counts


def retained_offline(broker: Broker, dev: str, groups: list[str]) -> None:
    """What the broker keeps for a device of `groups` that died (its last will): discovery sees it offline."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"will-{free_port()}", protocol=mqtt.MQTTv5)
    c.connect(broker.host, broker.port)
    c.loop_start()
    doc = {"state": "offline", "groups": groups}
    c.publish(f"edged/{dev}/status", json.dumps(doc).encode(), qos=1, retain=True).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()


def wait_fleet_serving(daemons: list[DaemonProc]) -> None:
    """Daemons started at once all serve. Their start costs the machine their number times one daemon's
    start (20 of them on 2 busy cores: minutes, most of it importing before a first log line), so the wait
    lasts while those still starting work (their CPU time grows) and fails when none has for 60 s, or when
    one exits."""

    def starting() -> list[DaemonProc]:
        return [d for d in daemons if "serving 1 camera(s)" not in d.output()]

    def all_serving() -> bool:
        for d in daemons:
            if d.proc.poll() is not None:
                raise AssertionError(f"a daemon exited with {d.proc.returncode}:\n{d.output()[-3000:]}")
        return not starting()

    def progress() -> tuple[int, float]:
        left = starting()
        return len(left), sum(cpu_seconds(d.proc.pid) for d in left)

    wait_progress(all_serving, progress, 60, f"{len(daemons)} daemons to serve", step=0.25)
