"""The cameras' part of the config (DESIGN §2): each camera's source and capture options, and its own
detection settings, zones, masks, tracking, events and motion gating. Validated once at load like the
rest of the config (daemon/config/__init__.py, which loads the file and re-exports these)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..capture.framebound import MAX_FRAME_PIXELS
from ..capture.redact import redact
from ..capture.registry import NETWORK_SCHEMES, URI_FORMS, check_uri
from ..scene.lines import MAX_LINES, direction_problem, points_problem
from ..scene.zones import MAX_CAMERA_POINTS, polygon_problem

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class StrictModel(BaseModel):
    """Every config section: unknown keys are errors, values frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ZoneConfig(StrictModel):
    name: str = Field(description="the zone's name, as events and results give it")
    points: list[tuple[float, float]] = Field(
        min_length=3,
        description="the polygon's corners [x, y], in source pixels or, with normalized, 0-1: 3 to 64, in order "
        "around an area (not on one line, edges that do not cross); a camera's zones and masks: 256 together",
    )
    normalized: bool = Field(False, description="points are fractions (0-1) of the frame's width and height")

    @field_validator("points")
    @classmethod
    def _shape(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if problem := polygon_problem(v):  # at most 64 corners, 3 distinct, an area, no crossing edges
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _coordinates(self) -> ZoneConfig:
        if self.normalized and any(not (0.0 <= v <= 1.0) for p in self.points for v in p):
            raise ValueError(f"{self.name}: normalized points must lie in 0-1")
        if any(v < 0 for p in self.points for v in p):
            raise ValueError(f"{self.name}: points must not be negative")
        return self


class LineConfig(StrictModel):
    name: str = Field(description="the line's name, as object_crossed events, telemetry and /metrics give it")
    normalized: bool = Field(False, description="points are fractions (0-1) of the frame's width and height")
    points: list[tuple[float, float]] = Field(
        description="the line's two ends [[ax, ay], [bx, by]], in source pixels or, with normalized, 0-1; a "
        "crossing counts only between them"
    )
    in_direction: Literal["left", "right", "up", "down"] = Field(
        description="the movement on the picture that crosses the line *in* (right: crossing it from left to "
        "right is in, from right to left out); it must run across the line, not along it"
    )
    hysteresis: float = Field(
        0.1,
        ge=0.0,
        le=2.0,
        description="how far past the line the anchor must get to count as on the other side, in the object's "
        "box heights: a box that jitters on the line counts once",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', '-' (a metric label and an entity id)")
        return v

    @field_validator("points")
    @classmethod
    def _points(cls, v: list[tuple[float, float]], info: ValidationInfo) -> list[tuple[float, float]]:
        if problem := points_problem(v, bool(info.data.get("normalized", False))):
            raise ValueError(problem)
        return v

    @field_validator("in_direction")
    @classmethod
    def _direction(cls, v: str, info: ValidationInfo) -> str:
        points = info.data.get("points")
        if points is not None and (problem := direction_problem(points, v)):
            raise ValueError(problem)
        return v


class TrackingConfig(StrictModel):
    enabled: bool = Field(True, description="give each detection a track_id (a tracker per camera)")
    iou_threshold: float = Field(0.3, gt=0.0, le=1.0, description="a detection continues a track at this IoU")
    low_score_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="ByteTrack's second stage: detections down to this score continue tracks (never start one, "
        "never published); null: off",
    )
    min_hits: int = Field(3, ge=1, le=100, description="frames a new track needs before it counts (and appears)")
    max_age: int = Field(15, ge=0, le=10_000, description="frames a track survives without a detection")


class MotionConfig(StrictModel):
    pixel_threshold: float = Field(0.1, gt=0, le=1, description="a pixel moved: its grey level changed by this (0-1)")
    min_area: float = Field(0.002, ge=0, le=1, description="a frame shows motion: this share of its pixels moved")
    keepalive_s: float = Field(10.0, gt=0, le=3600, description="infer at least this often while nothing moves")
    hold_s: float = Field(1.0, ge=0, le=600, description="keep inferring this long after the last motion")


class CameraDetectionConfig(StrictModel):
    score_threshold: float | None = Field(None, ge=0.0, le=1.0, description="minimum score; null: detection's")
    labels: list[str] | None = Field(None, description="keep only these labels; null: detection's")
    max_detections: int | None = Field(None, ge=1, le=10_000, description="per frame; null: detection's")
    min_box_px: float = Field(0.0, ge=0, description="smallest box side kept, in source pixels")
    anchor: Literal["center", "bottom"] = Field(
        "center", description="the point of a box that zones and masks test: its center or bottom middle"
    )
    zones: list[ZoneConfig] = Field([], description="named areas; events say when a track enters or leaves one")
    masks: list[ZoneConfig] = Field([], description="areas ignored: a detection anchored in one is dropped")
    lines: list[LineConfig] = Field(
        [],
        max_length=MAX_LINES,
        description=f"named lines (at most {MAX_LINES}); a track whose anchor crosses one gives object_crossed, "
        "counted per line, direction (in, out) and label",
    )
    tracking: TrackingConfig = Field(TrackingConfig(), description="the multi-object tracker")
    publish: Literal["frames", "events", "both"] = Field(
        "frames", description="what goes out: every frame's result, object events (…/events), or both"
    )
    motion: MotionConfig | None = Field(
        None, description="infer only while something moves (plus a keep-alive); null: every frame"
    )
    snapshot_kb: int = Field(
        32, ge=0, le=200, description="the best crop in appeared/ended events, a JPEG of at most this; 0: none"
    )
    max_events_per_s: float = Field(
        20.0,
        gt=0,
        le=10_000,
        description="object events a second at most (a burst of 10 seconds' worth); an appeared or entered over "
        "it is dropped with its ended or left, counted in telemetry",
    )
    max_snapshots_per_s: float = Field(
        2.0,
        gt=0,
        le=1_000,
        description="snapshots a second at most (a burst of 10 seconds' worth); a track takes two (its appeared's "
        "and its ended's) or, over it, sends both without, counted in telemetry",
    )

    @field_validator("zones")
    @classmethod
    def _unique(cls, v: list[ZoneConfig]) -> list[ZoneConfig]:
        names = [z.name for z in v]
        if len(set(names)) != len(names):
            raise ValueError(f"zone names must be unique, got {names}")
        return v

    @field_validator("lines")
    @classmethod
    def _unique_lines(cls, v: list[LineConfig]) -> list[LineConfig]:
        names = [line.name for line in v]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"line names must be unique: {', '.join(twice)} given more than once")
        return v

    @model_validator(mode="after")
    def _lines_need_tracks(self) -> CameraDetectionConfig:
        if self.lines and not self.tracking.enabled:
            raise ValueError("lines need tracking (a crossing is a track's anchor moving across a line)")
        return self

    @model_validator(mode="after")
    def _corners(self) -> CameraDetectionConfig:
        if (n := sum(len(z.points) for z in (*self.zones, *self.masks))) > MAX_CAMERA_POINTS:
            raise ValueError(f"zones and masks have {n} points together; a camera's have at most {MAX_CAMERA_POINTS}")
        return self

    @model_validator(mode="after")
    def _events_need_tracks(self) -> CameraDetectionConfig:
        if self.publish != "frames" and not self.tracking.enabled:
            raise ValueError(f"publish: {self.publish} needs tracking (object events are about tracks)")
        return self


