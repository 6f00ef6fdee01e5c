"""The daemon end to end: real mosquitto on 127.0.0.1, real ONNX Runtime, the real demo video."""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edged.models.demo import DemoAssets
from edged.protocol import RESULT_SCHEMA, schema

from .conftest import base_config, free_port, seq_gaps, wait_until, write_config
from .test_capture import mjpeg_server

SCHEMA = schema(RESULT_SCHEMA)  # the shipped file, protocol/schemas/result2.schema.json


def iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def score(results: list[dict[str, Any]], truth: dict[int, list[list[float]]]) -> tuple[float, float, int]:
    """Greedy one-to-one matching at IoU >= 0.5 per frame: (recall, precision, frames compared)."""
    tp = fp = fn = 0
    for r in results:
        gt = truth[r["frame"]]
        boxes = [d["box"] for d in r["detections"]]
        used: set[int] = set()
        for g in gt:
            best = max(((iou(g, b), k) for k, b in enumerate(boxes) if k not in used), default=(0.0, -1))
            if best[0] >= 0.5:
                tp += 1
                used.add(best[1])
            else:
                fn += 1
        fp += len(boxes) - len(used)
    return tp / max(1, tp + fn), tp / max(1, tp + fp), len(results)


def peak_rss(output: str) -> float:
    m = re.search(r"peak RSS (\d+) MB", output)
    assert m, output[-2000:]
    return float(m.group(1))


def test_demo_video_faces_reach_a_subscriber(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "realtime": False}]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    d = start_daemon(cfg)
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    results = sub.results()

    # every frame of the file, once, numbered without gaps, valid against the schema
    assert len(results) == 300
    for r in results:
        jsonschema.validate(r, SCHEMA)
    assert [r["seq"] for r in results] == list(range(1, 301))
    assert sorted(r["frame"] for r in results) == list(range(300))
    assert len({r["boot_id"] for r in results}) == 1
    assert all(r["model"] == {"name": "blazeface-back", "version": 1} for r in results)
    assert all(r["image"] == {"width": 960, "height": 540} for r in results)

    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    recall, precision, n = score(results, truth)
    print(
        f"\ndemo video: recall {recall:.3f} precision {precision:.3f} over {n} frames; "
        f"peak RSS {peak_rss(d.output())} MB"
    )
    assert recall >= 0.9 and precision >= 0.9

    states = [m.json()["state"] for m in sub.on("status")]
    assert states[0] == "online" and states[-1] == "stopped"
    tel = [m.json() for m in sub.on("telemetry")]
    assert tel, "telemetry published"
    last = tel[-1]
    assert last["schema"] == "edged.telemetry/1" and last["inference"]["rows"] == 300
    assert last["cameras"]["lobby"]["frames"] == 300 and last["cameras"]["lobby"]["drops"] == 0
    assert set(last["inference"]["infer_ms"]) == {"p50", "p95", "p99"}
    assert 0 < last["memory"]["peak_rss_mb"] < 4096


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(sig: int, broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "a", "uri": "synthetic://?fps=15"}, {"name": "b", "uri": "synthetic://?fps=10"}]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    d = start_daemon(cfg)
    wait_until(lambda: len(sub.results()) >= 20, 60, "results")
    assert d.stop(sig) == 0, d.output()[-2000:]
    wait_until(lambda: sub.on("status") and sub.on("status")[-1].json()["state"] == "stopped", 10, "stopped")
    seqs = [r["seq"] for r in sub.results()]
    assert seqs[0] == 1 and not seq_gaps(seqs), seq_gaps(seqs)
    assert {r["camera"] for r in sub.results()} == {"a", "b"}
    assert "stopped cleanly" in d.output()
    late = subscribe(broker, "edged/test-01/status")  # the retained status says so to a newcomer too
    wait_until(lambda: bool(late.messages), 5, "retained status")
    assert late.messages[0].retain and late.messages[0].json()["state"] == "stopped"


