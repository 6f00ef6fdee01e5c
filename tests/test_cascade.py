"""The second-stage runtime (daemon/cascade/) on real models: PP-OCRv4's text recogniser (CTC) and text-line
orientation classifier (from the rapidocr-onnxruntime wheel, fetched with the demo assets) on crops of the
documents video's regions, the PicoDet layout model as a detector on crops. Every stage output is checked
against the stage's ONNX model run directly with onnxruntime on the same crop pixels, preprocessed here by
an implementation of the input spec of the test's own."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.camera import FrameMeta
from edged.daemon.capture.preprocess import Transform
from edged.daemon.cascade.crops import crop_rect, cut, frame_transform, select
from edged.daemon.cascade.pipeline import Cascade, StagedResult
from edged.daemon.cascade.runner import StageModel
from edged.daemon.cascade.votes import Votes
from edged.daemon.config import StageConfig
from edged.daemon.decoders import DecodeOptions, Detection, build_decoder
from edged.daemon.decoders.ctc import Ctc
from edged.models.demo import DemoAssets
from edged.models.package import DecoderSpec, InputSpec
from tests.conftest import wait_until

REC_SPEC = {
    "name": "x",
    "shape": [4, 3, 48, 960],
    "layout": "NCHW",
    "color": "BGR",
    "scale": 1 / 255,
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
    "resize": "letterbox",
    "letterbox": "topleft",
    "pad_value": 128,
}
CLS_SPEC = {**REC_SPEC, "shape": [4, 3, 48, 192]}


def raw_model(demo: DemoAssets, name: str) -> Path:
    """A model file of the rapidocr wheel: the recogniser is among the demo's raw files; the classifier is read
    from the wheel the demo downloaded."""
    path = demo.root / "raw" / name
    if path.exists():
        return path
    import zipfile

    (wheel,) = (demo.root / "downloads").glob("rapidocr_onnxruntime-*.whl")
    out = demo.root.parent / "cascade-test" / name
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            data = z.read(f"rapidocr_onnxruntime/models/{name}")
        tmp = out.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(out)
    return out


@pytest.fixture(scope="module")
def rec_onnx(demo: DemoAssets) -> Path:
    return raw_model(demo, "ch_PP-OCRv4_rec_infer.onnx")


@pytest.fixture(scope="module")
def charset(rec_onnx: Path) -> list[str]:
    sess = ort.InferenceSession(str(rec_onnx), providers=["CPUExecutionProvider"])
    return str(sess.get_modelmeta().custom_metadata_map["character"]).splitlines()


@pytest.fixture(scope="module")
def pages(demo: DemoAssets) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(demo.documents))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    cap.release()
    return frames


@pytest.fixture(scope="module")
def truth(demo: DemoAssets) -> dict[int, list[dict[str, Any]]]:
    import json

    return {f["frame"]: f["regions"] for f in json.loads(demo.documents_truth.read_text())["frames"]}


def rec_model(rec_onnx: Path, charset: list[str], version: int = 1) -> StageModel:
    spec = InputSpec.model_validate(REC_SPEC)
    backend = OnnxRuntimeBackend(rec_onnx, threads=2)
    decoder = build_decoder(
        DecoderSpec(type="ctc", params={"space": True}), spec, charset, {o.name: o.shape for o in backend.outputs}
    )
    return StageModel(backend, decoder, spec, "ppocr-rec", version)


# --- the reference: the input spec and greedy CTC written out again, onnxruntime called directly ----------------
def reference_rows(crops: Sequence[np.ndarray], spec: dict[str, Any]) -> np.ndarray:
    """Keep the aspect, scale to fit, at the top left, pad with pad_value; (x/255 - 0.5) / 0.5; NCHW."""
    _, _, h, w = spec["shape"]
    rows = []
    for c in crops:
        s = min(w / c.shape[1], h / c.shape[0])
        nw, nh = max(1, min(w, int(c.shape[1] * s))), max(1, min(h, int(c.shape[0] * s)))
        canvas = np.full((h, w, 3), spec["pad_value"], np.uint8)
        canvas[:nh, :nw] = cv2.resize(c, (nw, nh), interpolation=cv2.INTER_LINEAR)
        rows.append(((canvas.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(rows)


def reference_ctc(probs: np.ndarray, charset: list[str]) -> list[tuple[str, float]]:
    chars = ["", *charset, " "]
    out = []
    for row in probs:
        text, scores, last = "", [], -1
        for t in range(row.shape[0]):
            k = int(np.argmax(row[t]))
            if k != 0 and k != last:
                text += chars[k]
                scores.append(float(row[t, k]))
            last = k
        out.append((text, float(np.mean(scores)) if scores else 0.0))
    return out


def direct_text(rec_onnx: Path, charset: list[str], crops: Sequence[np.ndarray]) -> list[tuple[str, float]]:
    sess = ort.InferenceSession(str(rec_onnx), providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"x": reference_rows(crops, REC_SPEC)})
    return reference_ctc(probs, charset)


def result(camera: str, frame: int, size: tuple[int, int], dets: list[Detection], seq: int | None = None) -> Any:
    from edged.daemon.inference import Result

    meta = FrameMeta(
        frame, time.time(), time.monotonic(), Transform(1, 1, 0, 0, *size), 0.0, frame if seq is None else seq
    )
    return Result(camera, meta, dets, 1.0, time.monotonic(), "picodet-layout", 1)


def stage_cfg(**kw: Any) -> StageConfig:
    doc = {"name": "ocr", "model": {"package": "/nonexistent"}, "on_labels": ["title"], "max_wait_ms": 50, **kw}
    return StageConfig.model_validate(doc)


def region_dets(regions: list[dict[str, Any]], track: int | None = None) -> list[Detection]:
    labels = ["text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer"]
    return [
        Detection(r["label"], labels.index(r["label"]) if r["label"] in labels else 0, 0.9, tuple(r["box"]), track)
        for r in regions
    ]


# --- tests ---------------------------------------------------------------------------------------------------------
def test_crop_rects_pad_clip_filter_and_map_boxes_back() -> None:
    assert crop_rect((10.0, 20.0, 110.0, 60.0), 0.1, 1000, 1000) == (0, 16, 120, 64)
    assert crop_rect((-5.0, 990.0, 50.0, 1010.0), 0.0, 100, 1000) == (0, 990, 50, 1000)
    assert crop_rect((200.0, 0.0, 300.0, 10.0), 0.0, 100, 100) is None
    cfg = stage_cfg(on_labels=["title"], min_box_px=16, max_crops_per_frame=2, pad=0.0)
    dets = [
        Detection("title", 1, 0.9, (0, 0, 100, 30)),
        Detection("text", 0, 0.9, (0, 0, 500, 500)),  # not a label the stage takes
        Detection("title", 1, 0.9, (0, 100, 10, 130)),  # narrower than min_box_px
        Detection("title", 1, 0.9, (0, 200, 300, 240)),  # the largest: first
        Detection("title", 1, 0.9, (0, 300, 50, 320)),  # the third that fits: over max_crops_per_frame
    ]
    assert [i for i, _ in select(dets, cfg, 640, 480)] == [3, 0]
    # a box on the crop's model pixels → the crop (letterbox transform) → the frame: the crop's offset added
    crop = Transform(0.5, 0.5, 4.0, 0.0, 200, 100)
    mapped = frame_transform(crop, (300, 40, 500, 140), 1000, 800).to_source(np.array([[14.0, 10.0, 54.0, 30.0]]))
    assert mapped.tolist() == [[320.0, 60.0, 400.0, 100.0]]


def test_ctc_decoder_reads_the_recogniser_as_paddleocr_does(rec_onnx: Path, charset: list[str], pages, truth) -> None:
    spec = InputSpec.model_validate(REC_SPEC)
    with pytest.raises(Exception, match="6625 classes in the output, 6624 from the labels"):
        build_decoder(DecoderSpec(type="ctc", params={}), spec, charset, {"y": (4, 120, 6625)})
    titles = [(f, r) for f, regions in truth.items() for r in regions if r["label"] == "title"]
    crops = [cut(pages[f], crop_rect(tuple(r["box"]), 0.1, 816, 1056) or (0, 0, 1, 1)) for f, r in titles[:4]]
    sess = ort.InferenceSession(str(rec_onnx), providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"x": reference_rows(crops, REC_SPEC)})
    dec = Ctc(DecoderSpec(type="ctc", params={"space": True}), spec, charset)
    dec.check({"softmax_11.tmp_0": probs.shape})
    got = dec.read({"softmax_11.tmp_0": probs}, len(crops))
    want = reference_ctc(probs, charset)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
    for (_, r), (text, score) in zip(titles, got, strict=False):
        assert text.strip() == r["text"], (text, r["text"])  # the rendered titles are read exactly
        assert 0.8 < score <= 1.0


def test_cascade_batches_across_cameras_keeps_order_and_equals_direct(
    rec_onnx: Path, charset: list[str], pages, truth
) -> None:
    """Two cameras' results, each with its title: the crops of both go in the same stage batches; each output is
    the recogniser's on that crop run directly; each camera's results come out in its own order."""
    model = rec_model(rec_onnx, charset)
    out: list[StagedResult] = []
    frames = {("a", i): pages[i] for i in range(len(pages))} | {("b", i): pages[-1 - i] for i in range(len(pages))}
    cascade = Cascade([(stage_cfg(), model)], lambda cam, seq: frames.get((cam, seq)), out.append)
    cascade.start()
    try:
        for i in range(len(pages)):
            cascade.submit(result("a", i, (816, 1056), region_dets(truth[i])))
            cascade.submit(result("b", i, (816, 1056), region_dets(truth[len(pages) - 1 - i])))
        wait_until(lambda: len(out) == 2 * len(pages), 120, "every result through the stage")
    finally:
        cascade.join(10)
    for cam in ("a", "b"):
        assert [r.meta.frame for r in out if r.camera == cam] == list(range(len(pages)))
    crops, expected_texts = [], []
    for r in out:
        assert r.stage_versions == {"ocr": "ppocr-rec@1"}
        for d, stages in zip(r.detections, r.stages, strict=True):
            if d.label != "title":
                assert stages == {}
                continue
            rect = crop_rect(d.box, 0.1, 816, 1056)
            assert rect is not None
            crops.append(cut(frames[(r.camera, r.meta.seq)], rect))
            expected_texts.append(stages["ocr"])
    direct = direct_text(rec_onnx, charset, crops)
    for got, (text, score) in zip(expected_texts, direct, strict=True):
        assert got["text"] == text and got["inferred"] is True
        assert got["score"] == pytest.approx(score, abs=2e-3)
    st = cascade.stats()["ocr"]
    assert st["crops"] == len(crops) == 2 * len(pages)
    assert st["batches"] < st["crops"], st  # crops of several results (and both cameras) share batches
    assert st["by_batch"].get(4, 0) >= 1, st


def test_votes_and_reinfer_interval_cut_crops_once_tracks_are_known(rec_onnx: Path, charset: list[str], pages, truth):
    """Tracked titles: read on the track's first frame, then every reinfer_frames frames; the frames between
    carry the track's vote (counted as skipped); a moved box is read again at once."""
    model = rec_model(rec_onnx, charset)
    out: list[StagedResult] = []
    cfg = stage_cfg(reinfer_frames=4, iou_change=0.5)
    page = pages[0]
    title = next(r for r in truth[0] if r["label"] == "title")
    cascade = Cascade([(cfg, model)], lambda cam, seq: page, out.append)
    cascade.start()
    n = 12
    try:
        for i in range(n):
            cascade.submit(result("a", i, (816, 1056), region_dets([title], track=7)))
        wait_until(lambda: len(out) == n, 120, "the tracked results")
        st = cascade.stats()["ocr"]
        assert st["crops"] == 3 and st["skipped_reinfer"] == n - 3, st  # frames 0, 4 and 8
        inferred = [r.stages[0]["ocr"]["inferred"] for r in out]
        assert inferred == [i % 4 == 0 for i in range(n)]
        assert all(r.stages[0]["ocr"]["text"].strip() == title["text"] for r in out)
        assert [r.stages[0]["ocr"]["votes"] for r in out] == [i // 4 + 1 for i in range(n)]
        moved = dict(title, box=[title["box"][0], title["box"][1] + 400, title["box"][2], title["box"][3] + 400])
        cascade.submit(result("a", n, (816, 1056), region_dets([moved], track=7)))
        wait_until(lambda: len(out) == n + 1, 60, "the moved track's result")
        assert out[-1].stages[0]["ocr"]["inferred"] is True  # its box moved: read again before the interval
    finally:
        cascade.join(10)


def test_votes_pick_the_text_read_most_and_mean_labels() -> None:
    v = Votes(reinfer_frames=1, iou_change=0.0, top_k=2)
    v.due("a", 1, (0, 0, 1, 1))
    v.add("a", 1, 1, 0, {"text": "hel1o", "score": 0.6})
    v.add("a", 1, 1, 1, {"text": "hello", "score": 0.9})
    doc = v.add("a", 1, 1, 2, {"text": "hello", "score": 0.8})
    assert doc["text"] == "hello" and doc["score"] == pytest.approx(0.85) and doc["votes"] == 3
    assert v.add("a", 2, 1, 0, {"labels": [["0", 0.9]]})["votes"] == 1  # a track never asked for: the reading alone
    v.due("a", 2, (0, 0, 1, 1))
    doc = v.add("a", 2, 1, 0, {"labels": [["0", 0.9], ["180", 0.1]]})
    doc = v.add("a", 2, 1, 1, {"labels": [["0", 0.3], ["180", 0.7]]})
    assert doc["labels"] == [["0", 0.6], ["180", 0.4]]
    assert v.vote("a", 2, 1, 0) == {"labels": [["0", 0.9], ["180", 0.1]], "votes": 1}  # frame 0: not frame 1's
    assert v.vote("a", 1, 2, 5) is None  # another version's readings never stand in
    v.reset(2)
    assert v.vote("a", 1, 1, 5) is None and len(v) == 0


def test_flip_swaps_between_batches_and_no_result_mixes_versions(
    rec_onnx: Path, charset: list[str], pages, truth
) -> None:
    """A stage swapped while results flow: each result's stage outputs come from the one version it names."""
    model = rec_model(rec_onnx, charset, version=1)
    out: list[StagedResult] = []
    cascade = Cascade([(stage_cfg(reinfer_frames=3), model)], lambda cam, seq: pages[seq % len(pages)], out.append)
    stage = cascade.stage("ocr")
    cascade.start()
    try:
        n = 24
        for i in range(n):
            cascade.submit(result("a", i, (816, 1056), region_dets(truth[i % len(pages)], track=1 + i % 3)))
            if i == n // 2:
                old = stage.flip(rec_model(rec_onnx, charset, version=2), timeout_s=60)
                assert old is model
        wait_until(lambda: len(out) == n, 180, "every result")
    finally:
        cascade.join(10)
    versions = [r.stage_versions["ocr"] for r in out]
    assert versions[0] == "ppocr-rec@1" and versions[-1] == "ppocr-rec@2"
    first_v2 = versions.index("ppocr-rec@2")
    assert set(versions[first_v2:]) == {"ppocr-rec@2"}  # once swapped, never back
    for r in out:
        for stages in r.stages:
            if "ocr" in stages:
                assert stages["ocr"]["votes"] >= 1
    # after the flip each track is read again by v2 (its votes started again): the first v2 results are inferred
    v2 = [r for r in out[first_v2:] if r.stages and any("ocr" in s for s in r.stages)]
    assert v2 and all(s["ocr"]["inferred"] for s in v2[0].stages if "ocr" in s)
    assert model.batches >= 1 and stage.model.batches >= 1


def test_classify_and_detector_stages_on_crops(demo: DemoAssets, pages, truth) -> None:
    """PP-OCR's text-line orientation classifier as a `classify` stage: its top labels equal a direct softmax
    run; the PicoDet layout model as a detector stage on the page's figure crops: its boxes, mapped back, equal
    the model run directly on the crop with the crop's offset added."""
    cls_onnx = raw_model(demo, "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    spec = InputSpec.model_validate(CLS_SPEC)
    backend = OnnxRuntimeBackend(cls_onnx, threads=2)
    decoder = build_decoder(
        DecoderSpec(type="classify", params={"top_k": 2, "activation": "none"}),
        spec,
        ["0", "180"],
        {o.name: o.shape for o in backend.outputs},
    )
    cls = StageModel(backend, decoder, spec, "ppocr-cls", 1)
    layout = demo.packages["picodet-layout"]
    lm = layout.manifest
    lb = OnnxRuntimeBackend(layout.model_path, threads=2)
    ldec = build_decoder(lm.decoder, lm.input, lm.labels, {o.name: o.shape for o in lb.outputs})
    det = StageModel(lb, ldec, lm.input, lm.name, lm.version)
    out: list[StagedResult] = []
    stages = [
        (stage_cfg(name="orientation", on_labels=["title", "header"], top_k=2), cls),
        (stage_cfg(name="layout", on_labels=["figure"], score_threshold=0.3, pad=0.3), det),
    ]
    cascade = Cascade(stages, lambda cam, seq: pages[seq], out.append)
    cascade.start()
    try:
        for i in (0, 2):
            cascade.submit(result("a", i, (816, 1056), region_dets(truth[i])))
        wait_until(lambda: len(out) == 2, 120, "two results")
    finally:
        cascade.join(10)
    sess = ort.InferenceSession(str(cls_onnx), providers=["CPUExecutionProvider"])
    checked = {"orientation": 0, "layout": 0}
    for r in out:
        assert r.stage_versions == {"orientation": "ppocr-cls@1", "layout": "picodet-layout@1"}
        for d, st in zip(r.detections, r.stages, strict=True):
            if "orientation" in st:
                rect = crop_rect(d.box, 0.1, 816, 1056)
                assert rect is not None
                (logits,) = sess.run(None, {"x": reference_rows([cut(pages[r.meta.seq], rect)], CLS_SPEC)})
                probs = logits[0]  # the export ends in its softmax (activation none in the stage)
                order = np.argsort(-probs)
                got = st["orientation"]["labels"]
                assert [g[0] for g in got] == [["0", "180"][k] for k in order]
                assert [g[1] for g in got] == pytest.approx([float(probs[k]) for k in order], abs=2e-3)
                checked["orientation"] += 1
            if "layout" in st:
                rect = crop_rect(d.box, 0.3, 816, 1056)
                assert rect is not None
                crop = cut(pages[r.meta.seq], rect)
                row, tf = layout_row(crop, lm.input)
                outputs = OnnxRuntimeBackend(layout.model_path, threads=2).infer({lm.input.name: np.repeat(row, 4, 0)})
                want = ldec.decode(outputs, [tf], DecodeOptions(score_threshold=0.3))[0]
                got_boxes = st["layout"]["boxes"]
                assert len(got_boxes) == len(want) >= 1
                for g, w in zip(got_boxes, want, strict=True):
                    assert g["label"] == w.label
                    expect = [w.box[0] + rect[0], w.box[1] + rect[1], w.box[2] + rect[0], w.box[3] + rect[1]]
                    assert g["box"] == pytest.approx(expect, abs=0.5)  # rounded to 0.1 px
                checked["layout"] += 1
    assert checked["orientation"] >= 2 and checked["layout"] >= 1, checked


def layout_row(crop: np.ndarray, spec: InputSpec) -> tuple[np.ndarray, Transform]:
    """PicoDet's input spec (stretch, RGB, ImageNet mean/std, NCHW) written out again."""
    _, _, h, w = spec.shape
    rgb = cv2.cvtColor(cv2.resize(crop, (w, h), interpolation=cv2.INTER_LINEAR), cv2.COLOR_BGR2RGB)
    x = (rgb.astype(np.float32) - np.array(spec.mean, np.float32)) / np.array(spec.std, np.float32)
    tf = Transform(w / crop.shape[1], h / crop.shape[0], 0.0, 0.0, crop.shape[1], crop.shape[0])
    return x.transpose(2, 0, 1)[None], tf


def test_result3_payload_bytes_and_schema() -> None:
    """A result with stage outputs goes out as edged.result/3 (the /2 fields unchanged, `stages` per detection,
    `stage_versions`), byte for byte what dumps(result_payload(...)) gives; a plain result stays /2."""
    import jsonschema

    from edged.daemon.delivery.payload import result_bytes, result_payload
    from edged.protocol.schemas import RESULT_SCHEMA, RESULT_SCHEMA_V3, dumps, schema

    dets = [Detection("title", 1, 0.9, (10.0, 20.0, 300.0, 52.0), 3), Detection("text", 0, 0.8, (0.0, 0.0, 9.0, 9.0))]
    plain = result("desk", 4, (816, 1056), dets)
    ocr = {"text": "Fixed batch", "score": 0.97, "votes": 2, "inferred": False}
    stages: tuple[dict[str, Any], ...] = ({"ocr": ocr}, {})
    staged = StagedResult(**{k: getattr(plain, k) for k in plain.__dataclass_fields__}, stages=stages,
                          stage_versions={"ocr": "ppocr-rec@1"})  # fmt: skip
    doc = result_payload(staged, "dev", "0" * 32, 7)
    assert doc["schema"] == RESULT_SCHEMA_V3 and doc["stage_versions"] == {"ocr": "ppocr-rec@1"}
    assert doc["detections"][0]["stages"] == stages[0] and "stages" not in doc["detections"][1]
    jsonschema.validate(doc, schema(RESULT_SCHEMA_V3))
    assert result_bytes(staged, "dev", "0" * 32, 7) == dumps(doc)
    old = result_payload(plain, "dev", "0" * 32, 7)
    assert old["schema"] == RESULT_SCHEMA and "stage_versions" not in old
    assert {k: v for k, v in doc.items() if k not in ("schema", "stage_versions")} | {
        "detections": [{k: v for k, v in d.items() if k != "stages"} for d in doc["detections"]]
    } == {k: v for k, v in old.items() if k != "schema"}
    assert result_bytes(plain, "dev", "0" * 32, 7) == dumps(old)
    bad = dict(doc, detections=[dict(doc["detections"][0], stages={"ocr": {"text": 1, "inferred": True}})])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema(RESULT_SCHEMA_V3))


def test_a_failing_stage_lets_results_go_on_counted(rec_onnx: Path, charset: list[str], pages, truth) -> None:
    """A stage batch that fails (here: the stage's spec names an input the model does not have) is logged and
    counted; its results go on without the stage's output, in order, and the stage keeps serving."""
    good = rec_model(rec_onnx, charset)
    broken = StageModel(good.backend, good.decoder, good.spec.model_copy(update={"name": "nope"}), "ppocr-rec", 9)
    out: list[StagedResult] = []
    cascade = Cascade([(stage_cfg(), broken)], lambda cam, seq: pages[seq], out.append)
    cascade.start()
    try:
        for i in range(3):
            cascade.submit(result("a", i, (816, 1056), region_dets(truth[i])))
        wait_until(lambda: len(out) == 3, 60, "the results, without the stage")
        assert cascade.stats()["ocr"]["errors"] >= 1 and broken.errors >= 1
        assert [r.meta.frame for r in out] == [0, 1, 2]
        assert all("ocr" not in s for r in out for s in r.stages)
        cascade.stage("ocr").flip(good)
        cascade.submit(result("a", 3, (816, 1056), region_dets(truth[3])))
        wait_until(lambda: len(out) == 4, 60, "a result read by the good version")
        assert any("ocr" in s for s in out[-1].stages) and out[-1].stage_versions == {"ocr": "ppocr-rec@1"}
    finally:
        cascade.join(10)


def test_stages_config_is_checked_at_load(tmp_path: Path) -> None:
    import yaml

    from edged.daemon.config import load_config
    from edged.errors import ConfigError

    def doc(**stage: Any) -> Path:
        path = tmp_path / "c.yaml"
        base = {"name": "ocr", "model": {"package": "ocr-v1"}, "on_labels": ["title"], **stage}
        cfg = {
            "device_id": "d1",
            "model": {"package": "layout-v1"},
            "cameras": [{"name": "desk", "uri": "file:///x.mp4"}],
            "stages": [base, *([dict(base, name="ocr2")] if stage.get("name") != "ocr" else [])],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    cfg = load_config(doc())
    assert [s.name for s in cfg.stages] == ["ocr", "ocr2"]
    assert cfg.stages[0].model.package == tmp_path / "ocr-v1"  # relative to the config file, as model.package
    assert cfg.stages[0].reinfer_frames == 10 and cfg.stages[0].pad == 0.1
    with pytest.raises(ConfigError, match="no such camera: hall"):
        load_config(doc(cameras=["hall"]))
    with pytest.raises(ConfigError, match=r"stages\[0\]\.on_labels: List should have at least 1 item"):
        load_config(doc(on_labels=[]))
    with pytest.raises(ConfigError, match=r"stages\[0\]\.reinfer_every: unknown key"):
        load_config(doc(reinfer_every=3))


def test_a_stage_model_counts_the_crops_it_said_something_of(rec_onnx: Path, charset: list[str], pages, truth):
    """What a stage's probation judges (daemon/cascade/swap.py): each crop run, and whether its output said
    anything, as the published outputs show; and its cost per crop."""
    model = rec_model(rec_onnx, charset)
    out: list[StagedResult] = []
    frames = {("a", i): pages[i] for i in range(len(pages))}
    cascade = Cascade([(stage_cfg(), model)], lambda cam, seq: frames.get((cam, seq)), out.append)
    cascade.start()
    try:
        for i in range(len(pages)):
            cascade.submit(result("a", i, (816, 1056), region_dets(truth[i])))
        wait_until(lambda: len(out) == len(pages), 120, "every result through the stage")
    finally:
        cascade.join(10)
    texts = [s["ocr"]["text"] for r in out for s in r.stages if "ocr" in s]
    fig = model.recent_output(1000)
    assert fig.rows == len(texts) == model.crops
    assert fig.detections == sum(bool(t.strip()) for t in texts) > 0
    assert model.recent_output(2).rows == 2
    assert model.crop_ms.percentiles((50,))["p50"] > 0