class RecordConfig(StrictModel):
    """A camera's encoded ring, from which clips around events are cut (off unless the camera has one)."""

    pre_s: float = Field(5.0, ge=0, le=300, description="seconds before an event's start kept in its clip")
    post_s: float = Field(5.0, ge=0, le=300, description="seconds after an event's end kept in its clip")
    max_clip_s: float = Field(300.0, gt=0, le=3600, description="a clip is cut, and a new one started, past this")
    ring_mb: float = Field(
        16.0,
        gt=0,
        le=1024,
        description="the in-memory ring of the encoded stream, in MB; it also keeps at most pre_s + max_clip_s + "
        "post_s + 30 s (oldest packets evicted first, counted); at 2 Mbit/s, 16 MB hold about a minute, so a "
        "longer pre_s needs a larger ring",
    )
    encoder: Literal["auto", "nvv4l2h264enc", "x264enc", "openh264enc"] = Field(
        "auto",
        description="sources that are not already H.264/H.265 (files, v4l2, MJPEG, synthetic) are encoded with "
        "this; auto: the best present (nvv4l2h264enc, x264enc, openh264enc); RTSP H.264/H.265 is kept as sent",
    )
    bitrate_kbps: int = Field(2000, ge=64, le=100_000, description="the encoder's target bitrate")


