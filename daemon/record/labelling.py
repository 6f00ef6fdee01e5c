"""The frames worth labelling: where a shadowed candidate disagrees most with the serving model, and (in
normal service, when asked) frames with a detection near the score threshold, kept as JPEGs with both
models' detections in one COCO JSON file that labelling tools read (CVAT, Label Studio, FiftyOne).

    <dir>/coco.json          images, annotations, categories: the export and this store's own index
    <dir>/images/<key>.jpg   one JPEG per kept frame, at the source's size (boxes are in its pixels)

- **The worst N are kept**: a min-heap on disagreement; a full store takes a new frame only when it
  disagrees more than the least disagreeing frame kept, which goes (a frame that would not be kept is
  not even encoded). Bounded by count (``labelling.max_frames``) and bytes (``labelling.max_mb``).
- **COCO**: ``images`` (id, file_name, width, height, date_captured: when the camera read the frame, plus
  an ``edged`` object: key, camera, disagreement, reason, the models' refs, bytes, and which frame it is:
  ``frame`` (for a file, its index in the file), ``seq`` (the camera's count), ``captured_at``),
  ``annotations`` (bbox ``[x, y, w, h]`` in source pixels, area, iscrowd 0, score, and ``attributes``
  naming the model that gave it: ``serving`` or ``candidate`` with its ``name@version``), ``categories``
  (one per label, ids from 1, kept stable).
  Every write is atomic (a temporary file fsynced and renamed): a power cut leaves the last whole file,
  and a restart drops JPEGs the file does not name.
- **Off the hot path**: `offer` encodes and writes at once (the shadow evaluator calls it from its own
  thread); `submit` hands a frame to the store's own thread ``labelling`` and returns, dropping it
  (counted) when that thread is still busy: what the decode thread calls in normal service.
- **Uploaded** (``labelling.upload``): each kept JPEG and then the COCO file go through the uploader as
  ``labelling/images/<key>.jpg`` and ``labelling/coco.json``; an evicted JPEG leaves the upload queue.
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.errors import StateDirError

from ...models.store.files import write_atomic
from ..capture.camera import FrameMeta
from ..config import CameraConfig, DetectionConfig, LabellingConfig
from ..decoders.base import Detection
from ..delivery.upload import Uploader

logger = logging.getLogger(__name__)

COCO_FILE = "coco.json"
IMAGES = "images"
SCHEMA = "edged.labelling/1"  # in the COCO file's `info`: what wrote it
KEY = re.compile(r"^[0-9]{6,}-[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # <number>-<camera>
REMOTE_DIR = "labelling"


@dataclass(frozen=True)
class Offer:
    """A frame handed to the store's thread (`submit`)."""

    camera: str
    frame: np.ndarray
    serving: Sequence[Detection]
    candidate: Sequence[Detection] | None
    disagreement: float
    reason: str
    serving_ref: str
    candidate_ref: str | None
    meta: FrameMeta | None = None  # which frame it is (its index, capture time): recorded with it


def near_threshold(detections: Sequence[Detection], threshold: float, band: float) -> float | None:
    """How near the threshold the lowest scored detection at or above it is, as 0-1 (1: on the threshold,
    0: `band` above it); None when no detection lies in [threshold, threshold + band)."""
    if band <= 0:
        return None
    near = [d.score for d in detections if threshold <= d.score < threshold + band]
    return None if not near else 1.0 - (min(near) - threshold) / band


def score_thresholds(detection: DetectionConfig, cameras: Sequence[CameraConfig]) -> dict[str, float]:
    """Each camera's score threshold: its own, else the global one."""
    out = {}
    for c in cameras:
        own = c.detection.score_threshold if c.detection is not None else None
        out[c.name] = own if own is not None else detection.score_threshold
    return out


