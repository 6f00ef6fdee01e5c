"""The optional parts of edged's install (pyproject.toml's extras) and the fix when one is missing.

ONNX Runtime and OpenCV are extras, not dependencies, so that ``pip install edged`` never replaces a
GPU host's ``onnxruntime-gpu`` with the CPU wheel nor shadows JetPack's GStreamer OpenCV with pip's.
Where edged needs one that is absent, the error names the module, the package and the extra:

    edged: error: OpenCV (module cv2) is not installed: pip install 'edged[opencv]' (or 'edged[cpu]' ...)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    module: str
    what: str
    extra: str
    package: str
    instead: str


EXTRAS = {
    e.module: e
    for e in (
        Extra(
            module="onnxruntime",
            what="ONNX Runtime",
            extra="onnxruntime",
            package="onnxruntime",
            instead="on a GPU host onnxruntime-gpu provides it; on a Jetson the onnxruntime wheel for its JetPack",
        ),
        Extra(
            module="cv2",
            what="OpenCV",
            extra="opencv",
            package="opencv-python-headless",
            instead="on a Jetson JetPack's python3-opencv provides it, seen by a --system-site-packages venv",
        ),
    )
}


def missing_message(module: str) -> str | None:
    """The fix for an optional module that is not installed, or None for a module that is no extra of edged."""
    e = EXTRAS.get(module.partition(".")[0])
    if e is None:
        return None
    return (
        f"{e.what} (module {e.module}) is not installed: pip install 'edged[{e.extra}]' "
        f"(the {e.package} wheel from PyPI; 'edged[cpu]' installs ONNX Runtime and OpenCV both), "
        f"or {e.instead}"
    )
