"""Raw output tensors -> detections in source-image pixels.

A decoder is built from the model package's ``decoder`` section and input spec, checks the
model's outputs once (``check``), then turns each batch's outputs into detections per real row
(padding rows are never decoded). Everything is vectorised with NumPy; NMS is OpenCV's, per class.

| type           | models                                                                |
|----------------|-----------------------------------------------------------------------|
| ssd_anchors    | MediaPipe-style SSD heads (BlazeFace)                                 |
| yolov8         | Ultralytics YOLOv8 / YOLO11 [B, 4+C, A]                               |
| yolov5         | YOLOv5 [B, A, 5+C] with objectness                                    |
| yolox          | YOLOX [B, A, 5+C] raw grid offsets with objectness (decode not in graph) |
| efficient_nms  | TensorRT EfficientNMS outputs, Ultralytics nms=True [B, K, 6]         |
| picodet        | PaddleDetection PicoDet / GFL (the PicoDet layout demo model)         |
| classify       | classifiers [B, C]: softmax / sigmoid top-k                           |
| ctc            | text recognisers [B, T, C]: greedy CTC (PP-OCR), text + mean score    |

A new decoder is one file here and one row in `DECODERS`; its name also goes into
``edged.models.init.recognise.DECODERS`` (the one list of names, which ``edged model init`` reads and the models side
may import), and tests/test_decoder_names.py fails until both agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from .base import DecodeOptions, Decoder, DecoderFactory, Detection, nms
from .classify import Classify
from .ctc import Ctc
from .picodet import PicoDet
from .ssd import SsdAnchors
from .yolo import EfficientNms, YoloV5, YoloV8
from .yolox import YoloX

DECODERS: dict[str, DecoderFactory] = {
    "ssd_anchors": SsdAnchors,
    "yolov8": YoloV8,
    "yolov5": YoloV5,
    "yolox": YoloX,
    "efficient_nms": EfficientNms,
    "picodet": PicoDet,
    "classify": Classify,
    "ctc": Ctc,
}

__all__ = ["DECODERS", "DecodeOptions", "Decoder", "Detection", "build_decoder", "nms"]


def build_decoder(
    spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str], output_shapes: dict[str, tuple[int, ...]]
) -> Decoder:
    factory = DECODERS.get(spec.type)
    if factory is None:
        raise DecoderError(
            f"decoder {spec.type!r} is not available in this edged (available: {', '.join(sorted(DECODERS))})"
        )
    decoder = factory(spec, input_spec, labels)
    decoder.check(output_shapes)
    return decoder
