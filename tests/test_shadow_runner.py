"""The shadow runner in process (daemon/lifecycle/shadow.py) on real frames of the demo video and the real
demo BlazeFace on ONNX Runtime: the serving model's detections of each frame are held against a candidate
that reads the very same frames through its own input spec. The same model agrees fully and passes; the same
graph with a wrong `mean` in its spec disagrees and fails with the figures; a dark scene gives no evidence by
`max_s` and is never a pass; the candidate runs at most one batch per step, at the sample rate asked."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.daemon.backends import open_backend
from edged.daemon.capture.camera import FrameMeta
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.daemon.inference import ActiveModel, own_cost_ms
from edged.daemon.lifecycle.shadow import ShadowRunner
from edged.daemon.record.labelling import Offer
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec, Package
from edged.protocol.shadow import ShadowAsk

OPTS = DecodeOptions(score_threshold=0.5)


class Cam:
    """The camera seam the runner reads (`Camera.frame_for`, `keep_taken`): frames by seq, as taken."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.keep_taken = False
        self.frames: dict[int, np.ndarray] = {}

    def frame_for(self, seq: int) -> np.ndarray | None:
        return self.frames.get(seq)


class Labels:
    """The labelling store's seam (`LabelFrames.submit`): what the runner hands it, recorded."""

    def __init__(self) -> None:
        self.offers: list[Offer] = []

    def submit(self, offer: Offer) -> bool:
        self.offers.append(offer)
        return True


def model(pkg: Package, version: int) -> ActiveModel:
    be = open_backend("onnx", pkg.model_path, "onnxruntime", threads=1)
    m = pkg.manifest
    dec = build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in be.outputs})
    return ActiveModel(be, dec, m.name, version)


