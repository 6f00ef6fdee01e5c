"""The daemon's configuration: one YAML file, validated once at load.

Unknown keys are errors, and every error names the key path and the file
(``edged.yaml: cameras[1].uri: ...``). Environment variables named
``EDGED_<SECTION>__<KEY>`` (``__`` between levels, list items by index) override keys
of the file at load time, their values parsed as YAML scalars, so one file serves a fleet:

    EDGED_DEVICE_ID=orin-07  EDGED_MQTT__PORT=8883  EDGED_CAMERAS__0__URI=rtsp://cam/1

An empty override (``EDGED_STATE_DIR=``) is an error naming the variable: it is almost always a
template or shell variable that was never filled in, and taking it as an empty string would quietly
move things (an empty ``state_dir`` is the config file's folder). Unset the variable to keep the
file's value; ``null`` or ``[]`` say "none" on purpose. A key given twice in one mapping (two
``mqtt:`` sections) is an error naming the key and both lines, not a silent replacement.

Paths expand ``~`` and are taken relative to the config file's folder. Nothing here does
I/O at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from edged.errors import ConfigError

# each part's sections live in their own module; re-exported: `from edged.daemon.config import CameraConfig`
from .cameras import CameraConfig as CameraConfig
from .cameras import CameraDetectionConfig as CameraDetectionConfig
from .cameras import LineConfig as LineConfig
from .cameras import MotionConfig as MotionConfig
from .cameras import StrictModel as _Strict
from .cameras import TrackingConfig as TrackingConfig
from .cameras import ZoneConfig as ZoneConfig
from .clips import ClipsConfig as ClipsConfig
from .consumers import HealthConfig as HealthConfig
from .consumers import HomeAssistantConfig as HomeAssistantConfig
from .file import ENV_PREFIX as ENV_PREFIX
from .file import apply_env, describe_errors, path_fixer, read_yaml
from .mqtt import TOPIC_NAME, resolve_mqtt
from .mqtt import MqttConfig as MqttConfig
from .mqtt import SpoolConfig as SpoolConfig
from .mqtt import TlsConfig as TlsConfig
from .mqtt import load_mqtt_config as load_mqtt_config
from .mqtt import watch_settings as watch_settings
from .runtime import DetectionConfig as DetectionConfig
from .runtime import GovernorConfig as GovernorConfig
from .runtime import InferenceConfig as InferenceConfig
from .runtime import MemoryConfig as MemoryConfig
from .runtime import ModelConfig as ModelConfig
from .runtime import OnnxRuntimeConfig as OnnxRuntimeConfig
from .runtime import OtaConfig as OtaConfig
from .runtime import RemoteConfigConfig as RemoteConfigConfig
from .runtime import TelemetryConfig as TelemetryConfig
from .stages import StageConfig as StageConfig
from .stages import check_stages
from .upload import LabellingConfig as LabellingConfig
from .upload import UploadConfig as UploadConfig
from .upload import resolve_labelling, resolve_upload, upload_files


class Config(_Strict):
    device_id: str = Field(description="this device's name; a topic level (letters, digits, '_', '.', '-')")
    state_dir: Path = Field(
        Path("/var/lib/edged"), description="the device's state (spool, model store); staging/ in it is scratch"
    )
    mqtt: MqttConfig = Field(MqttConfig(), description="the broker")
    spool: SpoolConfig = Field(SpoolConfig(), description="the durable spool")
    model: ModelConfig = Field(description="the model to serve")
    cameras: list[CameraConfig] = Field(min_length=1, description="the cameras, at least one")
    inference: InferenceConfig = Field(InferenceConfig(), description="batching")
    detection: DetectionConfig = Field(DetectionConfig(), description="filters on the detections")
    telemetry: TelemetryConfig = Field(TelemetryConfig(), description="telemetry")
    governor: GovernorConfig = Field(GovernorConfig(), description="thermals and power")
    memory: MemoryConfig = Field(MemoryConfig(), description="the memory budget")
    ota: OtaConfig = Field(OtaConfig(), description="over-the-air model pushes")
    homeassistant: HomeAssistantConfig = Field(HomeAssistantConfig(), description="Home Assistant MQTT discovery")
    health: HealthConfig = Field(HealthConfig(), description="the local health and metrics endpoint")
    remote_config: RemoteConfigConfig = Field(
        RemoteConfigConfig(), description="signed config documents from the fleet (edged config push)"
    )
    groups: list[str] = Field(
        [], description="fleet groups of this device (edged push --group), shown in the retained status"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    stages: list[StageConfig] = Field([], description="second-stage models on crops of the primary's detections")
    upload: UploadConfig | None = Field(None, description="HTTP PUT of clips and labelling frames; null: none")
    labelling: LabellingConfig = Field(LabellingConfig(), description="the frames worth labelling (off)")
    clips: ClipsConfig = Field(ClipsConfig(), description="the clip store that cameras with record: fill")

    @field_validator("device_id")
    @classmethod
    def _device(cls, v: str) -> str:
        if not TOPIC_NAME.match(v):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', '-' (it becomes a topic level)")
        return v

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[str]) -> list[str]:
        bad = [g for g in v if not TOPIC_NAME.match(g)]
        if bad:
            raise ValueError(f"group names are 1-64 of letters, digits, '_', '.', '-': {bad}")
        return v

    @field_validator("cameras")
    @classmethod
    def _unique(cls, v: list[CameraConfig]) -> list[CameraConfig]:
        names = [c.name for c in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"camera names must be unique; repeated: {', '.join(dup)}")
        return v

    @model_validator(mode="after")
    def _stages(self) -> Config:
        check_stages(self.stages, [c.name for c in self.cameras])
        return self

    @model_validator(mode="after")
    def _labelling_upload(self) -> Config:
        if self.labelling.enabled and self.labelling.upload and self.upload is None:
            raise ValueError("labelling.upload needs an upload: section (where to PUT)")
        if self.clips.upload and self.upload is None:
            raise ValueError("clips.upload needs an upload: section (where to PUT)")
        return self

    @property
    def topic_root(self) -> str:
        return f"{self.mqtt.topic_prefix}/{self.device_id}"


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, override from the environment and validate; raise ConfigError naming key and file."""
    path = Path(path)
    environ = os.environ if environ is None else environ
    raw = read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {type(raw).__name__}")
    overrides = apply_env(raw, environ, path)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc.errors(), path, overrides)) from exc
    return _resolve_paths(cfg, path, environ)


