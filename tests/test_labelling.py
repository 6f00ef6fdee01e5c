"""The frames worth labelling (daemon/record/labelling.py) on real frames of the demo video with its ground-truth
boxes: the most disagreeing frames are the ones kept, the COCO file validates against the COCO fields and its
boxes are the detections' own, every JPEG opens at the size recorded and shows its frame, the count and byte
bounds hold over a long run, a restart keeps what was kept, and `labelling.upload` puts the JPEGs and the
COCO file on a real nginx (WebDAV PUT), across a stop and start of nginx."""

from __future__ import annotations

import functools
import json
import random
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest

from edged.daemon.config import LabellingConfig, UploadConfig
from edged.daemon.decoders.base import Detection
from edged.daemon.delivery.upload import Uploader
from edged.daemon.record.labelling import LabelFrames, Offer, near_threshold
from edged.models.demo import DemoAssets
from tests.conftest import wait_until
from tests.nginx_dav import DavServer

# the COCO object-detection format's fields (cocodataset.org/#format-data), as labelling tools read them
_NUM = {"type": "number"}
_ID = {"type": "integer", "minimum": 1}
COCO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["info", "images", "annotations", "categories"],
    "properties": {
        "info": {"type": "object"},
        "licenses": {"type": "array"},
        "images": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "file_name", "width", "height"],
                "properties": {
                    "id": _ID,
                    "file_name": {"type": "string", "pattern": r"^[^/]+\.jpg$"},
                    "width": {"type": "integer", "minimum": 1},
                    "height": {"type": "integer", "minimum": 1},
                    "date_captured": {"type": "string"},
                },
            },
        },
        "annotations": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "image_id", "category_id", "bbox", "area", "iscrowd"],
                "properties": {
                    "id": _ID,
                    "image_id": _ID,
                    "category_id": _ID,
                    "bbox": {"type": "array", "items": {**_NUM, "minimum": 0}, "minItems": 4, "maxItems": 4},
                    "area": {**_NUM, "minimum": 0},
                    "iscrowd": {"enum": [0, 1]},
                    "score": {**_NUM, "minimum": 0, "maximum": 1},
                    "attributes": {
                        "type": "object",
                        "required": ["model", "ref"],
                        "properties": {"model": {"enum": ["serving", "candidate"]}, "ref": {"type": "string"}},
                    },
                },
            },
        },
        "categories": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "name"],
                "properties": {"id": _ID, "name": {"type": "string", "minLength": 1}},
            },
        },
    },
}


def check_coco(doc: dict[str, Any]) -> None:
    """The schema, and what a schema cannot say: unique ids, and every reference resolves."""
    jsonschema.validate(doc, COCO_SCHEMA)
    image_ids = [i["id"] for i in doc["images"]]
    ann_ids = [a["id"] for a in doc["annotations"]]
    cat_ids = [c["id"] for c in doc["categories"]]
    assert len(set(image_ids)) == len(image_ids) and len(set(ann_ids)) == len(ann_ids)
    assert len(set(cat_ids)) == len(cat_ids)
    assert {a["image_id"] for a in doc["annotations"]} <= set(image_ids)
    assert {a["category_id"] for a in doc["annotations"]} <= set(cat_ids)


# A kept JPEG is compared with the video's frames by their edges (the Sobel gradients of a 240x135 grey copy):
# the daemon decodes with GStreamer, this test with OpenCV's FFmpeg, whose colour conversions differ by a
# near-constant 1.6 grey levels, more than neighbouring frames of a slow scene differ; edges move with the
# scene and not with that offset (measured on the demo video: the frame named 2.1-2.7 from its JPEG, the
# nearest other frame 3.3 in its slowest part, 19-48 where people walk).
_SMALL = (240, 135)


