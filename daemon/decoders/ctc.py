"""``ctc``: a text recogniser's [B, T, C] output read by greedy CTC (PP-OCR's recognisers, CRNN-style models).

Each step's best class is taken, repeats are collapsed and blanks dropped; the text's score is the mean of
the kept steps' probabilities (0 for an empty text), as PaddleOCR's ``CTCLabelDecode`` does. A second-stage
model on crops (daemon/cascade/): each row becomes one Detection whose label is the text and whose box is
the whole crop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform
from .base import DecodeOptions, Detection, output_name


class Ctc:
    """params: output (name), blank (the blank's class index, default 0), space (PP-OCR's ``use_space_char``: the
    last class is a space, which a labels file cannot hold; default false), activation (none | softmax; default
    none: the output is already probabilities, as PP-OCR's is).

    The labels are the charset (PaddleOCR's dict file, or the ONNX metadata's ``character``), without the blank:
    class k is labels[k - 1] past the blank at 0, so C = labels + 1 (+ 1 with space). A labels file's lines are
    stripped, so a whitespace character (PP-OCR's U+3000) is an empty label: it reads as a space."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        params = spec.params
        self.blank = int(params.get("blank", 0))
        self.activation = str(params.get("activation", "none"))
        if self.activation not in ("none", "softmax"):
            raise DecoderError(f"ctc: activation {self.activation!r} is not none or softmax")
        chars = [label or " " for label in labels]
        if not 0 <= self.blank <= len(chars):
            raise DecoderError(f"ctc: blank {self.blank} is not a class index (0 to {len(chars)})")
        chars.insert(self.blank, "")
        if bool(params.get("space", False)):
            chars.append(" ")
        self.chars = chars
        self.params = params
        self.name = ""

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        self.name = output_name(self.params, "output", None, output_shapes)
        shape = output_shapes[self.name]
        if len(shape) != 3:
            raise DecoderError(f"ctc: output {self.name!r} is {list(shape)}, not [B, T, C]")
        if shape[2] != len(self.chars):
            raise DecoderError(
                f"ctc: {shape[2]} classes in the output, {len(self.chars)} from the labels (the charset, the blank"
                + (" and the space)" if self.params.get("space") else ")")
            )

    def read(self, outputs: dict[str, np.ndarray], rows: int) -> list[tuple[str, float]]:
        """(text, score) for each of the first `rows` rows."""
        probs = outputs[self.name][:rows].astype(np.float32)
        if self.activation == "softmax":
            e = np.exp(probs - probs.max(axis=2, keepdims=True))
            probs = e / e.sum(axis=2, keepdims=True)
        best = probs.argmax(axis=2)
        conf = probs.max(axis=2)
        out = []
        for ids, p in zip(best, conf, strict=True):
            keep = ids != self.blank
            keep[1:] &= ids[1:] != ids[:-1]  # repeats collapsed: a step equal to the one before adds nothing
            kept = ids[keep].tolist()
            text = "".join(self.chars[i] for i in kept)
            out.append((text, float(p[keep].mean()) if kept else 0.0))
        return out

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        results = []
        for (text, score), tf in zip(self.read(outputs, len(transforms)), transforms, strict=True):
            box = (0.0, 0.0, float(tf.src_width), float(tf.src_height))
            results.append([Detection(text, -1, score, box)])
        return results
