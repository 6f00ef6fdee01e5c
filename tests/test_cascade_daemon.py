"""A cascade through `edged run` and a real broker: the PicoDet layout model finds the documents video's regions,
PP-OCRv4's recogniser (the demo's `ppocr-rec` stage package) reads each title. Every published text equals the
recogniser run directly with onnxruntime on the crop cut here from the published box and the video frame
decoded here; the results are edged.result/3 and validate against the shipped schema."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import cv2
import jsonschema
import numpy as np
import onnxruntime as ort
import pytest

from edged.daemon.cascade.crops import crop_rect, cut
from edged.models.demo import DemoAssets
from edged.protocol.schemas import RESULT_SCHEMA_V3, schema
from tests.conftest import base_config, free_port, wait_until, write_config
from tests.test_cascade import reference_ctc, reference_rows


@pytest.mark.slow  # the layout model on 800x608 pages: minutes on a CPU; tests/test_cascade.py is the short variant
def test_cascade_reads_titles_through_edged_run(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path):
    rec = demo.packages["ppocr-rec"]
    sub = subscribe(broker, "edged/#")
    cams = [
        {
            "name": "scanner",
            "uri": f"file://{demo.documents}",
            "realtime": False,
            "backend": "opencv",  # decoded by OpenCV's FFmpeg, as here: the same pixels on both sides
            "detection": {"tracking": {"enabled": False}},
        }
    ]
    doc = base_config(broker, demo, tmp_path, cams, detection={"score_threshold": 0.5, "iou_threshold": 0.5})
    doc["model"] = {"package": str(demo.packages["picodet-layout"].root), "onnxruntime": {"threads": 2}}
    doc["stages"] = [
        {
            "name": "ocr",
            "model": {"package": str(rec.root), "onnxruntime": {"threads": 2}},
            "on_labels": ["title"],
            "pad": 0.1,
        }
    ]
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(300) == 0, d.output()[-3000:]
    sub.wait_stopped()  # the last results were acknowledged before it, but may still be on their way here
    results = sub.results()
    truth = {f["frame"]: f["regions"] for f in json.loads(demo.documents_truth.read_text())["frames"]}
    assert set(r["frame"] for r in results) <= set(truth) and len(results) >= len(truth) - 2, results
    cap = cv2.VideoCapture(str(demo.documents))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    crops, read = [], []
    for r in results:
        jsonschema.validate(r, schema(RESULT_SCHEMA_V3))
        assert r["schema"] == RESULT_SCHEMA_V3
        assert r["stage_versions"] == {"ocr": f"ppocr-rec@{rec.manifest.version}"}
        h, w = frames[r["frame"]].shape[:2]
        for det in r["detections"]:
            if det["label"] != "title":
                assert "stages" not in det
                continue
            # the crop as the stage cut it: from the published box (rounded to 0.1 px) and the frame decoded here
            rect = crop_rect(tuple(det["box"]), 0.1, w, h)
            assert rect is not None
            crops.append(cut(frames[r["frame"]], rect))
            read.append((r["frame"], det["stages"]["ocr"]))
    assert len(crops) >= 0.7 * len(results), "a title found in most frames"
    sess = ort.InferenceSession(str(rec.model_path.parent / "model.b1.onnx"), providers=["CPUExecutionProvider"])
    charset = rec.labels
    same = 0
    for crop, (_, got) in zip(crops, read, strict=True):
        (probs,) = sess.run(None, {"x": reference_rows([crop], rec.manifest.input.model_dump())})
        (text, score) = reference_ctc(probs, charset)[0]
        ok = got["text"] == text and abs(got["score"] - score) < 2e-3
        same += ok
        if not ok:
            print(f"differs: published {got}, direct {text!r} {score:.4f}")
    assert same == len(crops), f"{same}/{len(crops)} stage outputs equal the recogniser run directly"
    # against the ground truth: characters right (1 - the character error rate)
    errors = chars = 0
    for frame, got in read:
        want = next(x["text"] for x in truth[frame] if x["label"] == "title")
        errors += _edits(got["text"].strip(), want)
        chars += len(want)
    accuracy = 1 - errors / chars
    print(f"\ncascade: {len(crops)} titles read; character accuracy {accuracy:.3f} over {chars} characters")
    assert accuracy >= 0.8
    assert np.isfinite(accuracy)


def _edits(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def test_detector_stage_with_tracks_through_edged_run(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """The short variant: BlazeFace finds the demo video's faces, the front-camera BlazeFace runs as a detector
    stage on each face's crop. Results are edged.result/3; sub-boxes lie in their crop, in the frame's pixels;
    with tracks the stage reads a face again only every reinfer_frames frames, and telemetry counts the rest."""
    sub = subscribe(broker, "edged/#")
    cams = [
        {
            "name": "lobby",
            "uri": f"file://{demo.video}",
            "realtime": False,
            "detection": {"tracking": {"min_hits": 2, "max_age": 5}, "publish": "both"},
        }
    ]
    doc = base_config(broker, demo, tmp_path, cams)
    front = demo.packages["blazeface-front"]
    doc["stages"] = [
        {
            "name": "face",
            "model": {"package": str(front.root), "onnxruntime": {"threads": 1}},
            "on_labels": ["face"],
            "pad": 0.3,
            "reinfer_frames": 3,
            "score_threshold": 0.5,
        }
    ]
    port = free_port()
    doc["health"] = {"enabled": True, "port": port}
    d = start_daemon(write_config(tmp_path / "c.yaml", doc), "--duration", "8")
    seen: list[str] = []

    def scraped() -> bool:  # /metrics while it serves: the stage's counters, labelled by stage
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return False
        seen[:] = [line for line in text.splitlines() if line.startswith("edged_stage_")]
        return any(
            line.startswith('edged_stage_crops_total{stage="face"}') and not line.endswith(" 0.0") for line in seen
        )

    wait_until(scraped, 120, "the stage's counters on /metrics")
    assert any(line.startswith('edged_stage_skipped_reinfer_total{stage="face"}') for line in seen), seen
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    sub.wait_stopped()  # the last results and telemetry were sent before it, but may still be on their way here
    results = sub.results()
    assert results, d.output()[-2000:]
    read = voted = 0
    for r in results:
        jsonschema.validate(r, schema(RESULT_SCHEMA_V3))
        assert r["stage_versions"] == {"face": f"{front.manifest.name}@{front.manifest.version}"}
        for det in r["detections"]:
            out = det.get("stages", {}).get("face")
            if out is None:
                continue
            if not out["inferred"]:
                voted += 1
                assert "track_id" in det and out["votes"] >= 1 and "boxes" not in out
                continue
            read += 1
            rect = crop_rect(tuple(det["box"]), 0.3, r["image"]["width"], r["image"]["height"])
            assert rect is not None
            for sub_box in out["boxes"]:
                x1, y1, x2, y2 = sub_box["box"]
                inside = rect[0] - 1 <= x1 <= x2 <= rect[2] + 1 and rect[1] - 1 <= y1 <= y2 <= rect[3] + 1
                assert inside, (rect, sub_box)
    tracked = sum("track_id" in det for r in results for det in r["detections"])
    # object events leave with their result's stage outputs: the same dict as the track's detection in that frame
    # (`object_appeared` is sent at the frame that confirmed the track, its `last_frame`); an ended track has no
    # detection in the frame that ends it, so its event carries none
    by_frame = {(r["camera"], r["frame"]): r for r in results}
    events = [m.json() for m in sub.on("events") if m.json()["type"].startswith("object_")]
    carried = 0
    for ev in events:
        if ev["type"] == "object_ended":
            assert "stages" not in ev, ev
            continue
        if ev["type"] != "object_appeared":
            continue
        r = by_frame[(ev["camera"], ev["last_frame"])]
        det = next(x for x in r["detections"] if x.get("track_id") == ev["track_id"])
        assert ev.get("stages") == det.get("stages"), (ev, det)
        if "stages" in det:
            assert ev["stage_versions"] == r["stage_versions"], ev
            carried += 1
    assert carried >= 1, f"{len(events)} object events, none of a detection with stage outputs"
    assert read >= 1 and voted >= 1, (read, voted, len(results), tracked)
    telemetry = [m.json() for m in sub.on("telemetry")]
    stages = telemetry[-1]["stages"]["face"]
    assert stages["crops"] >= read and stages["skipped_reinfer"] >= voted > 0, stages
    print(f"\nface stage: {stages['crops']} crops read, {stages['skipped_reinfer']} tracked crops left to the vote")
