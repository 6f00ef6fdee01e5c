"""The config of what leaves the device by HTTP PUT: the top-level ``upload:`` section (the uploader,
daemon/delivery/upload.py) and ``labelling:`` (the frames worth labelling, daemon/record/labelling.py).
Validated once at load like the rest of the config (daemon/config/__init__.py, which loads the file and
re-exports these). Secrets come from files (``token_file``, ``password_file``), never from the YAML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from .cameras import StrictModel


class UploadConfig(StrictModel):
    url: str = Field(
        description="where files go: each is PUT to <url>/<name> (an nginx/WebDAV folder, any server that takes "
        "PUT); http:// or https://, no query (docs/operator.md, 'Uploads')"
    )
    token_file: Path | None = Field(
        None, description="a file holding a bearer token, sent as 'Authorization: Bearer <token>' (read per try)"
    )
    username: str | None = Field(None, description="HTTP basic auth's user name (with password_file)")
    password_file: Path | None = Field(None, description="a file holding HTTP basic auth's password")
    ca_file: Path | None = Field(
        None, description="the CA bundle an https:// url's certificate is checked against; null: the system's"
    )
    timeout_s: float = Field(30.0, gt=0.0, le=600.0, description="connect and per-read timeout of one PUT")
    retry_min_s: float = Field(
        1.0, gt=0.0, le=60.0, description="the first wait after a failed try (full jitter, doubling)"
    )
    retry_max_s: float = Field(
        300.0, gt=0.0, le=3600.0, description="the longest wait between tries; tries never stop while the daemon runs"
    )
    max_queue: int = Field(1000, ge=1, le=100_000, description="files waiting at most; a full queue refuses more")
    max_mb: float = Field(
        1024.0, gt=0.0, description="bytes of the files waiting, at most (MiB); a file that would pass it is refused"
    )
    max_failed: int = Field(
        100, ge=0, le=10_000, description="permanently refused uploads (a 4xx) remembered, oldest forgotten first"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or a fragment (names are appended to its path)")
        if parts.username or parts.password:
            raise ValueError("must not hold credentials: use token_file, or username with password_file")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _auth(self) -> UploadConfig:
        if self.token_file is not None and (self.username is not None or self.password_file is not None):
            raise ValueError("give token_file or username with password_file, not both")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("basic auth needs both username and password_file")
        if self.retry_min_s > self.retry_max_s:
            raise ValueError("retry_min_s must not be more than retry_max_s")
        return self


class LabellingConfig(StrictModel):
    enabled: bool = Field(
        False,
        description="keep the frames worth labelling: where a shadowed candidate disagrees most with the serving "
        "model, and (with near_threshold) frames with a detection near the score threshold (docs/models.md)",
    )
    dir: Path | None = Field(None, description="where they are kept; null: <state_dir>/labelling")
    max_frames: int = Field(200, ge=1, le=100_000, description="frames kept at most; the least disagreeing go first")
    max_mb: float = Field(100.0, gt=0.0, description="bytes of the kept JPEGs, at most (MiB)")
    near_threshold: float = Field(
        0.0,
        ge=0.0,
        le=0.5,
        description="in normal service, keep frames with a detection whose score is within this band above the "
        "score threshold; 0: none (only shadow disagreements are kept)",
    )
    sample_s: float = Field(
        10.0, ge=0.1, description="in normal service, one near-threshold frame per camera per this many seconds"
    )
    jpeg_quality: int = Field(90, ge=30, le=100, description="the JPEG quality of the kept frames")
    upload: bool = Field(False, description="PUT each kept JPEG and the COCO file through `upload:` (labelling/…)")

    @property
    def sampling(self) -> bool:
        """Frames near the threshold are looked for in normal service (the cameras keep taken frames)."""
        return self.enabled and self.near_threshold > 0


def resolve_upload(cfg: UploadConfig | None, fix: Callable[[Path | None], Path | None]) -> UploadConfig | None:
    """The section's paths expanded and taken relative to the config file's folder (config/__init__.py)."""
    if cfg is None:
        return None
    paths = {"token_file": cfg.token_file, "password_file": cfg.password_file, "ca_file": cfg.ca_file}
    return cfg.model_copy(update={k: fix(v) for k, v in paths.items()})


def resolve_labelling(cfg: LabellingConfig, fix: Callable[[Path | None], Path | None]) -> LabellingConfig:
    return cfg.model_copy(update={"dir": fix(cfg.dir)})


def upload_files(cfg: UploadConfig | None) -> list[tuple[str, Path | None]]:
    """The files ``upload:`` names, as (key path, path), for `missing_files`."""
    if cfg is None:
        return []
    return [
        ("upload.token_file", cfg.token_file),
        ("upload.password_file", cfg.password_file),
        ("upload.ca_file", cfg.ca_file),
    ]