def _edges(img: np.ndarray) -> np.ndarray:
    grey = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY) if img.ndim == 3 else img
    small = cv2.resize(grey, _SMALL, interpolation=cv2.INTER_AREA).astype(np.float32)
    return np.abs(cv2.Sobel(small, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(small, cv2.CV_32F, 0, 1))


@functools.cache
def _video_edges(path: str) -> tuple[np.ndarray, ...]:
    cap = cv2.VideoCapture(path)
    out = []
    while True:
        ok, img = cap.read()
        if not ok:
            break
        out.append(_edges(img))
    cap.release()
    return tuple(out)


def check_the_videos_frame(jpg: bytes, image: dict[str, Any], video: Path) -> tuple[float, float]:
    """The kept JPEG is the frame of `video` its COCO entry names (``edged.frame``: the index in the file):
    nearer to it than to any other frame within 10 of it, and near in absolute terms (JPEG noise). Returns
    (its distance, the nearest other's)."""
    frames = _video_edges(str(video))
    i = image["edged"]["frame"]
    assert isinstance(i, int) and 0 <= i < len(frames), image["edged"]
    img = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_GRAYSCALE)
    assert img is not None, f"{image['file_name']} does not decode"
    edges = _edges(img)
    dist = {j: float(np.abs(edges - frames[j]).mean()) for j in range(max(0, i - 10), min(len(frames), i + 11))}
    other = min(d for j, d in dist.items() if j != i)
    assert dist[i] < 5.0 and dist[i] < other, f"the JPEG of frame {i}: {dist[i]:.2f} from it, {dist} around it"
    # date_captured is when the camera read it (edged.captured_at), not when the store wrote it
    captured = datetime.fromisoformat(image["date_captured"]).timestamp()
    assert captured == pytest.approx(image["edged"]["captured_at"], abs=2e-3)
    return dist[i], other


Frame = tuple[np.ndarray, list[Detection], list[Detection]]


@pytest.fixture(scope="module")
def frames(demo: DemoAssets) -> list[Frame]:
    """Frames of the demo video with faces: (frame, its ground truth as the serving model's detections, the
    same boxes shifted by 12 px plus a false box as a worse candidate's)."""
    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    cap = cv2.VideoCapture(str(demo.video))
    out: list[Frame] = []
    i = 0
    while len(out) < 24:
        ok, img = cap.read()
        assert ok, "the demo video ended early"
        if truth.get(i) and i % 3 == 0:
            serving = [Detection("face", 0, 0.9, (b[0], b[1], b[2], b[3])) for b in truth[i]]
            candidate = [Detection("face", 0, 0.6, (b[0] + 12, b[1] + 12, b[2] + 12, b[3] + 12)) for b in truth[i]] + [
                Detection("person", 1, 0.55, (10.0, 20.0, 110.0, 240.0))
            ]
            out.append((img, serving, candidate))
        i += 1
    cap.release()
    return out


def offer(store: LabelFrames, f: Frame, disagreement: float, camera: str = "door") -> str | None:
    img, serving, candidate = f
    return store.offer(camera, img, serving, candidate, disagreement, "shadow", "faces@3", "faces@4")