def video_frames(path: Path, n: int, every: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    out: list[np.ndarray] = []
    i = 0
    while len(out) < n:
        ok, f = cap.read()
        if not ok:
            break
        if i % every == 0:
            out.append(f)
        i += 1
    cap.release()
    assert len(out) == n
    return out


def serve(
    serving: ActiveModel, spec: InputSpec, runner: ShadowRunner, cam: Cam, frames: list[np.ndarray], fps: float
) -> int:
    """The loop's part, one frame per serving batch at `fps` on the camera's clock: the serving model infers
    and decodes it, the runner observes, then steps once (the inference thread between two batches) and its
    work runs (the decode thread). Returns the most candidate batches one step ran."""
    pre = Preprocessor(spec)
    most = 0
    for seq, frame in enumerate(frames):
        x = np.zeros(spec.shape, np.float32)
        t = pre.run(frame, x[0])
        t0, th0 = time.perf_counter(), time.thread_time()
        out = serving.backend.infer({spec.name: x})
        ms = own_cost_ms(serving.backend, (time.perf_counter() - t0) * 1000.0, th0) / spec.batch
        dets = serving.decoder.decode(out, [t], OPTS)
        cam.frames = {seq: frame}  # only the frame inference took is kept
        meta = FrameMeta(seq, 1000.0 + seq / fps, seq / fps, t, seq / fps, seq)
        runner.observe(serving, [("lobby", meta)], dets, ms)
        before = runner.batches
        work = runner.step()
        most = max(most, runner.batches - before)
        if work is not None:
            work()
    return most


@pytest.fixture(scope="module")
def serving(demo: DemoAssets) -> ActiveModel:
    return model(demo.packages["blazeface-back"], 1)


def test_the_same_model_agrees_and_a_wrong_mean_fails_with_figures(demo: DemoAssets, serving: ActiveModel) -> None:
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    frames = video_frames(demo.video, 40, 5)
    # latency is left out of the thresholds: two runs of one model on a machine this loaded differ by chance
    thresholds = {"agreement": 0.95, "recall": 0.95, "precision": 0.95}
    ask = ShadowAsk(sample_fps=2.0, promote_if=thresholds, min_frames=10, min_detections=5, min_s=0.0, max_s=600)
    # a camera at 4 fps sampled at 2 fps: every other frame goes to the candidate
    cam = Cam("lobby")
    same = ShadowRunner(model(pkg, 2), spec, [cam], ask, OPTS, ("blazeface-back", 1))
    assert serve(serving, spec, same, cam, frames, fps=4.0) == 1
    state, reasons, totals, per_camera = same.judge()
    assert totals["frames"] == 20 and same.batches == 20 and same.skipped == 0
    assert totals["serving_detections"] >= 5
    assert totals["agreement"] == 1.0 and totals["recall"] == 1.0 and totals["precision"] == 1.0
    assert totals["score_shift"] < 1e-4 and per_camera["lobby"] == totals
    assert totals["serving_ms"] > 0 and totals["candidate_ms"] > 0 and 0.2 < totals["latency_ratio"] < 5.0
    assert (state, reasons) == ("passed", [])

    wrong_spec = spec.model_copy(update={"mean": [255.0, 255.0, 255.0]})
    cam = Cam("lobby")
    sink = Labels()
    wrong = ShadowRunner(model(pkg, 3), wrong_spec, [cam], ask, OPTS, ("blazeface-back", 1), labels=sink)
    serve(serving, spec, wrong, cam, frames, fps=4.0)
    state, reasons, totals, _ = wrong.judge()
    assert state == "failed" and totals["frames"] == 20
    assert totals["agreement"] < 0.5 and totals["recall"] < 0.5, totals
    assert any(r.startswith("agreement ") for r in reasons) and any(r.startswith("recall ") for r in reasons)
    doc = wrong.report("cam-01", "t1", state, reasons, {"serving": 1.0, "candidate": 1.0, "budget": None})
    assert doc["totals"]["agreement"] == totals["agreement"] and doc["hold_ms"]["batches"] == 20
    # the frames they disagree on go to the labelling store: the very frames, both models' detections
    assert sink.offers and all(o.reason == "shadow" and o.disagreement > 0 for o in sink.offers)
    assert all(o.serving_ref == "blazeface-back@1" and o.candidate_ref == "blazeface-back@3" for o in sink.offers)
    assert all(any(np.array_equal(o.frame, f) for f in frames[::2]) for o in sink.offers)
    assert sum(len(o.serving) for o in sink.offers) > 0 and all(o.candidate is not None for o in sink.offers)


def test_a_dark_scene_gives_no_evidence_never_a_pass(demo: DemoAssets, serving: ActiveModel) -> None:
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    dark = [np.zeros((360, 640, 3), np.uint8) for _ in range(12)]
    ask = ShadowAsk(sample_fps=5.0, min_frames=5, min_detections=5, min_s=0.0, max_s=30)
    cam = Cam("lobby")
    runner = ShadowRunner(model(pkg, 2), spec, [cam], ask, OPTS, ("blazeface-back", 1))
    serve(serving, spec, runner, cam, dark, fps=5.0)
    state, _, totals, _ = runner.judge()
    assert state == "running" and totals["frames"] == 12 and totals["serving_detections"] == 0
    assert totals["agreement"] == 1.0  # both saw nothing: agreement, but no evidence
    state, reasons, _, _ = runner.judge(now=runner.started + 30.0)
    assert state == "no_evidence" and reasons == ["too little evidence in 30 s: detections 0 of 5"]
    stop = threading.Event()
    stop.set()
    published: list[str] = []
    assert runner.evaluate(stop, lambda s, r: published.append(s)) == ("stopped", []) and published == ["running"]


@pytest.mark.parametrize(
    "thresholds", [{"agreement": 0.95, "latency": 1.5}, None], ids=["agreement-and-latency", "the-defaults"]
)
def test_a_dark_scene_whose_frames_and_time_are_in_is_no_evidence_even_without_a_detection_floor(
    demo: DemoAssets, serving: ActiveModel, thresholds: dict[str, float] | None
) -> None:
    """An ask with no detection floor (refused on the wire since min_detections >= 1, so built here without
    validation, as a device never gets it): the frames and the time are in, neither model saw a face. Agreement
    is 1.0 and latency defined, so the agreement-and-latency ask passed; the defaults' recall and precision have
    no figure, so it failed (model_rejected, the version marked bad). Neither: no evidence."""
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    dark = [np.zeros((360, 640, 3), np.uint8) for _ in range(8)]
    with pytest.raises(ValueError, match="under 1"):
        ShadowAsk(min_detections=0)
    fields = dict(ShadowAsk(sample_fps=5.0, min_frames=5, min_s=0.0, max_s=30).model_dump(), min_detections=0)
    if thresholds is not None:
        fields["promote_if"] = thresholds
    ask = ShadowAsk.model_construct(**fields)
    cam = Cam("lobby")
    runner = ShadowRunner(model(pkg, 2), spec, [cam], ask, OPTS, ("blazeface-back", 1))
    serve(serving, spec, runner, cam, dark, fps=5.0)
    state, reasons, totals, _ = runner.judge()
    assert totals["frames"] == 8 and totals["serving_detections"] == totals["candidate_detections"] == 0
    assert totals["agreement"] == 1.0 and totals["latency_ratio"] is not None
    assert (state, reasons) == ("no_evidence", ["neither model detected anything in 8 frames: no evidence either way"])


def test_frames_gone_from_the_camera_and_other_models_batches_are_not_evaluated(
    demo: DemoAssets, serving: ActiveModel
) -> None:
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    cam = Cam("lobby")
    runner = ShadowRunner(model(pkg, 2), spec, [cam], ShadowAsk(), OPTS, ("blazeface-back", 7))
    frame = video_frames(demo.video, 1, 1)[0]
    x = np.zeros(spec.shape, np.float32)
    t = Preprocessor(spec).run(frame, x[0])
    meta = FrameMeta(0, 1000.0, 0.0, t, 0.0, 0)
    runner.observe(serving, [("lobby", meta)], [[]], 10.0)  # serving is version 1, not the 7 compared with
    assert runner.step() is None and runner.skipped == 0
    runner.serving = ("blazeface-back", 1)
    runner.observe(serving, [("lobby", meta)], [[]], 10.0)  # the camera no longer holds seq 0
    assert runner.step() is None and runner.skipped == 1


class Broken:
    """A candidate backend whose batches fail (a model that loads but cannot run these inputs)."""

    def __init__(self, real: ActiveModel) -> None:
        self.real = real.backend
        self.cpu_bound = True

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT")

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def test_a_candidate_whose_batches_fail_fails_at_once(demo: DemoAssets, serving: ActiveModel) -> None:
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    good = model(pkg, 2)
    bad = ActiveModel(Broken(good), good.decoder, good.name, good.version)  # type: ignore[arg-type]
    cam = Cam("lobby")
    runner = ShadowRunner(bad, spec, [cam], ShadowAsk(min_s=0.0), OPTS, ("blazeface-back", 1))
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        serve(serving, spec, runner, cam, video_frames(demo.video, 1, 1), fps=4.0)
    state, reasons, totals, _ = runner.judge()
    assert state == "failed" and totals["frames"] == 0
    assert reasons == ["a candidate batch failed: RuntimeError: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT"]


def test_two_cameras_in_one_serving_batch_share_a_candidate_batch_and_sum_in_the_totals(
    demo: DemoAssets, serving: ActiveModel
) -> None:
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    frames = video_frames(demo.video, 8, 7)
    cams = [Cam("a"), Cam("b")]
    runner = ShadowRunner(model(pkg, 2), spec, cams, ShadowAsk(sample_fps=1.0, min_s=0.0), OPTS, ("blazeface-back", 1))
    pre = {c.name: Preprocessor(spec) for c in cams}
    for k in range(4):  # one serving batch of two rows a second: camera a gets the even frames, b the odd ones
        x = np.zeros(spec.shape, np.float32)
        rows = []
        for i, cam in enumerate(cams):
            seq = 2 * k + i
            t = pre[cam.name].run(frames[seq], x[i])
            cam.frames = {seq: frames[seq]}
            rows.append((cam.name, FrameMeta(seq, 1000.0 + k, float(k), t, float(k), seq)))
        transforms = [meta.transform for _, meta in rows]
        dets = serving.decoder.decode(serving.backend.infer({spec.name: x}), transforms, OPTS)
        runner.observe(serving, rows, dets, 5.0)
        work = runner.step()
        assert work is not None and runner.step() is None  # both rows in one candidate batch, then nothing
        work()
    totals, per_camera = runner.figures()
    assert set(per_camera) == {"a", "b"} and per_camera["a"]["frames"] == per_camera["b"]["frames"] == 4
    assert runner.batches == 4 and totals["frames"] == 8
    for key in ("serving_detections", "candidate_detections", "matched"):
        assert totals[key] == per_camera["a"][key] + per_camera["b"][key]
    assert totals["agreement"] == 1.0 and totals["serving_detections"] > 0
