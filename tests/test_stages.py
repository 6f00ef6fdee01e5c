"""A cascade's second stage as a real model: PP-OCRv4's text recogniser (RapidOCR's `rapidocr-onnxruntime==1.4.4`
wheel, pinned) behind the PicoDet layout detector on the demo's document pages.

- `fetch-demo` packages it (`ppocr-rec`: CTC, its charset from the ONNX metadata, fixed batches 1 and B, role
  stage) and the package computes what the export computes, on values;
- `edged model init` recognises the raw export (and a classifier) as a secondary model and packages it;
- the documents' ground truth carries each region's text, and a cascade made of the two packages reads the
  titles PicoDet finds with a measured character accuracy;
- a stage is admitted to the memory budget on top of the primary and the stages before it, or refused naming
  the stage and the figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.cascade.crops import crop_rect, cut
from edged.daemon.cascade.loader import buffers_mb, open_stages, primary_mb
from edged.daemon.config import Config, load_config
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.daemon.decoders.ctc import Ctc
from edged.daemon.lifecycle.admission import activation_mb, estimate_mb
from edged.errors import DecoderError, EngineLoadError
from edged.models.demo import PPOCR_REC_SIZE, DemoAssets
from edged.models.demo.documents import render_page
from edged.models.package import Package, read_labels, verify_folder, write_package

from .conftest import base_config, edged_cli, write_config

REC_RAW = "ch_PP-OCRv4_rec_infer.onnx"


def levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[len(b)]


def char_accuracy(pairs: list[tuple[str, str]]) -> float:
    """1 - CER over (recognised, truth) pairs: edit distance summed over the truths' characters. The ends of a
    recognised line are stripped (the crop's padding reads as a space at either end)."""
    errors = sum(levenshtein(got.strip(), truth) for got, truth in pairs)
    return 1 - errors / sum(len(truth) for _, truth in pairs)


def _charset(raw: Path) -> list[str]:
    props = {p.key: p.value for p in onnx.load(str(raw), load_external_data=False).metadata_props}
    return str(props["character"]).splitlines()


def _row(spec: Any, crop: np.ndarray) -> np.ndarray:
    pre = Preprocessor(spec)
    row = pre.new_row()
    pre.run(crop, row)
    return row


def _title_crops(demo: DemoAssets, frames: int) -> list[tuple[np.ndarray, str]]:
    """The first `frames` frames' title crops (the ground truth's boxes, the stage's default pad 0.1)."""
    truth = json.loads(demo.documents_truth.read_text())["frames"]
    cap = cv2.VideoCapture(str(demo.documents))
    out = []
    for i in range(frames):
        ok, frame = cap.read()
        assert ok
        title = next(r for r in truth[i]["regions"] if r["label"] == "title")
        rect = crop_rect(tuple(title["box"]), 0.1, frame.shape[1], frame.shape[0])
        assert rect is not None
        out.append((cut(frame, rect), title["text"]))
    cap.release()
    return out


def test_fetch_demo_makes_the_recogniser_a_stage_package(demo: DemoAssets) -> None:
    pkg = demo.packages["ppocr-rec"]
    m = pkg.manifest
    raw = demo.root / "raw" / REC_RAW
    assert m.role == "stage"
    assert m.decoder.type == "ctc" and m.decoder.params == {"blank": 0, "space": True}
    assert m.input.shape == [4, 3, PPOCR_REC_SIZE[1], PPOCR_REC_SIZE[0]] and sorted(pkg.batch_paths) == [1, 4]
    assert (m.input.color, m.input.letterbox, m.input.pad_value) == ("BGR", "topleft", 128)
    # the charset: every line of the metadata's `character`, as a labels file reads it (stripped)
    assert pkg.labels == [c.strip() for c in _charset(raw)] and len(pkg.labels) == 6623
    assert m.source["sha256"] == "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
    # on values: each fixed batch gives, row for row, what the export (dynamic batch and width) gives for that crop
    crops = _title_crops(demo, 4)
    rows = np.stack([_row(m.input, c) for c, _ in crops])
    export = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])
    want = np.concatenate([export.run(None, {"x": r[None]})[0] for r in rows])
    for b, path in pkg.batch_paths.items():
        got = np.concatenate([OnnxRuntimeBackend(path, threads=1).infer({"x": rows[i : i + b]})["softmax_11.tmp_0"]
                              for i in range(0, 4, b)])  # fmt: skip
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    # and PaddleOCR's CTC reading of those outputs is the title drawn (a decoder that read labels one off fails)
    dec = build_decoder(m.decoder, m.input, pkg.labels, {"softmax_11.tmp_0": tuple(want.shape)})
    assert isinstance(dec, Ctc)
    assert [t.strip() for t, _ in dec.read({"softmax_11.tmp_0": want}, 4)] == [t for _, t in crops]


