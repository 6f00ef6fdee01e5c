"""The inference thread runs fixed batches; a gather thread before it takes frames from ready cameras
and copies them into one of two input buffers while the batch before runs (the copy is ~0.1 ms a row,
off the engine's critical path), and a decode thread after it turns the outputs into results while
the next batch runs, and hands them on.

It takes at most one frame per camera per batch (the latest), goes as soon as B frames are
in hand or every live camera has given one, and otherwise waits at most ``max_wait_ms`` after
the first frame for more. It runs the smallest fixed batch the model carries that covers the frames
in hand (a package with ``extra_batches``: one camera runs at batch 1, four at batch 4); what that
batch has beyond them is padding: run (the engine's batch is fixed) but never decoded or published.
The inference thread owns the backend (and, on a GPU, its context); at most one gathered batch
waits for it (two buffers: one being run, one being filled).

A model swap (lifecycle/manager.py) hands the loop a new `ActiveModel` with `flip()`; the loop takes it between two
batches, so every batch, and every result, belongs to exactly one model version. `flip(None)` holds
the loop (no batch runs) until the next flip: the stop-the-world swap, when two models do not fit.

A shadowed candidate (lifecycle/shadow.py, an offer with ``shadow``) is handed the serving model's decoded
rows (`Shadow.observe`, decode thread) and runs on the inference thread between two serving batches, only
when no serving batch waits, one candidate batch at a time (`Shadow.step`); its outputs are decoded on the
decode thread and never become results.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edged.errors import InferenceError
from edged.models.package import InputSpec

from .backends import Backend
from .backends.base import fixed_batches
from .capture.camera import Camera, FrameMeta
from .capture.motion import MotionGate
from .decoders import DecodeOptions, Decoder, Detection
from .host.affinity import CoreSplit, apply_engine
from .latency import Window as Window  # re-exported: daemon/telemetry.py takes it from here

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    camera: str
    meta: FrameMeta
    detections: list[Detection]
    infer_ms: float
    done_mono: float
    model_name: str
    model_version: int

    @property
    def capture_to_result_ms(self) -> float:
        return (self.done_mono - self.meta.captured_mono) * 1000.0


RECENT_ROWS = 5000  # the newest rows' output each model keeps for probation (probation_output_frames <= this)


@dataclass
class ActiveModel:
    """A loaded model and what the loop has seen of it (its own counters, for probation)."""

    backend: Backend
    decoder: Decoder
    name: str
    version: int
    infer_ms: Window = field(default_factory=Window)
    # what a batch costs the model itself: CPU time on a CPU backend, else wall time (Backend.cpu_bound);
    # probation judges latency regressions on it
    cost_ms: Window = field(default_factory=Window)
    batches: int = 0
    errors: int = 0
    # what it outputs, for probation to compare with the version before: real rows decoded, detections
    # kept (after the score threshold and label filter) and the sum of their scores
    rows: int = 0
    detections: int = 0
    score_sum: float = 0.0
    # (detections, score sum) of the newest decoded rows: the old version's output just before a swap is
    # what the new one's is compared with (its whole-life rate would compare a day's scene with a night's)
    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT_ROWS))

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def output_figures(self) -> OutputFigures:
        return OutputFigures(self.rows, self.detections, self.score_sum)

    def recent_output(self, rows: int) -> OutputFigures:
        """The output of the newest `rows` decoded rows (fewer when it has not decoded that many)."""
        last = list(self.recent)[-rows:] if rows > 0 else []
        return OutputFigures(len(last), sum(n for n, _ in last), sum(s for _, s in last))


@dataclass(frozen=True)
class OutputFigures:
    """A model's output on the cameras, summed: how many frames, detections and their scores."""

    rows: int
    detections: int
    score_sum: float

    @property
    def rate(self) -> float:
        """Detections per frame."""
        return self.detections / self.rows if self.rows else 0.0

    @property
    def mean_score(self) -> float:
        return self.score_sum / self.detections if self.detections else 0.0

    def __str__(self) -> str:
        return f"{self.rate:.2f} detections per frame, mean score {self.mean_score:.2f} over {self.rows} frames"


@dataclass(frozen=True)
class _Gathered:
    slot: int  # the input buffer that holds its rows
    rows: list[tuple[str, FrameMeta]]  # camera name and frame of each real row, in batch order


@dataclass(frozen=True)
class _Batch:
    outputs: dict[str, np.ndarray]
    rows: list[tuple[str, FrameMeta]]  # camera name and frame of each real row, in batch order
    infer_ms: float
    model: ActiveModel
    size: int = 0  # the fixed batch it ran at (padding included)
    own_ms: float = 0.0  # the batch's cost to the inference thread alone (`own_cost_ms`): what a shadow compares


