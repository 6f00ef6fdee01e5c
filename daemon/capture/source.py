"""What a camera source is: the `Source` a camera thread reads, the `Opening` an opener gets besides the
camera, and the URI a network source opens with (`with_password`). Every source type's module and the
registry read these; they read nothing of capture/ but the frame bound's type."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, urlsplit, urlunsplit

from edged.errors import CaptureError

if TYPE_CHECKING:
    import numpy as np

    from ..config.cameras import CameraConfig
    from .framebound import FrameBound


class Source(Protocol):
    fps: float  # the source's own rate, 0 when unknown
    # set when the last frame read was scaled (in a GStreamer pipeline) from a source of this (w, h)
    scaled_from: tuple[int, int] | None

    def read(self) -> np.ndarray | None:
        """Next frame (BGR), or None at the end of a file or when the source failed."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Opening:
    """What an opener gets besides the camera: `bound` (its max_frame_pixels, counting what it refuses),
    `stop` (set when the daemon stops: a source that waits waits on it), `spec_size` (the size a source of
    (w, h) is scaled to for the model, for a GStreamer pipeline that scales), `uri` (a network source's URI
    with the password from password_file in it: `with_password`, read at each open)."""

    bound: FrameBound
    stop: threading.Event | None = None
    spec_size: Callable[[int, int], tuple[int, int]] | None = None
    uri: str | None = None


def with_password(cam: CameraConfig) -> str:
    """The URI to open: with `password_file`, the file's first line goes in as the password, here and
    only here (so the YAML holds no secret, and a rotated credential is read at the next reopen)."""
    if cam.password_file is None:
        return cam.uri
    try:
        lines = cam.password_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CaptureError(f"{cam.display}: password_file: cannot read {cam.password_file}: {exc.strerror}") from exc
    if not lines or not lines[0]:
        raise CaptureError(f"{cam.display}: password_file {cam.password_file} is empty")
    parts = urlsplit(cam.uri)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}:{quote(lines[0], safe='')}@{hostport}"))