def test_documents_truth_records_the_text_of_each_region(demo: DemoAssets) -> None:
    truth = json.loads(demo.documents_truth.read_text())
    raw = demo.root / "raw"
    photos: dict[str, np.ndarray] = {}
    for n in ("astronaut.png", "coffee.png", "camera.png", "grace_hopper.jpg"):
        photo = cv2.imread(str(raw / n))
        assert photo is not None
        photos[n] = photo
    for frame in truth["frames"][::2]:
        _, regions = render_page(photos, frame["page"])
        assert frame["regions"] == regions
        by = {r["label"]: r["text"] for r in regions}
        assert by["footer"] == f"page {frame['page'] + 1}" and by["figure"] == ""
        text_lines = [r["text"] for r in regions if r["label"] == "text"]
        assert all(len(block.splitlines()) >= 3 for block in text_lines)


def test_model_init_recognises_the_rapidocr_export_as_a_ctc_stage(demo: DemoAssets, tmp_path: Path) -> None:
    raw = demo.root / "raw" / REC_RAW
    out = tmp_path / "rec"
    r = edged_cli("model", "init", str(raw), "--out", str(out), "--batch", "1,2", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "decoder ctc" in r.stdout and "charset of 6623 characters" in r.stdout, r.stdout
    assert "PP-OCR's recogniser input 3x48x320" in r.stdout
    pkg = verify_folder(out)
    m = pkg.manifest
    assert m.role == "stage" and m.decoder.type == "ctc" and m.decoder.params["space"] is True
    assert m.input.shape == [2, 3, 48, 320] and sorted(pkg.batch_paths) == [1, 2]
    assert read_labels(out / "labels.txt") == [c.strip() for c in _charset(raw)]
    assert (m.input.color, m.input.scale, m.input.mean, m.input.std) == ("BGR", 1 / 255, [0.5] * 3, [0.5] * 3)
    # the short title fits 320 wide: the package made here reads it as the demo's does
    crop, text = _title_crops(demo, 6)[4]  # "Results over MQTT"
    backend = OnnxRuntimeBackend(pkg.batch_paths[1], threads=1)
    spec = m.input.model_copy(update={"shape": [1, 3, 48, 320]})
    dec = build_decoder(m.decoder, spec, pkg.labels, {o.name: o.shape for o in backend.outputs})
    assert isinstance(dec, Ctc)
    assert dec.read(backend.infer({"x": _row(spec, crop)[None]}), 1)[0][0].strip() == text


def _classifier(path: Path, classes: int) -> None:
    """A small real classifier: mean colour -> linear -> softmax, input [N, 3, 32, 32] (dynamic N)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(3, classes)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(classes,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "colour",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_model_init_packages_a_classifier_as_a_stage(tmp_path: Path) -> None:
    src = tmp_path / "colour.onnx"
    _classifier(src, 4)
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\ngrey\n")
    out = tmp_path / "colour"
    r = edged_cli("model", "init", str(src), "--out", str(out), "--labels", str(tmp_path / "labels.txt"))
    assert r.returncode == 0, r.stdout + r.stderr
    m = verify_folder(out).manifest
    assert (m.role, m.decoder.type, m.labels) == ("stage", "classify", ["red", "green", "blue", "grey"])


def test_a_detector_package_has_no_role(demo: DemoAssets) -> None:
    for name in ("picodet-layout", "blazeface-back"):
        pkg = demo.packages[name]
        assert pkg.manifest.role is None and "role" not in json.loads(pkg.manifest_bytes)


def iou(a: tuple[float, ...] | list[float], b: tuple[float, ...] | list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def cascade_by_hand(demo: DemoAssets, step: int, score_threshold: float = 0.3) -> tuple[list[tuple[str, str]], int]:
    """The cascade with the daemon's own parts (PicoDet's decoder, the stage's crops at pad 0.1 and its
    preprocessing, the ctc decoder) over every `step`-th frame of the documents video, PicoDet's fixed batch
    filled with frames: per frame, the title detection that best overlaps the true title (IoU >= 0.3),
    recognised -> (recognised, true text) pairs, and the frames looked at."""
    layout, rec = demo.packages["picodet-layout"], demo.packages["ppocr-rec"]
    lspec = layout.manifest.input
    lback = OnnxRuntimeBackend(layout.batch_paths[lspec.batch], threads=1)
    ldec = build_decoder(layout.manifest.decoder, lspec, layout.labels, {o.name: o.shape for o in lback.outputs})
    rspec = rec.manifest.input
    rback = OnnxRuntimeBackend(rec.batch_paths[rspec.batch], threads=1)
    rdec = build_decoder(rec.manifest.decoder, rspec, rec.labels, {o.name: o.shape for o in rback.outputs})
    assert isinstance(rdec, Ctc)
    truth = json.loads(demo.documents_truth.read_text())["frames"]
    cap = cv2.VideoCapture(str(demo.documents))
    frames: list[tuple[np.ndarray, dict[str, Any]]] = []
    for i, frame_truth in enumerate(truth):
        ok, frame = cap.read()
        assert ok
        if i % step == 0:
            frames.append((frame, next(r for r in frame_truth["regions"] if r["label"] == "title")))
    cap.release()
    lpre = Preprocessor(lspec)
    opts = DecodeOptions(score_threshold=score_threshold, iou_threshold=0.5, max_detections=100)
    crops: list[tuple[np.ndarray, str]] = []
    for at in range(0, len(frames), lspec.batch):
        group = frames[at : at + lspec.batch]
        x = np.zeros(lspec.shape, np.float32)
        ts = [lpre.run(frame, x[k]) for k, (frame, _) in enumerate(group)]
        for (frame, title), found in zip(group, ldec.decode(lback.infer({lspec.name: x}), ts, opts), strict=True):
            titles = [d for d in found if d.label == "title"]
            best = max(titles, key=lambda d: iou(d.box, title["box"]), default=None)
            if best is None or iou(best.box, title["box"]) < 0.3:
                continue
            rect = crop_rect(best.box, 0.1, frame.shape[1], frame.shape[0])
            assert rect is not None
            crops.append((cut(frame, rect), title["text"]))
    pairs: list[tuple[str, str]] = []
    for at in range(0, len(crops), rspec.batch):
        chunk = crops[at : at + rspec.batch]
        x = np.zeros(rspec.shape, np.float32)
        for k, (crop, _) in enumerate(chunk):
            x[k] = _row(rspec, crop)
        pairs += [
            (text, t) for (text, _), (_, t) in zip(rdec.read(rback.infer({"x": x}), len(chunk)), chunk, strict=True)
        ]
    return pairs, len(frames)


def titles_read(demo: DemoAssets, step: int) -> None:
    """Stage alone (the true title boxes) and the cascade (the boxes PicoDet finds): character accuracy of the
    recognised titles against the drawn text."""
    rec = demo.packages["ppocr-rec"]
    rspec = rec.manifest.input.model_copy(update={"shape": [1, *rec.manifest.input.shape[1:]]})
    rback = OnnxRuntimeBackend(rec.batch_paths[1], threads=1)
    rdec = build_decoder(rec.manifest.decoder, rspec, rec.labels, {o.name: o.shape for o in rback.outputs})
    assert isinstance(rdec, Ctc)
    crops = _title_crops(demo, 10)[::step]
    alone = char_accuracy([(rdec.read(rback.infer({"x": _row(rspec, c)[None]}), 1)[0][0], t) for c, t in crops])
    pairs, frames = cascade_by_hand(demo, step)
    found = char_accuracy(pairs)
    print(f"\ntitles: the recogniser on the true boxes {alone:.4f}; the cascade on PicoDet's {found:.4f} over "
          f"{len(pairs)}/{frames} titles found")  # fmt: skip
    assert alone >= 0.9
    assert len(pairs) >= 0.6 * frames and found >= 0.6, pairs


def test_picodet_then_ppocr_reads_the_titles_it_finds(demo: DemoAssets) -> None:
    titles_read(demo, step=2)  # one frame of each page


@pytest.mark.slow
def test_picodet_then_ppocr_reads_every_frames_title(demo: DemoAssets) -> None:
    titles_read(demo, step=1)


def _config(tmp_path: Path, demo: DemoAssets, stages: list[dict[str, Any]], budget_mb: float) -> Config:
    cams = [{"name": "scanner", "uri": f"file://{demo.documents}", "realtime": False}]
    doc = base_config(SimpleNamespace(host="127.0.0.1", port=1883), demo, tmp_path, cams)
    doc["model"] = {"package": str(demo.packages["picodet-layout"].root), "onnxruntime": {"threads": 1}}
    doc["stages"] = stages
    doc["memory"] = {"budget_mb": budget_mb}
    return load_config(write_config(tmp_path / "c.yaml", doc))


def _stage(name: str, demo: DemoAssets) -> dict[str, Any]:
    pkg = demo.packages["ppocr-rec"].root
    return {"name": name, "model": {"package": str(pkg), "onnxruntime": {"threads": 1}}, "on_labels": ["title"]}


def test_stages_are_admitted_on_top_of_the_primary_or_refused_by_name(demo: DemoAssets, tmp_path: Path) -> None:
    primary: Package = demo.packages["picodet-layout"]
    cfg = _config(tmp_path, demo, [_stage("ocr", demo)], 100_000)
    (opened,) = open_stages(cfg, primary, in_use_mb=300.0)
    try:
        assert opened.package.ref == "ppocr-rec@1" and isinstance(opened.decoder, Ctc)
        files_mb = sum(p.stat().st_size for p in opened.package.batch_paths.values()) / 2**20
        assert opened.estimate_mb > files_mb  # the weights of both batches and more: I/O, activations, crops
        est = opened.estimate_mb
    finally:
        opened.backend.close()
    base = 300.0 + primary_mb(cfg, primary)
    assert primary_mb(cfg, primary) > activation_mb(primary) > 0  # the primary's working memory and frame buffers
    # one stage over the budget: refused before anything of it loads, naming the stage and the figures
    cfg = _config(tmp_path, demo, [_stage("ocr", demo)], base + est / 2)
    with pytest.raises(EngineLoadError, match=r"stage 'ocr' \(ppocr-rec@1\) does not fit the memory budget") as exc:
        open_stages(cfg, primary, in_use_mb=300.0)
    assert "300.0 MB in use (the primary picodet-layout@1 loaded), " in str(exc.value)
    assert f"over memory.budget_mb {base + est / 2:.0f} MB" in str(exc.value) and exc.value.code == "over_budget"
    # two stages: the first fits, the second counts it and does not
    cfg = _config(tmp_path, demo, [_stage("ocr", demo), _stage("ocr2", demo)], base + est * 1.5)
    with pytest.raises(EngineLoadError, match=r"stage 'ocr2' .* and \d+\.\d MB of the stages before it") as exc:
        open_stages(cfg, primary, in_use_mb=300.0)


def test_a_real_start_refuses_the_stage_that_does_not_fit(
    broker: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """`edged run` with a budget the primary fits and the recogniser stage does not: the start fails, naming the
    stage, its figure, what is in use and the budget. The budget is set from what this daemon has in use before
    any model (read from the primary's own refusal with a 1 MB budget), so it holds on any machine."""
    layout, rec = demo.packages["picodet-layout"], demo.packages["ppocr-rec"]
    cams = [{"name": "scanner", "uri": f"file://{demo.documents}", "realtime": False}]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["model"] = {"package": str(layout.root), "onnxruntime": {"threads": 1}}
    doc["stages"] = [_stage("ocr", demo)]
    doc["memory"] = {"budget_mb": 1}
    d = start_daemon(write_config(tmp_path / "tiny.yaml", doc))
    assert d.proc.wait(120) != 0
    m = re.search(r"model picodet-layout@1 does not fit .* on top of (\d+\.\d) MB in use", d.output())
    assert m, d.output()[-3000:]
    start_mb = float(m.group(1))
    spec = layout.manifest.input
    frame_buffers = int(np.prod(spec.shape[1:])) * 4 * (3 + 2 * spec.batch) / 2**20
    stage_mb = estimate_mb(rec) + buffers_mb(rec)
    assert stage_mb > 50
    budget = start_mb + estimate_mb(layout) + frame_buffers + stage_mb / 2
    doc["memory"] = {"budget_mb": budget}
    d = start_daemon(write_config(tmp_path / "small.yaml", doc))
    assert d.proc.wait(180) != 0
    out = d.output()
    m = re.search(
        r"stage 'ocr' \(ppocr-rec@1\) does not fit the memory budget: (\d+\.\d) MB \(weights, I/O, activations and "
        r"crop buffers\) on top of (\d+\.\d) MB in use \(the primary picodet-layout@1 loaded\), (\d+\.\d) MB of the "
        r"primary's activations and frame buffers and 0\.0 MB of the stages before it = (\d+\.\d) MB, over "
        r"memory.budget_mb (\d+) MB",
        out,
    )
    assert m, out[-3000:]
    assert float(m.group(1)) == pytest.approx(stage_mb, abs=0.1)
    assert float(m.group(2)) > start_mb  # the primary's weights are loaded ...
    assert float(m.group(3)) == pytest.approx(activation_mb(layout) + frame_buffers, abs=0.1)  # ... and it is counted
    assert int(m.group(5)) == round(budget)
    assert "Traceback" not in out


def test_a_stage_whose_outputs_do_not_fit_its_decoder_is_refused_by_name(demo: DemoAssets, tmp_path: Path) -> None:
    """A stage package whose manifest drops PP-OCR's space class: its ctc decoder counts one class fewer than the
    model gives; the start is refused naming the stage, and nothing stays open."""
    rec = demo.packages["ppocr-rec"]
    fields = json.loads(rec.manifest_bytes)
    del fields["files"]
    fields["decoder"]["params"]["space"] = False
    files = {name: rec.root / name for name in rec.manifest.files}
    write_package(tmp_path / "bad-ocr", fields, files)
    stage = _stage("ocr", demo) | {"model": {"package": str(tmp_path / "bad-ocr")}}
    cfg = _config(tmp_path, demo, [stage], 100_000)
    with pytest.raises(DecoderError, match=r"^stage 'ocr': ctc: 6625 classes in the output, 6624 from the labels"):
        open_stages(cfg, demo.packages["picodet-layout"], in_use_mb=300.0)


def test_a_stage_named_from_the_store_is_the_installed_signed_package(
    demo: DemoAssets, tmp_path: Path, signer: Any
) -> None:
    """`stages[i].model.name`: the store's current version of that name (installed signed, as `edged model install`
    does), opened as the primary's model.name is."""
    from edged.models.package import pack_tar
    from edged.models.signing import TrustStore
    from edged.models.store import Store

    rec = demo.packages["ppocr-rec"]
    tar = pack_tar(rec, tmp_path / "ocr.tar", signer.sign(rec.manifest_bytes))
    stage = _stage("ocr", demo) | {"model": {"name": "ppocr-rec", "keys_dir": str(tmp_path / "trusted")}}
    cfg = _config(tmp_path, demo, [stage], 100_000)
    Store(cfg.state_dir, keep=3).install(tar, TrustStore.load(tmp_path / "trusted"), progress=lambda m: None)
    (opened,) = open_stages(cfg, demo.packages["picodet-layout"], in_use_mb=300.0)
    try:
        assert opened.package.ref == "ppocr-rec@1"
        assert opened.package.root.resolve().is_relative_to((cfg.state_dir / "models" / "ppocr-rec").resolve())
    finally:
        opened.backend.close()


def test_a_stage_package_named_as_the_primary_is_a_config_error(
    broker: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """The recogniser (role: stage) under `model:`: the start is refused saying where it belongs, before it loads."""
    cams = [{"name": "scanner", "uri": f"file://{demo.documents}", "realtime": False}]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["model"] = {"package": str(demo.packages["ppocr-rec"].root)}
    d = start_daemon(write_config(tmp_path / "rec.yaml", doc))
    assert d.proc.wait(120) == 1
    out = d.output()
    assert "model: ppocr-rec@1 is a second-stage model (role: stage, decoder ctc)" in out, out[-3000:]
    assert "under stages:" in out and "Traceback" not in out
