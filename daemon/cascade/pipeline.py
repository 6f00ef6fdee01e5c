"""The cascade between the scene and the publisher: each result's crops handed to the stages that take them,
the result held until every stage it waits for has answered, then handed on in its camera's order.

    decode thread → Cascade.submit(result): for each stage, the crops its detections call for (crops.py; a
        track only when it is due, votes.py), copied out of the frame → the stage's bounded queue (runner.py;
        full: the result goes on without that stage, counted); a result with nothing to wait for goes on at once
    stage threads (runner.py) answer → `StagedResult` (each detection's stage outputs, the tracks' votes where a
        track was not inferred again, `stage_versions`) → the sink (the publisher), after every earlier result
        of the same camera: results keep their order per camera, never blocking the decode thread

`build_cascade` is what app.py calls: the stages opened and admitted (loader.py), the cascade in front of the sink.
A result's object events wait with it and leave with its detections' stage outputs (`with_stage_outputs`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from edged.models.package import Package

from ..capture.camera import Camera
from ..config import Config
from ..config.stages import StageConfig
from ..inference import Result
from .crops import Crop, cut, select
from .loader import open_stages
from .runner import FrameFor, Stage, StageModel, _Group, _Job

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedResult(Result):
    """A result with what the stages said: `stages[i]` is detection i's {stage name: output} (empty when no
    stage took it), `stage_versions` each stage's ``name@version`` that the result's outputs come from."""

    stages: tuple[dict[str, dict[str, Any]], ...] = ()
    stage_versions: dict[str, str] = field(default_factory=dict)


class Cascade:
    """Every stage, between the scene and the publisher. `submit` is called by the decode thread and never
    blocks it; `sink` gets each result once its stages have answered, in each camera's order."""

    def __init__(
        self,
        stages: Sequence[tuple[StageConfig, StageModel]],
        frame_for: FrameFor,
        sink: Callable[[StagedResult], None],
    ) -> None:
        # the stage threads end at `join`, once nothing more comes (after the inference loop's end), not at the
        # daemon's stop: the decode thread still hands over what it had decoded then
        self._closing = threading.Event()
        self.stages = [Stage(cfg, model, self._answered, self._closing) for cfg, model in stages]
        self._frame_for = frame_for
        self._sink = sink
        self._lock = threading.Lock()  # the jobs' counters and the per-camera queues; held while handing on
        self._queues: dict[str, deque[_Job]] = {}
        self.results = 0  # results handed on

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.cfg.name == name:
                return s
        raise KeyError(name)

    def start(self) -> None:
        for s in self.stages:
            s.start()

    def join(self, timeout: float | None = None) -> None:
        """After the stop event (and the inference loop's end): each stage thread runs what is queued and ends;
        results still waiting after `timeout` go on as they are."""
        self._closing.set()
        for s in self.stages:
            s.join(timeout)
        with self._lock:
            unanswered = sum(1 for q in self._queues.values() for job in q if job.waiting > 0)
            for q in self._queues.values():
                for job in q:
                    job.waiting = 0
            for camera in list(self._queues):
                self._hand_on(camera)
        for s in self.stages:
            st = s.stats
            logger.info(
                "stage %s (%s): %d crops in %d batches, %d skipped by the reinfer interval, %d results dropped "
                "(queue full), %d without their frame, %d failed batches; batch ms %s",
                s.cfg.name,
                s.model.ref,
                st.crops,
                st.batches,
                st.skipped_reinfer,
                st.dropped,
                st.no_frame,
                st.errors,
                st.infer_ms.percentiles((50, 95)),
            )
        if unanswered:
            logger.warning("%d results went on without every stage's answer at the stop", unanswered)

    def close(self) -> None:
        """Every stage's backend closed (after `join`); one whose thread is still inside a batch (the join's bound
        passed) is left open for the process's exit: closing a session under a running batch aborts the process."""
        for s in self.stages:
            if s.alive:
                logger.warning("stage %s: its thread is still running a batch; its backend is not closed", s.cfg.name)
                continue
            s.model.backend.close()

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def submit(self, r: Result) -> None:
        job = _Job(r)
        groups: list[tuple[Stage, _Group]] = []
        frame: np.ndarray | None = None
        looked = False
        # after `join` began (a decode thread that outlived the inference loop's bounded join): straight on
        for stage in self.stages if not self._closing.is_set() else ():
            cfg = stage.cfg
            if cfg.cameras is not None and r.camera not in cfg.cameras:
                continue
            t = r.meta.transform
            picked = select(r.detections, cfg, t.src_width, t.src_height)
            due = []
            for index, rect in picked:
                track = r.detections[index].track_id
                if track is not None and not stage.votes.due(r.camera, track, r.detections[index].box):
                    stage.stats.skipped_reinfer += 1
                    continue
                due.append((index, rect, track))
            if not due:
                continue
            if not looked:
                frame, looked = self._frame_for(r.camera, r.meta.seq), True
            if frame is None:
                stage.stats.no_frame += 1
                continue
            size = (t.src_width, t.src_height)
            crops = [Crop(rect, cut(frame, rect), size) for _, rect, _ in due]
            groups.append((stage, _Group(job, [i for i, _, _ in due], crops, [tr for _, _, tr in due])))
        with self._lock:
            self._queues.setdefault(r.camera, deque()).append(job)
            job.waiting = len(groups)
        for stage, g in groups:
            if not stage.offer(g):
                self._answered(job)
        if not groups:
            with self._lock:
                self._hand_on(r.camera)

    def _answered(self, job: _Job) -> None:
        with self._lock:
            job.waiting -= 1
            if job.waiting <= 0:
                self._hand_on(job.result.camera)

    def _hand_on(self, camera: str) -> None:
        """Results of `camera` whose stages have all answered, in order, up to the first still waiting."""
        q = self._queues.get(camera)
        while q and q[0].waiting <= 0:
            job = q.popleft()
            job.handed = True
            self._sink(self._finish(job))
            self.results += 1

    def _finish(self, job: _Job) -> StagedResult:
        r = job.result
        versions: dict[str, str] = {}
        for stage in self.stages:
            cfg = stage.cfg
            if cfg.cameras is not None and r.camera not in cfg.cameras:
                continue
            version = job.versions.get(cfg.name, stage.model.version)
            versions[cfg.name] = f"{stage.model.name}@{version}"
            for i, d in enumerate(r.detections):
                if d.track_id is None or cfg.name in job.outputs[i] or d.label not in cfg.on_labels:
                    continue
                vote = stage.votes.vote(r.camera, d.track_id, version, r.meta.seq)
                if vote is not None:
                    job.outputs[i][cfg.name] = {**vote, "inferred": False}
        base = {f.name: getattr(r, f.name) for f in fields(Result)}
        return StagedResult(**base, stages=tuple(job.outputs), stage_versions=versions)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per stage: its counters and the version serving."""
        out = {}
        for s in self.stages:
            st = s.stats
            out[s.cfg.name] = {
                "model": s.model.ref,
                "crops": st.crops,
                "batches": st.batches,
                "by_batch": dict(st.by_batch),
                "padded_rows": st.padded_rows,
                "skipped_reinfer": st.skipped_reinfer,
                "dropped": st.dropped,
                "no_frame": st.no_frame,
                "errors": st.errors,
                "tracks": len(s.votes),
                "infer_ms": st.infer_ms.percentiles((50, 95)),
            }
        return out


def with_stage_outputs(events: list[dict[str, Any]], r: StagedResult) -> list[dict[str, Any]]:
    """A result's object events, each of a track that has a detection in `r` carrying that detection's stage
    outputs (`stages`, as the result has them, votes included) and `stage_versions`; other events (a track that
    ended, a camera's) as they are."""
    pairs = zip(r.detections, r.stages, strict=False)  # `stages`: one entry per detection
    by_track: dict[Any, dict[str, dict[str, Any]]] = {d.track_id: o for d, o in pairs if d.track_id is not None and o}
    out = []
    for ev in events:
        outputs = by_track.get(ev.get("track_id"))
        out.append({**ev, "stages": outputs, "stage_versions": r.stage_versions} if outputs else ev)
    return out


def build_cascade(
    cfg: Config,
    primary: Package,
    cameras: Sequence[Camera],
    sink: Callable[[StagedResult], None],
) -> Cascade | None:
    """The config's stages opened and admitted (loader.py), the cameras they run on told to keep the frames
    inference took (crops are cut from them), the cascade in front of `sink`; None without `stages:`."""
    if not cfg.stages:
        return None
    opened = open_stages(cfg, primary)
    stages = []
    for s in opened:
        m = s.package.manifest
        stages.append((s.cfg, StageModel(s.backend, s.decoder, m.input, m.name, m.version, m.decoder.type)))
    by_name = {c.name: c for c in cameras}
    for c in cameras:
        if any(s.cameras is None or c.name in s.cameras for s in cfg.stages):
            c.keep_taken = True
    return Cascade(stages, lambda name, seq: by_name[name].frame_for(seq), sink)
