"""The record wing's parts as the daemon builds them from its config (app.py calls these; the clips' planner
is built by `planner.build_clips`): the frames worth labelling, and the health server's ``/clips`` paths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..config import Config
from ..delivery.upload import Uploader
from .labelling import LabelFrames, score_thresholds
from .store import ClipsHTTP, ClipStore


def build_labelling(cfg: Config, labels: Sequence[str], uploader: Uploader | None) -> LabelFrames | None:
    """The frames worth labelling with ``labelling.enabled`` (each camera at its own score threshold), else
    None. `labels`: the serving model's; `uploader`: where kept frames go with ``labelling.upload``."""
    if not cfg.labelling.enabled:
        return None
    thresholds = score_thresholds(cfg.detection, cfg.cameras)
    return LabelFrames(cfg.labelling, cfg.state_dir, labels, uploader, thresholds)


def clips_http(store: ClipStore, token_file: Path | None, read_token: Callable[[Path | None], str | None]) -> ClipsHTTP:
    """The ``/clips`` paths over `store`. The token (``health.token_file``) is read once now, so a bad file
    fails the start, then again per request, so a rotated token is taken up; `read_token` reads it (the
    health endpoint's reader, shared with the live view)."""
    read_token(token_file)
    return ClipsHTTP(store, None if token_file is None else lambda: read_token(token_file))