def test_the_most_disagreeing_frames_are_kept_as_jpegs_with_a_valid_coco_file(
    tmp_path: Path, frames: list[Frame]
) -> None:
    store = LabelFrames(LabellingConfig(enabled=True, max_frames=8), tmp_path, labels=["face"])
    rnd = random.Random(7)
    offered: dict[float, Frame] = {}
    for f in frames:
        d = round(rnd.random(), 6)
        offered[d] = f
        offer(store, f, d)
    top = sorted(offered, reverse=True)[:8]
    assert [i["disagreement"] for i in store.index()] == top

    doc = json.loads((tmp_path / "labelling/coco.json").read_text())
    check_coco(doc)
    assert json.loads(store.coco_bytes())["images"] == doc["images"]
    cats = {c["name"]: c["id"] for c in doc["categories"]}
    assert cats["face"] == 1 and "person" in cats
    assert len(doc["images"]) == 8
    for image in doc["images"]:
        src, serving, candidate = offered[image["edged"]["disagreement"]]
        jpg = cv2.imread(str(tmp_path / "labelling/images" / image["file_name"]))
        assert jpg is not None and jpg.shape[:2] == (image["height"], image["width"]) == src.shape[:2]
        assert float(np.abs(jpg.astype(np.int16) - src.astype(np.int16)).mean()) < 4.0  # its frame, JPEG q90
        anns = [a for a in doc["annotations"] if a["image_id"] == image["id"]]
        assert len(anns) == len(serving) + len(candidate)
        for a, det in zip(anns, serving + candidate, strict=True):
            x1, y1, x2, y2 = det.box
            assert a["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1], abs=0.01)
            assert a["area"] == pytest.approx((x2 - x1) * (y2 - y1), abs=0.1)
            assert a["category_id"] == cats[det.label] and a["score"] == pytest.approx(det.score, abs=1e-4)
        assert [a["attributes"]["model"] for a in anns] == ["serving"] * len(serving) + ["candidate"] * len(candidate)
        assert {a["attributes"]["ref"] for a in anns} == {"faces@3", "faces@4"}
    assert sorted(p.name for p in (tmp_path / "labelling/images").iterdir()) == sorted(
        i["file_name"] for i in doc["images"]
    )
    # a full store does not even encode a frame that disagrees less than all it keeps
    s = store.stats()
    assert offer(store, frames[0], top[-1] / 2) is None
    assert store.stats()["not_kept"] == s["not_kept"] + 1 and store.stats()["frames"] == 8


def test_the_byte_bound_holds_under_a_long_run(tmp_path: Path, frames: list[Frame]) -> None:
    cfg = LabellingConfig(enabled=True, max_frames=1000, max_mb=0.5)
    store = LabelFrames(cfg, tmp_path, labels=["face"])
    rnd = random.Random(3)
    cap = int(0.5 * 1024 * 1024)
    images = tmp_path / "labelling/images"
    for n in range(300):
        offer(store, frames[n % len(frames)], rnd.random(), camera=f"cam{n % 3}")
        if n % 25 == 0:
            on_disk = sum(p.stat().st_size for p in images.iterdir())
            assert on_disk <= cap
    s = store.stats()
    on_disk = sum(p.stat().st_size for p in images.iterdir())
    assert s["bytes"] == on_disk <= cap
    assert s["evicted"] > 0 and s["not_kept"] > 200 and s["frames"] == len(list(images.iterdir()))
    assert s["kept"] + s["not_kept"] == s["offered"] == 300
    doc = json.loads((tmp_path / "labelling/coco.json").read_text())
    check_coco(doc)
    assert len(doc["images"]) == s["frames"]


def test_a_restart_keeps_the_frames_and_drops_strays(tmp_path: Path, frames: list[Frame]) -> None:
    cfg = LabellingConfig(enabled=True, max_frames=5)
    first = LabelFrames(cfg, tmp_path, labels=["face"])
    for i, f in enumerate(frames[:6]):
        offer(first, f, 0.1 * (i + 1))
    before = json.loads((tmp_path / "labelling/coco.json").read_text())
    (tmp_path / "labelling/images/999999-door.jpg").write_bytes(b"a frame whose index write never came")
    again = LabelFrames(cfg, tmp_path, labels=["face"])
    after = json.loads(again.coco_bytes())
    assert after["images"] == before["images"] and after["annotations"] == before["annotations"]
    assert after["categories"] == before["categories"]
    assert not (tmp_path / "labelling/images/999999-door.jpg").exists()
    assert again.stats()["bytes"] == first.stats()["bytes"]
    key = offer(again, frames[7], 0.95)  # numbering goes on; the least disagreeing (0.2) goes
    assert key is not None and int(key.split("-")[0]) == 7
    assert sorted(i["disagreement"] for i in again.index()) == pytest.approx([0.3, 0.4, 0.5, 0.6, 0.95])
    assert again.jpeg_path("../coco") is None and again.jpeg_path(key) is not None


def test_near_threshold_and_the_store_thread(tmp_path: Path, frames: list[Frame]) -> None:
    dets = [Detection("face", 0, s, (0.0, 0.0, 10.0, 10.0)) for s in (0.72, 0.9)]
    assert near_threshold(dets, 0.7, 0.1) == pytest.approx(0.8)
    assert near_threshold(dets, 0.7, 0.0) is None
    assert near_threshold(dets[1:], 0.7, 0.1) is None
    store = LabelFrames(LabellingConfig(enabled=True), tmp_path)
    store.start()
    try:
        img, serving, _ = frames[0]
        assert store.submit(Offer("door", img, serving, None, 0.8, "near_threshold", "faces@3", None))
        wait_until(lambda: store.stats()["frames"] == 1, 30, "the store's thread to keep the frame")
    finally:
        store.stop()
    doc = json.loads(store.coco_bytes())
    check_coco(doc)
    assert doc["images"][0]["edged"]["reason"] == "near_threshold"
    assert {a["attributes"]["model"] for a in doc["annotations"]} == {"serving"}


def test_labelling_uploads_its_jpegs_and_coco_file_across_an_nginx_restart(
    tmp_path: Path, frames: list[Frame], dav: DavServer
) -> None:
    ucfg = UploadConfig(url=dav.url + "/dav/site1", retry_min_s=0.05, retry_max_s=0.5, timeout_s=5)
    uploader = Uploader(ucfg, tmp_path / "state", threading.Event())
    uploader.start()
    try:
        store = LabelFrames(
            LabellingConfig(enabled=True, upload=True), tmp_path / "state", labels=["face"], uploader=uploader
        )
        dav.stop()
        keys = [offer(store, f, 0.5 + i / 100) for i, f in enumerate(frames[:4])]
        wait_until(lambda: uploader.stats()["failed_attempts"] >= 2, 30, "tries refused while nginx is down")
        dav.start()
        wait_until(lambda: uploader.stats()["queued"] == 0, 60, "the uploads to drain")
    finally:
        uploader.stop()
    remote = dav.root / "dav/site1/labelling"
    local = tmp_path / "state/labelling"
    for key in keys:
        assert key is not None
        assert (remote / f"images/{key}.jpg").read_bytes() == (local / f"images/{key}.jpg").read_bytes()
    assert (remote / "coco.json").read_bytes() == (local / "coco.json").read_bytes()
    check_coco(json.loads((remote / "coco.json").read_text()))
    assert uploader.stats()["failed"] == 0 and uploader.stats()["dropped"] == 0


def test_observe_samples_near_threshold_frames_per_camera(tmp_path: Path, frames: list[Frame]) -> None:
    cfg = LabellingConfig(enabled=True, near_threshold=0.1, sample_s=5.0)
    store = LabelFrames(cfg, tmp_path, labels=["face"], thresholds={"door": 0.7, "yard": 0.85})
    img, _, _ = frames[0]
    near = [Detection("face", 0, 0.75, (10.0, 10.0, 60.0, 60.0))]
    far = [Detection("face", 0, 0.95, (10.0, 10.0, 60.0, 60.0))]
    asked: list[str] = []

    def frame(camera: str) -> Any:
        def fetch() -> np.ndarray:
            asked.append(camera)
            return img

        return fetch

    assert not store.observe("door", far, "faces@3", frame("door"), 0.0)  # 0.95: not near 0.7
    assert store.observe("door", near, "faces@3", frame("door"), 0.0)
    assert not store.observe("door", near, "faces@3", frame("door"), 4.9)  # within sample_s
    assert not store.observe("yard", near, "faces@3", frame("yard"), 1.0)  # 0.75 is under yard's 0.85
    assert asked == ["door"]  # the frame is fetched only for what is handed over
    store.start()
    try:
        wait_until(lambda: store.stats()["frames"] == 1, 30, "the sampled frame kept")
        assert store.observe("door", near, "faces@3", frame("door"), 5.0)
        wait_until(lambda: store.stats()["frames"] == 2, 30, "the next sample kept")
    finally:
        store.stop()
    nearness = sorted(i["disagreement"] for i in store.index())
    assert nearness == pytest.approx([0.5, 0.5])  # 0.75 in [0.7, 0.8): half way


@pytest.mark.slow
def test_the_byte_and_count_bounds_hold_over_a_long_run(tmp_path: Path, frames: list[Frame]) -> None:
    cfg = LabellingConfig(enabled=True, max_frames=40, max_mb=1.0)
    store = LabelFrames(cfg, tmp_path, labels=["face"])
    rnd = random.Random(11)
    images = tmp_path / "labelling/images"
    for n in range(3000):
        offer(store, frames[n % len(frames)], rnd.random(), camera=f"cam{n % 4}")
        if n % 100 == 0:
            on_disk = [p.stat().st_size for p in images.iterdir()]
            assert sum(on_disk) <= 1024 * 1024 and len(on_disk) <= 40
    s = store.stats()
    assert s["bytes"] == sum(p.stat().st_size for p in images.iterdir()) <= 1024 * 1024
    check_coco(json.loads((tmp_path / "labelling/coco.json").read_text()))


def test_a_tampered_coco_file_never_reaches_outside_its_folder(tmp_path: Path, frames: list[Frame]) -> None:
    first = LabelFrames(LabellingConfig(enabled=True), tmp_path, labels=["face"])
    for i, f in enumerate(frames[:2]):
        offer(first, f, 0.1 * (i + 1))
    coco = tmp_path / "labelling/coco.json"
    doc = json.loads(coco.read_text())
    doc["images"][0]["file_name"] = "../../victim.jpg"
    coco.write_text(json.dumps(doc))
    victim = tmp_path / "victim.jpg"
    victim.write_bytes(b"not the store's")
    again = LabelFrames(LabellingConfig(enabled=True, max_frames=1), tmp_path, labels=["face"])
    assert victim.read_bytes() == b"not the store's"
    assert [i["key"] for i in again.index()] == [doc["images"][1]["edged"]["key"]]
    check_coco(json.loads(coco.read_text()))


def test_an_evicted_frame_leaves_the_upload_queue(tmp_path: Path, frames: list[Frame]) -> None:
    ucfg = UploadConfig(url="http://127.0.0.1:9/dav")  # never started: everything waits
    uploader = Uploader(ucfg, tmp_path / "state", threading.Event())
    cfg = LabellingConfig(enabled=True, upload=True, max_frames=2)
    store = LabelFrames(cfg, tmp_path / "state", labels=["face"], uploader=uploader)
    keys = [offer(store, f, 0.1 * (i + 1)) for i, f in enumerate(frames[:5])]
    queue = json.loads((tmp_path / "state/uploads/queue.json").read_text())["queue"]
    assert sorted(e["remote"] for e in queue) == sorted(
        [f"labelling/images/{keys[3]}.jpg", f"labelling/images/{keys[4]}.jpg", "labelling/coco.json"]
    )
    assert uploader.stats()["dropped"] == 3  # the three evicted JPEGs, forgotten


def test_frames_the_start_removes_leave_the_upload_queue(tmp_path: Path, frames: list[Frame]) -> None:
    ucfg = UploadConfig(url="http://127.0.0.1:9/dav")  # never started: everything waits
    state = tmp_path / "state"
    store = LabelFrames(LabellingConfig(enabled=True, upload=True, max_frames=3), state, ["face"],
                        Uploader(ucfg, state, threading.Event()))  # fmt: skip
    keys = [offer(store, f, 0.1 * (i + 1)) for i, f in enumerate(frames[:3])]

    def queued() -> list[str]:
        return sorted(e["remote"] for e in json.loads((state / "uploads/queue.json").read_text())["queue"])

    assert queued() == sorted([f"labelling/images/{k}.jpg" for k in keys] + ["labelling/coco.json"])
    # a restart with a smaller bound: the two least disagreeing frames go, and their PUTs with them
    uploader = Uploader(ucfg, state, threading.Event())
    again = LabelFrames(LabellingConfig(enabled=True, upload=True, max_frames=1), state, ["face"], uploader)
    assert [i["key"] for i in again.index()] == [keys[2]]
    assert queued() == ["labelling/coco.json", f"labelling/images/{keys[2]}.jpg"]
    assert uploader.stats()["dropped"] == 2
    # a coco.json lost: every JPEG is one it does not name, removed, and out of the queue
    (state / "labelling/coco.json").write_text("{not json")
    uploader = Uploader(ucfg, state, threading.Event())
    LabelFrames(LabellingConfig(enabled=True, upload=True), state, ["face"], uploader)
    assert list((state / "labelling/images").iterdir()) == []
    assert queued() == ["labelling/coco.json"]


def test_the_decode_thread_never_waits_on_the_stores_disk_writes(
    tmp_path: Path, frames: list[Frame], monkeypatch: pytest.MonkeyPatch
) -> None:
    import edged.daemon.record.labelling as labelling_mod
    from edged.models.store.files import write_atomic as real

    entered, gate = threading.Event(), threading.Event()

    def held(path: Path, data: bytes) -> None:  # a disk that takes its time (a slow SD card)
        entered.set()
        gate.wait(60)
        real(path, data)

    monkeypatch.setattr(labelling_mod, "write_atomic", held)
    cfg = LabellingConfig(enabled=True, near_threshold=0.2, sample_s=0.1)
    store = LabelFrames(cfg, tmp_path, ["face"], thresholds={"door": 0.5})
    writer = threading.Thread(target=offer, args=(store, frames[0], 0.5))
    writer.start()
    try:
        assert entered.wait(30), "the offer to reach its write"
        img, serving, _ = frames[1]
        near = [Detection("face", 0, 0.55, serving[0].box)]
        store.submit(Offer("door", img, near, None, 0.1, "near_threshold", "faces@3", None))
        store.submit(Offer("door", img, near, None, 0.1, "near_threshold", "faces@3", None))  # the inbox is full
        results: list[Any] = []
        decode = threading.Thread(
            target=lambda: results.extend([store.observe("door", near, "faces@3", lambda: img, 1.0), store.stats()])
        )
        decode.start()
        decode.join(5.0)  # before the fix: blocked until the disk write ended (never, here, until the gate opens)
        assert not decode.is_alive() and results[0] is False and results[1]["busy"] == 1
        assert store.index() == [] and store.jpeg_path("000001-door") is None  # not listed before it is written
    finally:
        gate.set()
        writer.join(30)
    assert [i["key"] for i in store.index()] == ["000001-door"]
    assert store.jpeg_path("000001-door") is not None and (tmp_path / "labelling/images/000001-door.jpg").is_file()


def test_category_ids_stay_the_same_under_a_model_with_another_label_order(tmp_path: Path, frames: list[Frame]) -> None:
    first = LabelFrames(LabellingConfig(enabled=True), tmp_path, labels=["person", "face"])
    offer(first, frames[0], 0.5)
    before = json.loads((tmp_path / "labelling/coco.json").read_text())
    assert {c["name"]: c["id"] for c in before["categories"]} == {"person": 1, "face": 2}
    again = LabelFrames(LabellingConfig(enabled=True), tmp_path, labels=["face", "car", "person"])
    offer(again, frames[1], 0.6)
    doc = json.loads(again.coco_bytes())
    assert {c["name"]: c["id"] for c in doc["categories"]} == {"person": 1, "face": 2, "car": 3}
    names = {c["id"]: c["name"] for c in doc["categories"]}
    for image_id, frame in ((1, frames[0]), (2, frames[1])):  # each box still names its own label
        got = [names[a["category_id"]] for a in doc["annotations"] if a["image_id"] == image_id]
        assert got == [d.label for d in frame[1] + frame[2]]
    check_coco(doc)


def test_an_image_entry_without_its_edged_object_is_dropped_not_fatal(tmp_path: Path, frames: list[Frame]) -> None:
    store = LabelFrames(LabellingConfig(enabled=True), tmp_path, labels=["face"])
    keys = [offer(store, f, 0.1 * (i + 1)) for i, f in enumerate(frames[:2])]
    coco = tmp_path / "labelling/coco.json"
    doc = json.loads(coco.read_text())
    del doc["images"][0]["edged"]
    coco.write_text(json.dumps(doc))
    again = LabelFrames(LabellingConfig(enabled=True), tmp_path, labels=["face"])
    assert [i["key"] for i in again.index()] == [keys[1]]
    assert not (tmp_path / f"labelling/images/{keys[0]}.jpg").exists()  # no longer named: removed
    check_coco(json.loads(coco.read_text()))
