"""The stage threads: whole groups of crops (one result's each) batched across cameras and frames into each
stage's fixed batch, run, decoded, voted per track and handed back to the cascade (pipeline.py).

    stage-<name> thread: groups taken until the stage's largest fixed batch is full or ``max_wait_ms`` has passed
        since the first; the smallest fixed batch that covers them is run (as the primary does, its padding never
        decoded); outputs decoded by the stage's decoder → per crop {labels | text | boxes}, voted per track
        (votes.py) → the group's result told (`done`)

A stage's `StageModel` is swapped with `Stage.flip` between two of its batches, never inside one result's crops,
and its tracks' votes start again: no result mixes two versions of a stage (`stage_versions` names the one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.errors import SwapError
from edged.models.package import InputSpec, Package

from ..backends import Backend, open_backend
from ..backends.base import BatchSet, fixed_batches
from ..capture.preprocess import Transform
from ..config.stages import StageConfig
from ..decoders import DecodeOptions, Decoder, Detection, build_decoder
from ..decoders.classify import Classify
from ..decoders.ctc import Ctc
from ..inference import OutputFigures, Result, Window
from .crops import Crop, CropInput, frame_transform
from .votes import Votes

logger = logging.getLogger(__name__)

OUTPUT_WINDOW = 4096  # crops whose output a StageModel keeps (probation's window is at most this)

FrameFor = Callable[[str, int], "np.ndarray | None"]  # (camera, FrameMeta.seq) -> the frame inference took


@dataclass
class StageModel:
    """One loaded version of a stage's package, and what the stage has run on it (for probation)."""

    backend: Backend  # a BatchSet when the package carries several fixed batches
    decoder: Decoder
    spec: InputSpec  # shape[0]: the largest fixed batch
    name: str
    version: int
    decoder_type: str = ""  # the manifest's decoder type (what a pushed version must match)
    batches: int = 0
    crops: int = 0
    errors: int = 0
    cost_ms: Window = field(default_factory=Window)
    crop_ms: Window = field(default_factory=Window)  # a batch's cost over its real crops: cost per crop
    # per crop, newest last: whether the stage said something of it (text, a label over the threshold, a box)
    said: deque[bool] = field(default_factory=lambda: deque(maxlen=OUTPUT_WINDOW))

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def kind(self) -> str:
        """What the stage says of a crop: ``text`` (ctc), ``labels`` (classify) or ``boxes`` (a detector)."""
        if isinstance(self.decoder, Ctc):
            return "text"
        if isinstance(self.decoder, Classify):
            return "labels"
        return "boxes"

    def recent_output(self, crops: int) -> OutputFigures:
        """Its newest `crops` crops: how many, and how many of them the stage said something of (in
        `OutputFigures`' terms, as probation.output_verdict judges the primary's frames and detections)."""
        said = list(self.said)[-crops:] if crops > 0 else []
        return OutputFigures(len(said), sum(said), 0.0)


def open_stage_model(package: Package, threads: int = 0, providers: tuple[str, ...] = ("cpu",)) -> StageModel:
    """A stage package opened plainly: a backend per fixed batch, its decoder built and checked. (The daemon's
    start goes through daemon/cascade/loader.py, which verifies and admits first.)"""
    m = package.manifest
    opened: dict[int, Backend] = {}
    try:
        for b, path in package.batch_paths.items():
            opened[b] = open_backend(m.kind, path, threads=threads, providers=providers, compatibility=m.compatibility)
        backend: Backend = BatchSet(opened) if len(opened) > 1 else next(iter(opened.values()))
        shapes = {o.name: o.shape for o in backend.outputs}
        decoder = build_decoder(m.decoder, m.input, m.labels, shapes)
    except Exception:
        for member in opened.values():
            member.close()
        raise
    return StageModel(backend, decoder, m.input, m.name, m.version, m.decoder.type)


@dataclass
class StageStats:
    crops: int = 0  # crops inferred
    batches: int = 0
    by_batch: dict[int, int] = field(default_factory=dict)
    padded_rows: int = 0
    skipped_reinfer: int = 0  # tracked crops not inferred: the track's vote stood in (votes.py)
    dropped: int = 0  # results that went on without this stage: its queue was full
    no_frame: int = 0  # results whose frame the camera no longer kept: no crops
    errors: int = 0  # stage batches that failed (their results went on without the stage)
    infer_ms: Window = field(default_factory=Window)


