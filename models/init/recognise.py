"""Which decoder reads a model, and how its input is fed: decided from the output shapes and metadata.

`edged model init` calls `detect` once the input is fixed (so every output shape is concrete). Each
decision comes with its reason, and each guess with what the user should check, because shapes
alone cannot tell everything (the colour order a model was trained on, for one).

| outputs (B batch, H x W input)                        | decoder       | preprocessing default        |
|-------------------------------------------------------|---------------|------------------------------|
| one [B, 4+C, A], A = cells at strides 8/16/32         | yolov8        | RGB /255, letterbox, pad 114 |
| one [B, A, 4+C] with Ultralytics metadata             | yolov8 (T)    | RGB /255, letterbox, pad 114 |
| one [B, 3A, 5+C] (3 anchors per cell)                 | yolov5        | RGB /255, letterbox, pad 114 |
| one [B, A, 5+C], A = cells, no Ultralytics metadata   | yolox         | BGR 0-255, top-left, pad 114 |
| one [B, K, 6] or num_dets/det_boxes/...               | efficient_nms | RGB /255, letterbox, pad 114 |
| n [B, N_s, C] + n [B, N_s, 4(reg_max+1)]              | picodet       | RGB ImageNet mean/std, stretch |
| pairs [B, N, 1] + [B, N, >=4], N = cells^2 x anchors  | ssd_anchors   | RGB to [-1, 1], letterbox    |
| one [B, C]                                            | classify      | RGB ImageNet mean/std, stretch |
| one [B, T, C] + a charset (`character`) of C-1 or C-2 | ctc           | BGR (x/255-0.5)/0.5, top-left, pad 128 |

The last two are **secondary** models (the stages of a cascade: run on crops of the primary's detections), and
their packages say so (`role: stage`). A CTC text recogniser (PP-OCR's, RapidOCR's exports) carries its
charset in the ONNX metadata key ``character`` (one character per line): class 0 is the CTC blank, 1..N the
charset, and N+1 a space when the output has one class more (PaddleOCR's ``use_space_char``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edged.errors import Code, PackageError

Shapes = dict[str, tuple[int, ...]]

# The one list of decoder names, in the order `edged model init --decoder` lists them: the daemon's registry
# (edged.daemon.decoders.DECODERS) has one row per name and no other (tests/test_decoder_names.py), and the
# command line's help is made from it. Here, not in the daemon, because models/ may not import the daemon.
DECODERS = ("yolov8", "yolov5", "yolox", "efficient_nms", "picodet", "ssd_anchors", "classify", "ctc")
# decoders of secondary models: what they read are crops of another model's detections (a cascade's stages)
STAGE_DECODERS = frozenset({"classify", "ctc"})

_ULTRA = {
    "color": "RGB",
    "scale": 1 / 255,
    "mean": [0.0] * 3,
    "std": [1.0] * 3,
    "resize": "letterbox",
    "pad_value": 114,
}
_IMAGENET = {"color": "RGB", "scale": 1.0, "mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375]}
PREPROCESS: dict[str, dict[str, Any]] = {
    "yolov8": _ULTRA,
    "yolov5": _ULTRA,
    "efficient_nms": _ULTRA,
    "yolox": {
        "color": "BGR",
        "scale": 1.0,
        "mean": [0.0] * 3,
        "std": [1.0] * 3,
        "resize": "letterbox",
        "pad_value": 114,
        "letterbox": "topleft",
    },
    "picodet": {**_IMAGENET, "resize": "stretch", "pad_value": 0},
    "ssd_anchors": {
        "color": "RGB",
        "scale": 1.0,
        "mean": [127.5] * 3,
        "std": [127.5] * 3,
        "resize": "letterbox",
        "pad_value": 0,
    },
    "classify": {**_IMAGENET, "resize": "stretch", "pad_value": 0},
    # PP-OCR's recogniser (rapidocr's TextRecognizer.resize_norm_img): cv2's BGR as read, (x/255 - 0.5)/0.5,
    # resized to the input height keeping the aspect, at the left of a canvas padded with 0 after normalising
    # (pixel 127.5: 128 is the nearest grey)
    "ctc": {
        "color": "BGR",
        "scale": 1 / 255,
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "resize": "letterbox",
        "pad_value": 128,
        "letterbox": "topleft",
    },
}
PREPROCESS_WHY = {
    "yolov8": "Ultralytics' predictor: RGB scaled to 0-1, letterboxed onto 114 grey",
    "yolov5": "Ultralytics' predictor: RGB scaled to 0-1, letterboxed onto 114 grey",
    "efficient_nms": "an end-to-end Ultralytics/TensorRT export: RGB scaled to 0-1, letterboxed onto 114 grey",
    "yolox": "YOLOX's own preproc: raw 0-255 BGR, resized into the top left of a 114 grey canvas",
    "picodet": "PaddleDetection's PicoDet: RGB, ImageNet mean/std, resized without keeping the aspect",
    "ssd_anchors": "MediaPipe's BlazeFace: RGB scaled to [-1, 1]",
    "classify": "a torchvision-style classifier: RGB, ImageNet mean/std",
    "ctc": "PP-OCR's recogniser: BGR, (x/255 - 0.5)/0.5, kept aspect at the left, padded with mid grey",
}


@dataclass
class Detected:
    decoder: str
    params: dict[str, Any]
    classes: int | None  # classes in the output, where the decoder has a class axis
    why: str
    checks: list[str] = field(default_factory=list)


def cells(height: int, width: int, strides: tuple[int, ...] = (8, 16, 32), ceil: bool = False) -> int:
    if ceil:
        return sum(math.ceil(height / s) * math.ceil(width / s) for s in strides)
    return sum((height // s) * (width // s) for s in strides)


def detect(
    shapes: Shapes,
    height: int,
    width: int,
    ultralytics: bool,
    forced: str | None = None,
    charset: list[str] | None = None,
) -> Detected:
    """The decoder for these output shapes (`forced`: the user's choice, still checked for fit). `charset`: the
    metadata's ``character`` lines, when the export has them (a CTC recogniser's)."""
    if forced is not None and forced not in DECODERS:
        raise PackageError(f"--decoder {forced!r} is not one of {', '.join(DECODERS)}", code=Code.INIT_FAILED)
    found = _ctc(shapes, charset, forced == "ctc") or _by_shape(shapes, height, width, ultralytics)
    if forced is None:
        if found is None:
            raise PackageError(
                f"no decoder recognises these outputs {_show(shapes)} for a {width}x{height} input; give --decoder "
                f"({', '.join(DECODERS)}) and check the decoder's params in the manifest",
                code=Code.INIT_FAILED,
            )
        return found
    if found is not None and found.decoder == forced:
        found.why = f"--decoder {forced} (the output shapes agree: {found.why})"
        return found
    params: dict[str, Any] = {}
    if forced == "yolox" and len(shapes) == 1:
        shape = next(iter(shapes.values()))
        p6 = len(shape) == 3 and shape[1] == cells(height, width, (8, 16, 32, 64))
        params = {"strides": [8, 16, 32, 64]} if p6 else {}
    what = f"the shapes suggested {found.decoder}" if found else "no decoder recognised the shapes"
    return Detected(forced, params, None, f"--decoder {forced} ({what}; the daemon's check decides whether it fits)")


def _by_shape(shapes: Shapes, h: int, w: int, ultralytics: bool) -> Detected | None:
    names = list(shapes)
    if len(names) == 1:
        return _single(names[0], shapes[names[0]], h, w, ultralytics)
    nms_names = {"num_dets", "det_boxes", "det_scores", "det_classes"}
    if nms_names <= set(names):
        k = shapes["det_boxes"][1]
        return Detected("efficient_nms", {}, None, f"outputs {sorted(nms_names)} (TensorRT EfficientNMS, top {k})")
    picodet = _picodet(shapes, h, w)
    return picodet or _ssd(shapes, h, w)


def _single(name: str, shape: tuple[int, ...], h: int, w: int, ultralytics: bool) -> Detected | None:
    a3 = cells(h, w)
    if len(shape) == 2:
        return Detected("classify", {}, shape[1], f"one output {list(shape)}: [B, C] class scores")
    if len(shape) != 3:
        return None
    _, d1, d2 = shape
    if d2 == a3 and d1 >= 5:
        return Detected(
            "yolov8", {}, d1 - 4, f"one output {list(shape)}: [B, 4+C, A] with A = {a3} cells at strides 8/16/32"
        )
    if d1 == 3 * a3 and d2 >= 6:
        return Detected("yolov5", {}, d2 - 5, f"one output {list(shape)}: [B, A, 5+C], A = 3 anchors x {a3} cells")
    for strides in ((8, 16, 32), (8, 16, 32, 64)):
        if d1 == cells(h, w, strides) and d2 >= 5:
            if ultralytics:
                return Detected(
                    "yolov8",
                    {"transposed": True},
                    d2 - 4,
                    f"one output {list(shape)}: [B, A, 4+C] (transposed) and Ultralytics metadata",
                )
            if d2 < 6:
                return None
            params = {} if len(strides) == 3 else {"strides": list(strides)}
            return Detected(
                "yolox",
                params,
                d2 - 5,
                f"one output {list(shape)}: [B, A, 5+C] with A = {d1} grid cells at strides "
                f"{'/'.join(map(str, strides))} (one per cell: YOLOX's anchor-free head) and no Ultralytics metadata",
                [
                    "a transposed YOLOv8 head [B, A, 4+C] has this shape too; without Ultralytics metadata this is "
                    "read as YOLOX (raw offsets + objectness): if the boxes are nonsense, use --decoder yolov8"
                ],
            )
    if d2 == 6 and d1 < a3:
        return Detected("efficient_nms", {"output": name}, None, f"one output {list(shape)}: [B, K, 6] with NMS done")
    return None


def _picodet(shapes: Shapes, h: int, w: int) -> Detected | None:
    names = list(shapes)
    if len(names) % 2 or len(names) < 2 or any(len(s) != 3 for s in shapes.values()):
        return None
    n = len(names) // 2
    scores, boxes = names[:n], names[n:]
    strides = [8, 16, 32, 64, 128][:n]
    for i, s in enumerate(strides):
        want = math.ceil(h / s) * math.ceil(w / s)
        if shapes[scores[i]][1] != want or shapes[boxes[i]][1] != want:
            return None
    classes = {shapes[x][2] for x in scores}
    dist = {shapes[x][2] for x in boxes}
    if len(classes) != 1 or len(dist) != 1 or next(iter(dist)) % 4:
        return None
    reg_max = next(iter(dist)) // 4 - 1
    return Detected(
        "picodet",
        {"strides": strides, "reg_max": reg_max},
        next(iter(classes)),
        f"{2 * n} outputs: {n} score maps [B, N, C] and {n} distributions [B, N, 4 x {reg_max + 1}] with N = "
        f"the cells at strides {'/'.join(map(str, strides))} (PicoDet / GFL)",
    )


def _ssd(shapes: Shapes, h: int, w: int) -> Detected | None:
    """MediaPipe-style SSD: score outputs [B, N, 1] paired with box outputs [B, N, >=4] of the same N;
    each N is the largest square grid (input / 8, / 16, ...) times a whole number of anchors."""
    if h != w or any(len(s) != 3 for s in shapes.values()):
        return None
    scores = [n for n, s in shapes.items() if s[2] == 1]
    boxes = [n for n, s in shapes.items() if s[2] >= 4]
    if not scores or len(scores) != len(boxes) or len(scores) + len(boxes) != len(shapes):
        return None
    scores.sort(key=lambda n: -shapes[n][1])
    boxes.sort(key=lambda n: -shapes[n][1])
    grids = []
    for sn, bn in zip(scores, boxes, strict=True):
        count = shapes[sn][1]
        if shapes[bn][1] != count:
            return None
        grid = next((h // s for s in (8, 16, 32, 64) if h // s and count % (h // s) ** 2 == 0), None)
        if grid is None:
            return None
        grids.append({"cells": grid, "anchors": count // grid**2})
    return Detected(
        "ssd_anchors",
        {"grids": grids, "scores": scores, "boxes": boxes},
        1,
        f"{len(scores)} score outputs [B, N, 1] paired with box outputs [B, N, {shapes[boxes[0]][2]}]: SSD anchors "
        + ", ".join(f"{g['cells']}x{g['cells']}x{g['anchors']}" for g in grids),
        ["SSD anchors are read as MediaPipe's (cell centres, offsets in input pixels): check a few detections"],
    )


def _ctc(shapes: Shapes, charset: list[str] | None, forced: bool) -> Detected | None:
    """One [B, T, C] output whose C is the charset plus the CTC blank (plus a space): a CTC text recogniser.
    Without a charset only `--decoder ctc` reads it so (then --labels gives the charset)."""
    if len(shapes) != 1:
        return None
    shape = next(iter(shapes.values()))
    if len(shape) != 3:
        return None
    _, steps, classes = shape
    if charset is None:
        if not forced:
            return None
        return Detected(
            "ctc",
            {"blank": 0, "space": False},
            classes - 1,
            f"one output {list(shape)}: [B, T, C] read as CTC (--decoder ctc); class 0 the blank",
            ["no charset in the metadata: --labels must list the C-1 characters after the blank, in order"],
        )
    extra = classes - len(charset)
    if extra not in (1, 2):
        return None
    return Detected(
        "ctc",
        {"blank": 0, "space": extra == 2},
        len(charset),
        f"one output {list(shape)}: [B, T={steps}, C={classes}] with the metadata's charset of {len(charset)} "
        f"characters + the CTC blank (class 0){' + a space (the last class)' if extra == 2 else ''}: a CTC text "
        "recogniser (PP-OCR), a secondary model (role stage)",
        [
            f"{steps} time steps per crop: a line longer than about {steps // 2} characters at this input width "
            "loses characters; --input-size a wider W (height as trained) if your lines are longer"
        ],
    )


def _show(shapes: Shapes) -> str:
    return ", ".join(f"{n} {list(s)}" for n, s in shapes.items())