class LabelFrames:
    """The kept frames under ``dir`` (default ``<state_dir>/labelling/``), bounded by count and bytes."""

    def __init__(
        self,
        cfg: LabellingConfig,
        state_dir: Path,
        labels: Sequence[str] = (),
        uploader: Uploader | None = None,
        thresholds: Mapping[str, float] | None = None,
    ) -> None:
        """`labels`: the serving model's, for category ids in its order. `thresholds`: each camera's score
        threshold (`score_thresholds`), for `observe`."""
        self.cfg = cfg
        self.thresholds = dict(thresholds or {})
        self._sampled: dict[str, float] = {}
        self.dir = cfg.dir if cfg.dir is not None else state_dir / "labelling"
        self.images_dir = self.dir / IMAGES
        self.coco_path = self.dir / COCO_FILE
        self.uploader = uploader if cfg.upload else None
        self._max_bytes = int(cfg.max_mb * 1024 * 1024)
        self._lock = threading.Lock()  # the index in memory: never held across a disk write
        self._save_lock = threading.Lock()  # one coco.json write at a time, the newest index last
        self._busy_lock = threading.Lock()  # the decode thread's counter: it never waits on the store's lock
        self._images: dict[str, dict[str, Any]] = {}  # key -> its COCO image, with its annotations under "_ann"
        self._heap: list[tuple[float, int, str]] = []  # (disagreement, number, key): the least disagreeing first
        self._categories: dict[str, int] = {}
        self._next = 1
        self._bytes = 0
        self._inbox: queue.Queue[Offer] = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self.counts = {"offered": 0, "kept": 0, "not_kept": 0, "evicted": 0, "busy": 0, "errors": 0}
        try:
            self.images_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot create {self.images_dir}: {exc.strerror or exc}") from exc
        self._load()  # the stored categories first: their ids stay whatever model serves now
        for label in labels:
            self._category(label)

    # -- the callers' side ------------------------------------------------------------------------------

    def offer(
        self,
        camera: str,
        frame: np.ndarray,
        serving: Sequence[Detection],
        candidate: Sequence[Detection] | None,
        disagreement: float,
        reason: str,
        serving_ref: str,
        candidate_ref: str | None,
        meta: FrameMeta | None = None,
    ) -> str | None:
        """Keep `frame` (BGR, source size) with both models' detections when it is worth it; its key, or None
        when it disagrees less than every frame of a full store (or the write failed, logged and counted).
        `meta`: the camera's record of the frame, kept with it (its index and capture time)."""
        with self._lock:
            self.counts["offered"] += 1
            if not self._worth(disagreement):
                self.counts["not_kept"] += 1
                return None
        ok, jpg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.jpeg_quality])
        if not ok:
            logger.error("labelling: JPEG encoding of a %dx%d frame failed", frame.shape[1], frame.shape[0])
            with self._lock:
                self.counts["errors"] += 1
            return None
        data = jpg.tobytes()
        with self._lock:
            if not self._worth(disagreement) or len(data) > self._max_bytes:
                self.counts["not_kept"] += 1
                return None
            n = self._next  # reserved: the JPEG is written outside the lock, listed once it is there
            self._next += 1
        key = f"{n:06d}-{camera}"
        path = self.images_dir / f"{key}.jpg"
        try:
            write_atomic(path, data)
        except StateDirError as exc:
            logger.error("labelling: %s", exc)
            with self._lock:
                self.counts["errors"] += 1
            return None
        captured = meta.captured_at if meta is not None else datetime.now(timezone.utc).timestamp()
        which = {} if meta is None else {"frame": meta.frame, "seq": meta.seq, "captured_at": round(captured, 3)}
        with self._lock:
            image = {
                "id": n,
                "file_name": f"{key}.jpg",
                "width": int(frame.shape[1]),
                "height": int(frame.shape[0]),
                "date_captured": datetime.fromtimestamp(captured, timezone.utc).isoformat(timespec="milliseconds"),
                "edged": {
                    "key": key,
                    "camera": camera,
                    "disagreement": round(float(disagreement), 6),
                    "reason": reason,
                    "serving": serving_ref,
                    "candidate": candidate_ref,
                    "bytes": len(data),
                    **which,
                },
                "_ann": [self._annotation(d, "serving", serving_ref) for d in serving]
                + [self._annotation(d, "candidate", candidate_ref or "") for d in candidate or ()],
            }
            self._images[key] = image
            heapq.heappush(self._heap, (float(disagreement), n, key))
            self._bytes += len(data)
            gone = self._evict()
            kept = key in self._images
            self.counts["kept" if kept else "not_kept"] += 1
        self._remove(gone)  # out of the upload queue, then off the disk
        self._save()
        if not kept:
            return None
        if self.uploader is not None:
            self.uploader.enqueue(path, f"{REMOTE_DIR}/{IMAGES}/{key}.jpg", "image/jpeg")
            self.uploader.enqueue(self.coco_path, f"{REMOTE_DIR}/{COCO_FILE}", "application/json")
        return key

    def observe(
        self,
        camera: str,
        detections: Sequence[Detection],
        ref: str,
        frame: Callable[[], np.ndarray | None],
        now: float,
        meta: FrameMeta | None = None,
    ) -> bool:
        """Normal service, on the decode thread: a cheap look at a result; when a detection lies within
        ``near_threshold`` above the camera's score threshold and the camera's ``sample_s`` has passed, its
        frame (`frame()`, the one the boxes were found in, which `meta` describes) goes to the store's thread.
        True when handed over."""
        band = self.cfg.near_threshold
        if band <= 0 or now - self._sampled.get(camera, -1e18) < self.cfg.sample_s:
            return False
        near = near_threshold(detections, self.thresholds.get(camera, 0.0), band)
        if near is None:
            return False
        if self._inbox.full():
            self._count_busy()
            return False
        img = frame()
        if img is None:
            return False
        self._sampled[camera] = now
        return self.submit(Offer(camera, img, list(detections), None, near, "near_threshold", ref, None, meta))

    def submit(self, offer: Offer) -> bool:
        """Hand `offer` to the store's thread; False (counted as busy) when it is still on the last ones."""
        try:
            self._inbox.put_nowait(offer)
        except queue.Full:
            self._count_busy()
            return False
        return True

    def _count_busy(self) -> None:
        with self._busy_lock:
            self.counts["busy"] += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="labelling", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def jpeg_path(self, key: str) -> Path | None:
        """The kept JPEG of `key`, or None (no such frame, or not a key)."""
        if not KEY.match(key):
            return None
        with self._lock:
            if key not in self._images:
                return None
        return self.images_dir / f"{key}.jpg"

    def coco_bytes(self) -> bytes:
        with self._lock:
            return json.dumps(self._coco()).encode()

    def index(self) -> list[dict[str, Any]]:
        """The kept frames, most disagreeing first, as the HTTP index lists them."""
        with self._lock:
            items = [
                {**img["edged"], "width": img["width"], "height": img["height"], "detections": len(img["_ann"])}
                for img in self._images.values()
            ]
        return sorted(items, key=lambda i: -i["disagreement"])

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path` on the health server (which checks who asks):
        ``/labelling`` the index, ``/labelling/coco.json`` the COCO file, ``/labelling/<key>.jpg`` a frame."""
        if path in ("/labelling", "/labelling/"):
            doc = {"frames": self.index(), "coco": "/labelling/coco.json", "stats": self.stats()}
            return 200, "application/json", json.dumps(doc).encode() + b"\n"
        name = path.removeprefix("/labelling/")
        if name == COCO_FILE:
            return 200, "application/json", self.coco_bytes()
        jpeg = self.jpeg_path(name.removesuffix(".jpg")) if name.endswith(".jpg") else None
        try:
            data = jpeg.read_bytes() if jpeg is not None else None
        except FileNotFoundError:  # evicted since it was looked up
            data = None
        if data is None:
            return 404, "application/json", json.dumps({"status": "not found", "path": path}).encode() + b"\n"
        return 200, "image/jpeg", data

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"frames": len(self._images), "bytes": self._bytes, **self.counts}

    # -- inside ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                o = self._inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.offer(
                    o.camera,
                    o.frame,
                    o.serving,
                    o.candidate,
                    o.disagreement,
                    o.reason,
                    o.serving_ref,
                    o.candidate_ref,
                    o.meta,
                )
            except Exception:  # the thread's boundary: one bad frame must not end the store
                logger.exception("labelling: a frame of %s failed", o.camera)
                with self._lock:
                    self.counts["errors"] += 1

    def _worth(self, disagreement: float) -> bool:
        """Under the lock: would a frame of this disagreement be kept? (A full store by count, or by bytes with
        room for less than a frame of the kept ones' mean size, keeps only what beats its least frame.)"""
        n = len(self._images)
        full = n >= self.cfg.max_frames or (n > 0 and self._bytes + self._bytes / n > self._max_bytes)
        return not full or disagreement > self._heap[0][0]

    def _evict(self) -> list[Path]:
        """Under the lock: the least disagreeing frames taken out of the index until both bounds hold; their
        paths, for `_remove` (outside the lock)."""
        gone: list[Path] = []
        while self._heap and (len(self._images) > self.cfg.max_frames or self._bytes > self._max_bytes):
            _, _, key = heapq.heappop(self._heap)
            image = self._images.pop(key)
            self._bytes -= image["edged"]["bytes"]
            self.counts["evicted"] += 1
            gone.append(self.images_dir / image["file_name"])
        return gone

    def _remove(self, paths: Sequence[Path]) -> None:
        """Files this store no longer keeps: out of the upload queue first (a stop in between leaves a file
        that the next start removes, never a queued name without its file), then off the disk."""
        for path in paths:
            if self.uploader is not None:
                self.uploader.forget(path)
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.error("labelling: cannot remove %s: %s", path, exc.strerror or exc)

    def _category(self, label: str) -> int:
        if label not in self._categories:
            self._categories[label] = len(self._categories) + 1
        return self._categories[label]

    def _annotation(self, d: Detection, model: str, ref: str) -> dict[str, Any]:
        x1, y1, x2, y2 = (float(v) for v in d.box)
        w, h = max(0.0, x2 - x1), max(0.0, y2 - y1)
        attributes: dict[str, Any] = {"model": model, "ref": ref}
        if d.track_id is not None:
            attributes["track_id"] = d.track_id
        return {
            "category_id": self._category(d.label),
            "bbox": [round(x1, 2), round(y1, 2), round(w, 2), round(h, 2)],
            "area": round(w * h, 2),
            "iscrowd": 0,
            "score": round(float(d.score), 4),
            "attributes": attributes,
        }

    def _coco(self) -> dict[str, Any]:
        """Under the lock: the COCO document of what is kept, annotation ids numbered in image order."""
        images: list[dict[str, Any]] = []
        annotations: list[dict[str, Any]] = []
        for img in sorted(self._images.values(), key=lambda i: i["id"]):
            images.append({k: v for k, v in img.items() if k != "_ann"})
            for ann in img["_ann"]:
                annotations.append({"id": len(annotations) + 1, "image_id": img["id"], **ann})
        return {
            "info": {
                "description": "edged: the frames worth labelling",
                "version": SCHEMA,
                "date_created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            },
            "licenses": [],
            "images": images,
            "annotations": annotations,
            "categories": [{"id": i, "name": n, "supercategory": ""} for n, i in self._categories.items()],
        }

    def _save(self) -> None:
        """Not under the lock: the index serialised under it, written outside it (one writer at a time, so
        the last write holds the newest index)."""
        with self._save_lock:
            with self._lock:
                data = json.dumps(self._coco(), separators=(",", ":")).encode()
            try:
                write_atomic(self.coco_path, data)
            except StateDirError as exc:
                logger.error("labelling: %s", exc)
                with self._lock:
                    self.counts["errors"] += 1

    def _load(self) -> None:
        """The kept frames as the COCO file names them; JPEGs it does not name (a stop between the JPEG's write
        and the file's) removed, and frames whose JPEG is gone forgotten."""
        try:
            doc = json.loads(self.coco_path.read_bytes())
            images = {img["id"]: img for img in doc["images"]}
            for cat in sorted(doc["categories"], key=lambda c: c["id"]):
                self._categories.setdefault(cat["name"], len(self._categories) + 1)
            names = {c["id"]: c["name"] for c in doc["categories"]}
            for img in images.values():
                img["_ann"] = []
            for ann in doc["annotations"]:
                ann = {k: v for k, v in ann.items() if k not in ("id", "image_id")} | {"_image": ann["image_id"]}
                ann["category_id"] = self._categories[names[ann["category_id"]]]
                images[ann.pop("_image")]["_ann"].append(ann)
        except FileNotFoundError:
            images = {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error("labelling: %s unreadable (%s): starting empty", self.coco_path, exc)
            images = {}
        for img in images.values():
            try:
                key = img["edged"]["key"]
                if not KEY.match(key) or img["file_name"] != f"{key}.jpg":  # never a path outside images/
                    logger.warning("labelling: %s: image %r not one of ours: dropped", self.coco_path, img["file_name"])
                    continue
                if not (self.images_dir / img["file_name"]).is_file():
                    continue
                entry = (float(img["edged"]["disagreement"]), int(img["id"]), key)
                size = int(img["edged"]["bytes"])
            except (KeyError, TypeError, ValueError) as exc:  # one bad entry drops itself, not the store
                logger.warning("labelling: %s: an image entry unreadable (%r): dropped", self.coco_path, exc)
                continue
            self._images[key] = img
            heapq.heappush(self._heap, entry)
            self._bytes += size
            self._next = max(self._next, entry[1] + 1)
        named = {img["file_name"] for img in self._images.values()}
        self._remove([p for p in self.images_dir.iterdir() if p.name not in named])
        if self._images:
            logger.info("labelling: %d frames kept (%d bytes)", len(self._images), self._bytes)
        self._remove(self._evict())  # the bounds may have shrunk since
        if len(self._images) != len(images):
            self._save()