class _Job:
    """One result waiting for its stages."""

    __slots__ = ("handed", "outputs", "result", "versions", "waiting")

    def __init__(self, result: Result) -> None:
        self.result = result
        self.outputs: list[dict[str, dict[str, Any]]] = [{} for _ in result.detections]
        self.waiting = 0  # groups not answered yet
        self.versions: dict[str, int] = {}  # stage -> the version that ran its crops
        self.handed = False  # gone to the sink (a stop's bound passed before this stage answered): not touched again


@dataclass
class _Group:
    job: _Job
    indices: list[int]  # detection indices, one per crop
    crops: list[Crop]
    tracks: list[int | None]


class Stage:
    """One stage: its bounded queue of groups, its thread, its model (swapped by `flip`) and its votes."""

    def __init__(
        self, cfg: StageConfig, model: StageModel, done: Callable[[_Job], None], closing: threading.Event
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.stats = StageStats()
        self.votes = Votes(cfg.reinfer_frames, cfg.iou_change, cfg.top_k)
        self.votes.reset(model.version)
        self._done = done
        self._stop = closing  # set by Cascade.join: what is queued runs, then the thread ends
        self._q: deque[_Group] = deque()
        self._cond = threading.Condition()
        self._pending: tuple[StageModel, threading.Event, list[StageModel]] | None = None
        self._inputs: dict[int, np.ndarray] = {}
        self._crop_input = CropInput(model.spec)
        self._thread = threading.Thread(target=self._run, name=f"stage-{cfg.name}", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout)

    def offer(self, group: _Group) -> bool:
        """Queue a result's crops; False (counted) when `max_pending` results already wait."""
        with self._cond:
            if len(self._q) >= self.cfg.max_pending:
                self.stats.dropped += 1
                return False
            self._q.append(group)
            self._cond.notify_all()
        return True

    def flip(self, new: StageModel, timeout_s: float = 60.0) -> StageModel:
        """Make `new` the stage's model between two of its batches; return the one it replaced. From then
        on no crop runs on the old one, and the tracks' votes start again."""
        if not self._thread.is_alive():
            old, self.model = self.model, new
            self._crop_input = CropInput(new.spec)
            self.votes.reset(new.version)
            return old
        done = threading.Event()
        box: list[StageModel] = []
        with self._cond:
            self._pending = (new, done, box)
            self._cond.notify_all()
        if not done.wait(timeout_s):
            with self._cond:
                self._pending = None
            raise SwapError(
                f"stage {self.cfg.name}: its thread did not reach a batch boundary within {timeout_s:.0f} s"
            )
        return box[0]

    def _take_flip(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        new, done, box = pending
        box.append(self.model)
        self.model = new
        self._crop_input = CropInput(new.spec)
        self._inputs.clear()
        self.votes.reset(new.version)
        done.set()

    def _take(self) -> list[_Group] | None:
        """Whole groups for one batch: at once when the largest batch is full, else after max_wait_ms since
        the first; None at a stop."""
        largest = self.model.spec.batch
        with self._cond:
            while not self._q:
                if self._stop.is_set():
                    return None
                if self._pending is not None:
                    self._take_flip()
                self._cond.wait(0.2)
            if self._pending is not None:
                self._take_flip()
                largest = self.model.spec.batch
            deadline = time.monotonic() + self.cfg.max_wait_ms / 1000.0
            while sum(len(g.crops) for g in self._q) < largest and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            taken: list[_Group] = [self._q.popleft()]
            n = len(taken[0].crops)
            while self._q and n + len(self._q[0].crops) <= largest:
                g = self._q.popleft()
                taken.append(g)
                n += len(g.crops)
            return taken

    def _run(self) -> None:
        while True:
            groups = self._take()
            if groups is None:
                return
            model = self.model  # one version for every crop of these groups (a flip waits for the next _take)
            try:
                outs = self._infer(model, [(g, i) for g in groups for i in range(len(g.crops))])
                at = 0
                for g in groups:
                    if not g.job.handed:
                        self._attach(g, model, outs[at : at + len(g.crops)])
                    at += len(g.crops)
            except Exception:  # a loop boundary: logged with the traceback, counted; the results go on without it
                logger.exception("stage %s: a batch failed on %s", self.cfg.name, model.ref)
                self.stats.errors += 1
                model.errors += 1
            finally:  # every group is answered, whatever happened: its camera's later results never wait on it
                for g in groups:
                    self._done(g.job)

    def _infer(self, model: StageModel, items: Sequence[tuple[_Group, int]]) -> list[dict[str, Any]]:
        """Run `items` (a group larger than the batch runs in several batches, on the same model)."""
        largest = model.spec.batch
        out: list[dict[str, Any]] = []
        for start in range(0, len(items), largest):
            out += self._batch(model, items[start : start + largest])
        return out

    def _batch(self, model: StageModel, items: Sequence[tuple[_Group, int]]) -> list[dict[str, Any]]:
        n = len(items)
        b = next((s for s in fixed_batches(model.backend, model.spec.batch) if s >= n), model.spec.batch)
        buf = self._inputs.get(b)
        if buf is None:
            buf = self._inputs[b] = np.zeros((b, *model.spec.shape[1:]), self._crop_input.dtype)
        crops = [g.crops[i] for g, i in items]
        transforms = [self._crop_input.run(c.pixels, buf[row]) for row, c in enumerate(crops)]
        t0, c0 = time.perf_counter(), time.process_time()
        outputs = model.backend.infer({model.spec.name: buf})
        wall_ms = (time.perf_counter() - t0) * 1000.0
        cost = (time.process_time() - c0) * 1000.0 if model.backend.cpu_bound else wall_ms
        model.cost_ms.add(cost)
        model.crop_ms.add(cost / max(1, n))
        st = self.stats
        st.batches += 1
        st.crops += n
        st.padded_rows += b - n
        st.by_batch[b] = st.by_batch.get(b, 0) + 1
        st.infer_ms.add(wall_ms)
        out = self._read(model, outputs, crops, transforms)
        model.said.extend(self._said(doc) for doc in out)
        model.batches += 1
        model.crops += n
        return out

    def _said(self, doc: dict[str, Any]) -> bool:
        """Whether a crop's output says anything: text, a top label at or over `score_threshold`, a box."""
        if "text" in doc:
            return bool(str(doc["text"]).strip())
        if "labels" in doc:
            labels = doc["labels"]
            return bool(labels) and float(labels[0][1]) >= self.cfg.score_threshold
        return bool(doc.get("boxes"))

    def _read(
        self, model: StageModel, outputs: dict[str, np.ndarray], crops: Sequence[Crop], transforms: Sequence[Transform]
    ) -> list[dict[str, Any]]:
        kind = model.kind
        if kind == "text" and isinstance(model.decoder, Ctc):
            return [{"text": text, "score": round(score, 4)} for text, score in model.decoder.read(outputs, len(crops))]
        if kind == "labels":
            opts = DecodeOptions(score_threshold=0.0, max_detections=self.cfg.top_k)
            rows = model.decoder.decode(outputs, transforms, opts)
            return [{"labels": [[d.label, round(d.score, 4)] for d in dets]} for dets in rows]
        opts = DecodeOptions(score_threshold=self.cfg.score_threshold)
        mapped = [frame_transform(t, c.rect, *c.frame_size) for t, c in zip(transforms, crops, strict=True)]
        rows = model.decoder.decode(outputs, mapped, opts)
        return [{"boxes": [_box(d) for d in dets]} for dets in rows]

    def _attach(self, g: _Group, model: StageModel, outs: Sequence[dict[str, Any]]) -> None:
        g.job.versions[self.cfg.name] = model.version
        for index, track, doc in zip(g.indices, g.tracks, outs, strict=True):
            if track is not None:
                r = g.job.result
                doc = self.votes.add(r.camera, track, model.version, r.meta.seq, doc)
            g.job.outputs[index][self.cfg.name] = {**doc, "inferred": True}


def _box(d: Detection) -> dict[str, Any]:
    return {"label": d.label, "class_id": d.class_id, "score": round(d.score, 4), "box": [round(v, 1) for v in d.box]}
