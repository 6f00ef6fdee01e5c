"""``classify``: an image classifier's [B, C] output as the top-k labels of the whole frame."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform
from .base import DecodeOptions, Detection, output_name, sigmoid


class Classify:
    """params: output (name), activation (softmax | sigmoid | none; default softmax), top_k (5).
    Each kept class is a Detection whose box is the whole source image."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        self.params = spec.params
        self.labels = list(labels)
        self.activation = str(self.params.get("activation", "softmax"))
        if self.activation not in ("softmax", "sigmoid", "none"):
            raise DecoderError(f"classify: activation {self.activation!r} is not softmax, sigmoid or none")
        self.top_k = int(self.params.get("top_k", 5))
        self.name = ""

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        self.name = output_name(self.params, "output", None, output_shapes)
        shape = output_shapes[self.name]
        if len(shape) != 2 and not (len(shape) == 4 and shape[2] == shape[3] == 1):
            raise DecoderError(f"classify: output {self.name!r} is {list(shape)}, not [B, C]")
        if self.labels and shape[1] != len(self.labels):
            raise DecoderError(f"classify: {shape[1]} classes in the output, {len(self.labels)} labels")

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        out = outputs[self.name].reshape(outputs[self.name].shape[0], -1)[: len(transforms)].astype(np.float64)
        if self.activation == "softmax":
            e = np.exp(out - out.max(axis=1, keepdims=True))
            probs = e / e.sum(axis=1, keepdims=True)
        elif self.activation == "sigmoid":
            probs = sigmoid(out)
        else:
            probs = out
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            order = np.argsort(-probs[row], kind="stable")[: min(self.top_k, opts.max_detections)]
            box = (0.0, 0.0, float(tf.src_width), float(tf.src_height))
            dets = []
            for c in order.tolist():
                p = float(probs[row, c])
                label = self.labels[c] if c < len(self.labels) else str(c)
                if p > opts.score_threshold and not (opts.labels and label not in opts.labels):
                    dets.append(Detection(label, c, p, box))
            results.append(dets)
        return results