def test_cameras_that_die_reconnect_while_others_keep_serving(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    video = tmp_path / "door.mp4"
    shutil.copy(demo.video, video)
    port = free_port()
    server = mjpeg_server(port)
    sub = subscribe(broker, "edged/#")
    fast = {"reconnect_min_s": 0.3, "reconnect_max_s": 1.0, "stall_timeout_s": 2}
    cams: list[dict[str, Any]] = [
        {"name": "door", "uri": f"file://{video}", "loop": True, "fps_max": 30, **fast},
        {"name": "ip", "uri": f"http://127.0.0.1:{port}/video.mjpg", **fast},
        {"name": "pattern", "uri": "synthetic://?fps=10"},
    ]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    d = start_daemon(cfg)

    def count(cam: str) -> int:
        return len(sub.results(cam))

    def telemetry_camera(cam: str) -> dict[str, Any]:
        tel = sub.on("telemetry")
        return tel[-1].json()["cameras"][cam] if tel else {}

    try:
        wait_until(lambda: min(count("door"), count("ip"), count("pattern")) > 5, 60, "all cameras serving")
        video.unlink()
        server.kill()
        server.wait()
        wait_until(lambda: telemetry_camera("door").get("state") == "down", 40, "door down in telemetry")
        wait_until(lambda: telemetry_camera("ip").get("state") == "down", 20, "ip down in telemetry")
        n = count("pattern")
        wait_until(lambda: count("pattern") > n + 10, 10, "the synthetic camera keeps serving")
        shutil.copy(demo.video, video)
        server = mjpeg_server(port)
        n_door, n_ip = count("door"), count("ip")
        wait_until(lambda: count("door") > n_door + 5 and count("ip") > n_ip + 5, 30, "both cameras back")
        wait_until(lambda: telemetry_camera("door").get("reconnects", 0) >= 1, 10, "reconnect counted")
        # a telemetry message newer than the ip camera's reopen (the door's can be older: reopens are jittered)
        wait_until(lambda: telemetry_camera("ip").get("reconnects", 0) >= 1, 10, "the ip reconnect counted")
        assert d.stop() == 0
    finally:
        server.kill()
        server.wait()
    seqs = [r["seq"] for r in sub.results()]
    gaps = seq_gaps(seqs)
    mqtt_stats = sub.on("telemetry")[-1].json()["mqtt"]
    why = f"{gaps}; mqtt {mqtt_stats}\nbroker log:\n{broker.log_tail()}\n{d.output()[-3000:]}"
    assert seqs[0] == 1 and not gaps, why
    assert "camera door: down" in d.output() and "camera ip: down" in d.output()


def test_broker_away_at_start_is_not_fatal(start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    class Nowhere:
        host, port = "127.0.0.1", free_port()

    cams = [{"name": "a", "uri": "synthetic://?fps=10"}]
    cfg = write_config(tmp_path / "c.yaml", base_config(Nowhere(), demo, tmp_path, cams))
    d = start_daemon(cfg, "--duration", "4")
    assert d.proc.wait(60) == 0, d.output()[-2000:]
    assert "serving 1 camera(s)" in d.output()


def test_bad_config_exits_1_naming_the_key(start_daemon, tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "c.yaml",
        {"device_id": "x", "model": {"package": "p"}, "cameras": [{"name": "a", "uri": "synthetic://", "fps": 3}]},
    )
    d = start_daemon(cfg)
    assert d.proc.wait(30) == 1
    assert "c.yaml: cameras[0].fps: unknown key" in d.output()
    assert "Traceback" not in d.output()


def test_layout_model_runs_end_to_end_on_documents(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "scanner", "uri": f"file://{demo.documents}", "realtime": False}]
    doc = base_config(broker, demo, tmp_path, cams, detection={"score_threshold": 0.5, "iou_threshold": 0.5})
    doc["model"] = {"package": str(demo.packages["picodet-layout"].root), "onnxruntime": {"threads": 2}}
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(300) == 0, d.output()[-3000:]
    sub.wait_stopped()  # the last results were acknowledged before it, but may still be on their way here
    results = sub.results()
    truth = {f["frame"]: f["regions"] for f in json.loads(demo.documents_truth.read_text())["frames"]}
    assert sorted(r["frame"] for r in results) == sorted(truth)
    matched = total = 0
    for r in results:
        jsonschema.validate(r, SCHEMA)
        assert r["model"]["name"] == "picodet-layout"
        for region in truth[r["frame"]]:
            if region["label"] not in ("title", "text", "figure", "table"):
                continue
            total += 1
            same = [d["box"] for d in r["detections"] if d["label"] == region["label"]]
            matched += any(iou(region["box"], b) >= 0.5 for b in same)
    print(f"\nlayout: {matched}/{total} title/text/figure/table regions found at IoU >= 0.5")
    assert matched / total >= 0.9