class Shadow(Protocol):
    """A candidate evaluated beside the serving model (lifecycle/shadow.py `ShadowRunner`)."""

    def observe(
        self, model: ActiveModel, rows: Sequence[tuple[str, FrameMeta]], dets: Sequence[list[Detection]], ms: float
    ) -> None:
        """Decode thread: a serving batch decoded (`ms`: its `own_cost_ms` per image, padding counted)."""

    def due(self, now: float) -> bool:
        """Inference thread: the candidate's turn comes although serving batches wait (its samples are due)."""

    def step(self) -> Callable[[], None] | None:
        """Inference thread, between two serving batches: at most one candidate batch; what it returns runs on
        the decode thread (the candidate's decoding and comparison)."""


@dataclass
class InferenceStats:
    batches: int = 0
    rows: int = 0  # real frames inferred
    padded_rows: int = 0
    by_batch: dict[int, int] = field(default_factory=dict)  # batches run at each fixed batch size
    errors: int = 0
    shadow_errors: int = 0  # a shadowed candidate's failures (never the serving model's)
    infer_ms: Window = field(default_factory=Window)
    capture_to_result_ms: Window = field(default_factory=Window)
    last_progress: float = field(default_factory=time.monotonic)


class InferenceLoop:
    def __init__(
        self,
        cameras: Sequence[Camera],
        model: ActiveModel,
        spec: InputSpec,
        opts: DecodeOptions,
        max_wait_s: float,
        sink: Callable[[Result], None],
        cond: threading.Condition,
        stop: threading.Event,
    ) -> None:
        self.cameras = list(cameras)
        self.active: ActiveModel | None = model  # None while held by a stop-the-world swap
        self.spec = spec
        self.opts = opts
        self.max_wait_s = max_wait_s
        self.sink = sink
        self.cond = cond
        self._stop = stop
        self.stats = InferenceStats()
        self._pending: tuple[ActiveModel | None, threading.Event, list[ActiveModel | None]] | None = None
        self._flip_lock = threading.Lock()
        dtype = cameras[0].rows[0].dtype if cameras else np.float32
        self._buffers = [np.zeros(spec.shape, dtype=dtype) for _ in range(2)]
        self._free = [0, 1]  # buffers the gather thread may fill (under cond)
        self._gathered: deque[_Gathered] = deque()  # filled, for the inference thread (under cond)
        self._next = 0  # round-robin start, so no camera is always first
        self._sized: tuple[ActiveModel | None, tuple[int, ...]] = (None, (spec.batch,))  # the model's batches
        self._decode_q: queue.Queue[_Batch | Callable[[], None] | None] = queue.Queue(maxsize=2)
        self.shadow: Shadow | None = None  # set and cleared by lifecycle/shadow.py while a candidate shadows
        self.cores: CoreSplit | None = None  # inference.dedicated_core: the inference thread's core (affinity.py)
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self._gather_thread = threading.Thread(target=self._gather_loop, name="gather", daemon=True)
        self._decoder_thread = threading.Thread(target=self._decode_loop, name="decode", daemon=True)
        # motion-gated cameras (their detection.motion): a frame where nothing moves is skipped, counted
        self.gates: dict[str, MotionGate] = {}
        for c in self.cameras:
            own = getattr(getattr(c, "cfg", None), "detection", None)
            if own is not None and own.motion is not None:
                self.gates[c.name] = MotionGate(own.motion)

    @property
    def backend(self) -> Backend | None:
        active = self.active
        return active.backend if active else None

    def warm_up(self, batches: int) -> float:
        """Run `batches` batches of padding before serving; return the last one's time in ms."""
        active = self.active
        if active is None:
            raise InferenceError("no model to warm up: the loop holds none (a stop-the-world swap is in progress)")
        return warm_up(active.backend, self.spec, batches)

    def flip(self, new: ActiveModel | None, timeout_s: float = 60.0) -> ActiveModel | None:
        """Make `new` the model between two batches (None: hold the loop); return the one it replaced.
        Blocks until the inference thread has taken it: from then on no batch runs on the old one."""
        if not self._thread.is_alive():  # not started (or ended): nothing runs, so flip here
            old, self.active = self.active, new
            return old
        done = threading.Event()
        box: list[ActiveModel | None] = []
        with self._flip_lock:
            self._pending = (new, done, box)
            with self.cond:
                self.cond.notify_all()
            if not done.wait(timeout_s):
                self._pending = None
                from edged.errors import SwapError

                raise SwapError(f"the inference thread did not reach a batch boundary within {timeout_s:.0f} s")
        return box[0]

    def _take_flip(self) -> None:
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        new, done, box = pending
        box.append(self.active)
        self.active = new
        done.set()

    def start(self) -> None:
        self._gather_thread.start()
        self._thread.start()
        self._decoder_thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._gather_thread.join(timeout)
        self._thread.join(timeout)
        self._decoder_thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def all_ended(self) -> bool:
        return bool(self.cameras) and all(c.stats.state in ("ended", "stopped") for c in self.cameras)

    def _gather(self) -> list[tuple[Camera, int, FrameMeta]]:
        b = self.spec.batch
        taken: list[tuple[Camera, int, FrameMeta]] = []
        deadline: float | None = None
        n = len(self.cameras)
        with self.cond:
            while not self._stop.is_set():
                have = {id(c) for c, _, _ in taken}
                for k in range(n):
                    cam = self.cameras[(self._next + k) % n]
                    if len(taken) == b:
                        break
                    if id(cam) in have:
                        continue
                    got = cam.take_locked()
                    if got is not None:
                        taken.append((cam, *got))
                        have.add(id(cam))
                if len(taken) == b:
                    break
                now = time.monotonic()
                if taken:
                    waiting_for = [c for c in self.cameras if c.live and id(c) not in have]
                    if not waiting_for:
                        break
                    if deadline is None:
                        deadline = now + self.max_wait_s
                    if now >= deadline:
                        break
                self.cond.wait(0.2 if deadline is None else max(0.0, deadline - now))
        self._next = (self._next + 1) % max(1, n)
        return taken

    def _gather_loop(self) -> None:
        """Fill a free buffer with the next batch's frames, hand it to the inference thread; until stopped
        (a batch gathered as the stop came is still handed on: the inference thread runs it). A failure ends
        it, logged, and the inference thread with it (the daemon stops: `alive`)."""
        try:
            self._gather_batches()
        except Exception:
            logger.exception("gathering frames failed")

    def _gather_batches(self) -> None:
        while not self._stop.is_set():
            with self.cond:
                while not self._free and not self._stop.is_set():
                    self.cond.wait(0.2)
                if not self._free:
                    return
                slot = self._free.pop()
            taken = self._gather()
            if self.gates and taken:
                taken = self._gate(taken)
            buffer = self._buffers[slot]
            for i, (cam, idx, _) in enumerate(taken):
                np.copyto(buffer[i], cam.rows[idx])
            with self.cond:
                for cam, idx, _ in taken:
                    cam.release_locked(idx)
                if taken:
                    self._gathered.append(_Gathered(slot, [(cam.name, meta) for cam, _, meta in taken]))
                    self.cond.notify_all()
                else:
                    self._free.append(slot)

    def _drained(self) -> bool:
        with self.cond:
            return not self._gathered or self.active is None

    def _next_gathered(self) -> _Gathered | None:
        """The next gathered batch, or None after a short wait (a flip waits, the loop is held, or none came)."""
        with self.cond:
            if self._gathered and self.active is not None and self._pending is None:
                return self._gathered.popleft()
            self.stats.last_progress = time.monotonic()  # idle (or held) but responsive
            if self._pending is None:
                self.cond.wait(0.2)
            return None

    def _run(self) -> None:
        try:
            if self.cores is not None:
                apply_engine(self.cores)  # never raises: a core gone leaves the thread unpinned, warned
            while True:
                self._take_flip()
                self._shadow_step()
                got = self._next_gathered()
                if got is not None and self.active is not None:
                    self._run_batch(got, self.active)
                elif not self._gather_thread.is_alive() and self._drained():
                    if not self._stop.is_set():
                        logger.error("the gather thread ended before a stop: the inference thread ends too")
                    break  # every batch gathered has run (unless held by a swap)
        finally:
            self._take_flip()  # a swap waiting on this thread is answered, not left hanging
            self._decode_q.put(None)  # the decode thread finishes what is queued, then ends

    def _shadow_step(self) -> None:
        """One candidate batch, when a candidate shadows and no serving batch waits, or when its samples are due
        although one waits (`Shadow.due`: a saturated device still evaluates, at the sampled rate): the bound on
        what shadowing holds a serving batch back is one candidate batch."""
        shadow = self.shadow
        if shadow is None:
            return
        with self.cond:
            if self._pending is not None or self.active is None:
                return  # a swap or a hold comes first
            busy = bool(self._gathered)
        if busy and not shadow.due(time.monotonic()):
            return  # a serving batch comes first
        try:
            work = shadow.step()
        except Exception:  # the candidate's failure: counted, never the serving model's
            self._count_shadow_error("running")
            return
        if work is not None:
            self._decode_q.put(work)

    def _count_shadow_error(self, stage: str) -> None:
        self.stats.shadow_errors += 1
        if self.stats.shadow_errors <= 3 or self.stats.shadow_errors % 100 == 0:
            logger.exception("shadow candidate: %s failed (%d so far)", stage, self.stats.shadow_errors)

    def _gate(self, taken: list[tuple[Camera, int, FrameMeta]]) -> list[tuple[Camera, int, FrameMeta]]:
        """The frames the motion gates let through; the others are released (skipped, counted)."""
        kept, skipped = [], []
        for cam, idx, meta in taken:
            gate = self.gates.get(cam.name)
            if gate is None or gate.wants(cam.rows[idx], meta.clock_s):
                kept.append((cam, idx, meta))
            else:
                skipped.append((cam, idx))
        if skipped:
            with self.cond:
                for cam, idx in skipped:
                    cam.release_locked(idx)
        return kept

    def _run_batch(self, got: _Gathered, model: ActiveModel) -> None:
        size = self._size_for(model, len(got.rows))
        t0, c0, th0 = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            # the first `size` rows: a view, no copy (the rows past the frames are padding)
            outputs = model.backend.infer({self.spec.name: self._buffers[got.slot][:size]})
        except Exception:  # a loop boundary: log once with the traceback, count, drop the batch
            self._count_error("inference", model)
            return
        finally:
            with self.cond:  # the outputs are the caller's (Backend.infer): the buffer may be filled again
                self._free.append(got.slot)
                self.cond.notify_all()
        infer_ms = (time.perf_counter() - t0) * 1000.0
        model.batches += 1
        model.infer_ms.add(infer_ms)
        model.cost_ms.add((time.process_time() - c0) * 1000.0 if model.backend.cpu_bound else infer_ms)
        self.stats.batches += 1
        self.stats.rows += len(got.rows)
        self.stats.padded_rows += size - len(got.rows)
        self.stats.by_batch[size] = self.stats.by_batch.get(size, 0) + 1
        self.stats.infer_ms.add(infer_ms)
        self.stats.last_progress = time.monotonic()
        # Decoding overlaps the next batch's inference; the bounded queue holds the engine back
        # (and so makes cameras drop frames) if decoding ever falls behind.
        own_ms = own_cost_ms(model.backend, infer_ms, th0)
        self._decode_q.put(_Batch(outputs, got.rows, infer_ms, model, size, own_ms))

    def _size_for(self, model: ActiveModel, frames: int) -> int:
        """The smallest fixed batch of `model` that holds `frames` (the largest is the spec's batch)."""
        if model is not self._sized[0]:
            self._sized = (model, fixed_batches(model.backend, self.spec.batch))
        return next((b for b in self._sized[1] if b >= frames), self.spec.batch)

    def _decode_loop(self) -> None:
        while (batch := self._decode_q.get()) is not None:
            if not isinstance(batch, _Batch):  # a shadowed candidate's batch: decoded and compared, no result
                try:
                    batch()
                except Exception:
                    self._count_shadow_error("decoding")
                continue
            m = batch.model  # the model that ran this batch decodes it and names it in its results
            try:
                dets = m.decoder.decode(batch.outputs, [meta.transform for _, meta in batch.rows], self.opts)
            except Exception:  # a loop boundary, as above
                self._count_error("decoding", m)
                continue
            done = time.monotonic()
            m.rows += len(dets)
            m.detections += sum(len(row) for row in dets)
            m.score_sum += sum(d.score for row in dets for d in row)
            m.recent.extend((len(row), sum(d.score for d in row)) for row in dets)
            for (camera, meta), row_dets in zip(batch.rows, dets, strict=True):
                result = Result(camera, meta, row_dets, batch.infer_ms, done, m.name, m.version)
                self.stats.capture_to_result_ms.add(result.capture_to_result_ms)
                self.sink(result)
            if (shadow := self.shadow) is not None:
                try:
                    shadow.observe(m, batch.rows, dets, batch.own_ms / max(1, batch.size))
                except Exception:
                    self._count_shadow_error("sampling")

    def _count_error(self, stage: str, model: ActiveModel) -> None:
        model.errors += 1
        self.stats.errors += 1
        if self.stats.errors <= 3 or self.stats.errors % 100 == 0:
            logger.exception("%s: batch failed (%d so far); dropping it", stage, self.stats.errors)


def own_cost_ms(backend: Backend, wall_ms: float, thread_t0: float) -> float:
    """A batch's cost to the thread that ran it, in ms, since `thread_t0` (`time.thread_time()`): its own CPU time
    on a CPU backend (other threads' work and waits left out: two models compared on a loaded machine), else
    the wall time."""
    return (time.thread_time() - thread_t0) * 1000.0 if backend.cpu_bound else wall_ms


def warm_up(backend: Backend, spec: InputSpec, batches: int) -> float:
    """Run `batches` batches of zeros through `backend` at each fixed batch it carries (smallest first); return
    the last one's time in ms (the largest batch's)."""
    zeros = np.zeros(spec.shape, dtype=spec.dtype)
    ms = 0.0
    for size in fixed_batches(backend, spec.batch):
        for _ in range(batches):
            t0 = time.perf_counter()
            backend.infer({spec.name: zeros[:size]})
            ms = (time.perf_counter() - t0) * 1000.0
    return ms