def _resolve_paths(cfg: Config, path: Path, environ: Mapping[str, str]) -> Config:
    """Paths: ~ and $VARIABLES expanded (``${CREDENTIALS_DIRECTORY}/mqtt_password`` under systemd's
    LoadCredential=), then taken relative to the config file's folder."""
    fix = path_fixer(path, environ)
    mqtt = resolve_mqtt(cfg.mqtt, fix)
    model = cfg.model.model_copy(update={"package": fix(cfg.model.package), "keys_dir": fix(cfg.model.keys_dir)})
    governor = cfg.governor.model_copy(update={"sysfs_root": fix(cfg.governor.sysfs_root)})
    ota = cfg.ota.model_copy(update={"http_ca_file": fix(cfg.ota.http_ca_file)})
    health = cfg.health.model_copy(update={"token_file": fix(cfg.health.token_file)})
    cameras = [
        c.model_copy(
            update={
                "uri": "file://" + str(fix(Path(c.uri[7:]))) if c.uri.startswith("file://") else c.uri,
                "password_file": fix(c.password_file),
                "tls_ca_file": fix(c.tls_ca_file),
            }
        )
        for c in cfg.cameras
    ]
    return cfg.model_copy(
        update={
            "mqtt": mqtt,
            "model": model,
            "cameras": cameras,
            "state_dir": fix(cfg.state_dir),
            "governor": governor,
            "ota": ota,
            "health": health,
            "upload": resolve_upload(cfg.upload, fix),
            "labelling": resolve_labelling(cfg.labelling, fix),
            "clips": cfg.clips.model_copy(update={"dir": fix(cfg.clips.dir)}),
            "stages": [
                s.model_copy(
                    update={
                        "model": s.model.model_copy(
                            update={"package": fix(s.model.package), "keys_dir": fix(s.model.keys_dir)}
                        )
                    }
                )
                for s in cfg.stages
            ],
        }
    )


def missing_files(cfg: Config, model: bool = True) -> list[str]:
    """The files `cfg` names that are not there, or not readable by this user, as ``key: path: why`` (what
    the daemon would fail on at its start or its first connect): the broker's TLS and password files, each
    camera's password and CA file, the OTA CA file, the live view's token file and, with `model`,
    ``model.package``. `edged check-config`
    asks; loading a config never does (the files may come later, as systemd's credentials do)."""
    files: list[tuple[str, Path | None]] = []
    if cfg.mqtt.tls is not None:
        tls = cfg.mqtt.tls
        files += [("mqtt.tls.ca_file", tls.ca_file), ("mqtt.tls.cert_file", tls.cert_file)]
        files += [("mqtt.tls.key_file", tls.key_file)]
    files.append(("mqtt.password_file", cfg.mqtt.password_file))
    for i, cam in enumerate(cfg.cameras):
        files += [(f"cameras[{i}].password_file", cam.password_file), (f"cameras[{i}].tls_ca_file", cam.tls_ca_file)]
    files.append(("ota.http_ca_file", cfg.ota.http_ca_file))
    files.append(("health.token_file", cfg.health.token_file))
    files += upload_files(cfg.upload)
    out = []
    for key, path in files:
        if path is None:
            continue
        if not path.is_file():
            out.append(f"{key}: {path}: " + ("not a file" if path.exists() else "no such file"))
        elif not os.access(path, os.R_OK):
            out.append(f"{key}: {path}: not readable by uid {os.geteuid()}")
    package = cfg.model.package
    if model and package is not None and not package.exists():
        out.append(f"model.package: {package}: no such file or folder")
    return out