class CameraConfig(StrictModel):
    name: str = Field(description="unique; a topic level (letters, digits, '_', '.', '-')")
    uri: str = Field(description=f"the source: {URI_FORMS}")  # one form per row of the registry (capture/registry.py)
    password_file: Path | None = Field(
        None, description="rtsp/http cameras: the URI's password, read at each open; the URI holds the user only"
    )
    fps_max: float = Field(15.0, gt=0, le=240, description="frames per second taken at most")
    loop: bool = Field(False, description="file://: start again at the end")
    detection: CameraDetectionConfig | None = Field(
        None, description="this camera's detection settings, zones, masks, tracking and publishing"
    )
    realtime: bool = Field(
        True, description="file://: play at the file's frame rate; false: as fast as inference takes frames"
    )
    stall_timeout_s: float = Field(
        5.0, gt=0, le=600, description="no frame for this long is a stall; also the bound on opening a network source"
    )
    reconnect_min_s: float = Field(1.0, gt=0, le=600, description="reconnect back-off (full jitter): the first bound")
    reconnect_max_s: float = Field(30.0, gt=0, le=3600, description="reconnect back-off: the bound doubles up to this")
    backend: Literal["auto", "gstreamer", "opencv"] = Field(
        "auto",
        description="capture path for file/rtsp/v4l2/csi/gst cameras: auto = GStreamer (PyGObject) where it "
        "loads, else OpenCV; http:// MJPEG and synthetic:// are read by edged itself",
    )
    scale_in_pipeline: bool | None = Field(
        None,
        description="GStreamer: scale frames to the model's input inside the pipeline; none (auto): only where "
        "the hardware scaler nvvidconv exists (Jetson); in software it costs less CPU in all (videoconvert converts "
        "the small frame) but scales in YUV (pixels differ slightly) and snapshots and crops lose detail",
    )
    max_frame_pixels: int = Field(
        MAX_FRAME_PIXELS,
        ge=64 * 64,
        le=1 << 30,
        description="a frame of more pixels (width x height) is refused before it is decoded, counted in telemetry "
        "(frames_refused); the default is 8K UHD, 7680 x 4320 (100 MB as BGR), the largest edge cameras send",
    )
    rtsp_latency_ms: int = Field(200, ge=0, le=10_000, description="GStreamer rtsp(s)://: jitter buffer latency")
    rtsp_transport: Literal["auto", "tcp", "udp"] = Field(
        "auto", description="GStreamer rtsp(s)://: RTP over UDP or interleaved in the TCP connection; auto tries both"
    )
    tls_ca_file: Path | None = Field(
        None,
        description="rtsps://: the CA certificate (PEM) the camera's certificate must be signed by; for a camera "
        "with a self-signed certificate, that certificate itself (pinning); null: the system's CAs",
    )
    tls_verify: bool = Field(
        True,
        description="rtsps://: false accepts any certificate (no protection against an impostor); warned at every "
        "start and by check-config",
    )
    record: RecordConfig | None = Field(
        None, description="keep the encoded stream in a ring for clips around events; null: off"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', '-' (it becomes a topic level)")
        return v

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        check_uri(v)  # a scheme of the registry's table; a host for a network source
        return v

    @model_validator(mode="after")
    def _password_file(self) -> CameraConfig:
        if self.password_file is None:
            return self
        try:
            parts = urlsplit(self.uri)
            user, password = parts.username, parts.password
        except ValueError as exc:
            raise ValueError(f"{redact(self.uri)}: not a URI with a host") from exc
        if parts.scheme not in NETWORK_SCHEMES:
            raise ValueError("password_file is for rtsp:// and http:// cameras")
        if not user or password is not None:
            raise ValueError(
                f"with password_file the URI names the user and no password ({parts.scheme}://USER@{parts.hostname}…)"
            )
        return self

    @model_validator(mode="after")
    def _tls(self) -> CameraConfig:
        if (self.tls_ca_file is not None or not self.tls_verify) and not self.uri.startswith("rtsps://"):
            raise ValueError("tls_ca_file and tls_verify are for rtsps:// cameras")
        if self.tls_ca_file is not None and not self.tls_verify:
            raise ValueError("tls_ca_file pins a certificate and tls_verify: false accepts any: give one of them")
        return self

    @property
    def display(self) -> str:
        """The URI as logs, messages and replies show it: no user, no password."""
        return redact(self.uri)
