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

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from edged.errors import ConfigError

# the cameras' sections live in camera_config.py; re-exported: `from edged.daemon.config import CameraConfig`
from .camera_config import CameraConfig as CameraConfig
from .camera_config import CameraDetectionConfig as CameraDetectionConfig
from .camera_config import MotionConfig as MotionConfig
from .camera_config import StrictModel as _Strict
from .camera_config import TrackingConfig as TrackingConfig
from .camera_config import ZoneConfig as ZoneConfig
from .consumer_config import HealthConfig as HealthConfig
from .consumer_config import HomeAssistantConfig as HomeAssistantConfig
from .redact import scrub

ENV_PREFIX = "EDGED_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TOPIC_SAFE = re.compile(r"^[^#+/\x00]+$")


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error (PyYAML keeps the
    last one, so a second ``mqtt:`` section would silently replace the first). Keys that a merge
    (``<<: *defaults``) brings in may still be overridden: that is what merges are for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if first != key_node.start_mark.line + 1:
                raise _DuplicateKey(key, key_node.start_mark.line + 1, first)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, path: Path) -> Any:
    """YAML with unique keys; a ConfigError naming the file (and the line of a repeated key)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{path}: line {exc.line}: duplicate key {exc.key!r} (first at line {exc.first_line}); "
            "a second one would replace the first: merge them into one"
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's message with line and column but without its quote of the line: that line may hold
    a camera URI with a password."""
    if isinstance(exc, yaml.MarkedYAMLError):
        for mark in (exc.context_mark, exc.problem_mark):
            if mark is not None:
                mark.buffer = None  # no snippet
    return scrub(str(exc))


class TlsConfig(_Strict):
    ca_file: Path = Field(description="the CA that signed the broker's certificate")
    cert_file: Path | None = Field(None, description="the client certificate (with key_file)")
    key_file: Path | None = Field(None, description="the client certificate's key (with cert_file)")
    insecure_skip_hostname: bool = Field(False, description="skip the broker hostname check")

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class MqttConfig(_Strict):
    host: str = Field("127.0.0.1", description="the broker's host")
    port: int = Field(1883, ge=1, le=65535, description="the broker's port")
    topic_prefix: str = Field("edged", description="topics are <topic_prefix>/<device_id>/...")
    client_id: str | None = Field(None, description="MQTT client id; none means edged-<device_id>")
    qos: Literal[0, 1] = Field(1, description="QoS of results; status is always QoS 1")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive")
    username: str | None = Field(None, description="MQTT user name")
    password_file: Path | None = Field(
        None, description="the MQTT password, read from this file (e.g. under $CREDENTIALS_DIRECTORY), never the YAML"
    )
    tls: TlsConfig | None = Field(None, description="TLS to the broker; none means plain TCP")
    session_expiry_s: int = Field(
        3600,
        ge=0,
        le=2**32 - 1,
        description="MQTT v5 Session Expiry Interval: the session (command subscription, unacknowledged "
        "messages) outlives a disconnect this long (clean_start is false)",
    )
    max_inflight: int = Field(100, ge=1, le=65_000, description="QoS 1 messages sent and not yet acknowledged, at most")
    reconnect_max_s: float = Field(
        60.0,
        ge=1.0,
        le=3600.0,
        description="reconnect waits after a lost or refused connection: random (full jitter) up to a bound that "
        "doubles from 1 s to this, so a fleet never reconnects in step",
    )

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v or any(not _TOPIC_SAFE.match(p) for p in v.split("/")):
            raise ValueError("must be non-empty topic levels without '+', '#' or empty levels")
        return v


class SpoolConfig(_Strict):
    max_mb: float = Field(
        256.0,
        gt=0,
        le=1_000_000,
        description="the durable spool (<state_dir>/spool.db): over this size (or a quarter of its filesystem, "
        "if smaller) the oldest messages are dropped",
    )
    max_age_s: float = Field(
        7 * 86400.0,
        gt=0,
        description="messages spooled longer than this (the daemon's running time, not wall-clock time) are dropped",
    )
    commit_interval_ms: float = Field(
        200.0, ge=1, le=10_000, description="group commit of the spool; the loss window on power loss or a crash"
    )


class OnnxRuntimeConfig(_Strict):
    threads: int = Field(0, ge=0, le=256, description="intra-op threads; 0 lets ONNX Runtime choose")
    providers: list[Literal["cpu", "cuda", "tensorrt"]] = Field(
        ["cpu"], description="execution providers (cuda and tensorrt need onnxruntime-gpu); a missing one is an error"
    )


class ModelConfig(_Strict):
    package: Path | None = Field(None, description="a model package: a folder or a .tar; set this or name")
    name: str | None = Field(None, description="or: the store's package at <state_dir>/models/<name>/current")
    backend: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="auto: TensorRT for an engine package, ONNX Runtime for an ONNX one"
    )
    onnxruntime: OnnxRuntimeConfig = Field(OnnxRuntimeConfig(), description="ONNX Runtime's settings")
    keys_dir: Path = Field(
        Path("/etc/edged/keys"), description="the public keys (*.pub) whose signatures this device accepts"
    )
    keep_versions: int = Field(
        3, ge=2, le=20, description="model versions kept in the store (current, previous and probation always)"
    )
    probation_s: float = Field(300.0, ge=0, description="a newly installed version is committed after this long ...")
    probation_batches: int = Field(500, ge=0, description="... and this many batches, with no inference errors")
    probation_max_crashes: int = Field(
        1, ge=0, le=100, description="daemon crashes tolerated on probation; one more rolls the version back"
    )
    probation_latency_ratio: float = Field(
        2.0, ge=0, description="median batch cost over the replaced version's x this rolls back (0: off)"
    )
    probation_output_ratio: float = Field(
        10.0,
        ge=0,
        description="detections per frame off by more than x this from the previous version's over its last "
        "frames before the swap (a model that suddenly detects nothing, or everything) rolls back (0: off); a "
        "collapse counts only when that window held at least 20 detections ...",
    )
    probation_output_frames: int = Field(
        200, ge=1, le=5000, description="... judged over this many frames of each version"
    )
    build_on_device: bool = Field(
        False, description="an ONNX package on a device with TensorRT: build an engine once, cache it, run it"
    )
    build_precision: Literal["fp16", "int8", "fp32"] | None = Field(
        None,
        description="precision for build_on_device; none: what the model is (its own precision on TensorRT "
        ">= 10.12, strongly typed; before: int8 for QDQ models, else fp16)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.package is None) == (self.name is None):
            raise ValueError("set exactly one of model.package (a package folder or .tar) or model.name")
        return self


class InferenceConfig(_Strict):
    max_wait_ms: float = Field(
        30.0, ge=0, le=10_000, description="after a batch's first frame, wait at most this long for more"
    )
    warmup_batches: int = Field(2, ge=0, le=100, description="batches run before serving")


class DetectionConfig(_Strict):
    score_threshold: float = Field(0.5, ge=0.0, le=1.0, description="minimum score")
    iou_threshold: float = Field(0.3, ge=0.0, le=1.0, description="NMS IoU, per class")
    max_detections: int = Field(100, ge=1, le=10_000, description="detections per frame, at most")
    labels: list[str] = Field([], description="publish only these labels; empty publishes all")


class TelemetryConfig(_Strict):
    interval_s: float = Field(5.0, ge=0.5, le=3600, description="telemetry period (and systemd STATUS=)")


class GovernorConfig(_Strict):
    enabled: bool = Field(True, description="run the governor")
    interval_s: float = Field(1.0, ge=0.1, le=60, description="sampling period")
    sysfs_root: Path = Field(
        Path("/"), description="where sys/, proc/meminfo and the nvpmodel files are read (a bind mount, a fixture tree)"
    )
    zones: list[str] = Field(
        [],
        description="thermal zone types to watch; empty watches the hottest SoC thermal zone (hwmon chips such as "
        "an NVMe drive only on a machine without thermal zones, never storage or network ones)",
    )
    warm_c: float = Field(85.0, ge=0, le=150, description="warm level (°C): the frame rate is scaled down")
    hot_c: float = Field(90.0, ge=0, le=150, description="hot level (°C): inference pauses, cameras keep reading")
    critical_c: float = Field(97.0, ge=0, le=150, description="critical level (°C): critical_action is taken")
    hysteresis_c: float = Field(5.0, ge=0, le=50, description="a level is left only this far below its threshold ...")
    min_dwell_s: float = Field(10.0, ge=0, le=3600, description="... and after this long in it")
    warm_fps_scale: float = Field(0.5, gt=0, le=1, description="frame-rate factor while warm")
    critical_action: Literal["pause", "exit"] = Field(
        "exit", description="exit (code 3, for systemd to handle) or pause"
    )
    power_cap_w: float | None = Field(
        None, gt=0, le=1000, description="total power cap: over it the frame rate scales by cap / power; none: no cap"
    )

    @model_validator(mode="after")
    def _ordered(self) -> GovernorConfig:
        if not self.warm_c < self.hot_c < self.critical_c:
            raise ValueError(
                f"thresholds must rise: warm_c {self.warm_c} < hot_c {self.hot_c} < critical_c {self.critical_c}"
            )
        return self


class OtaConfig(_Strict):
    enabled: bool = Field(True, description="accept model pushes (edged push) when the daemon runs the store")
    chunk_kb: int = Field(256, ge=4, le=4096, description="KiB asked for per chunk request")
    window: int = Field(4, ge=1, le=64, description="chunk requests in flight")
    retry_s: float = Field(
        5.0, gt=0, le=600, description="no chunk for this long (plus a jittered back-off): ask again from the last byte"
    )
    give_up_s: float = Field(
        3600.0,
        gt=0,
        description="no chunk (or, downloading over HTTP(S), no byte) for this long: the transfer fails "
        "(stalled); what arrived is kept",
    )
    http_rate_kib_s: float = Field(
        0.0, ge=0, description="the most an HTTP(S) package download reads, KiB/s; 0: no cap"
    )
    http_ca_file: Path | None = Field(
        None,
        description="CA certificates (PEM) that HTTPS package downloads trust; unset: the system's. "
        "Certificates are always verified",
    )
    http_timeout_s: float = Field(
        30.0, gt=0, le=600, description="an HTTP(S) download's connect and read timeout; then it retries"
    )


class MemoryConfig(_Strict):
    budget_mb: float = Field(
        4096.0, gt=0, le=1_000_000, description="the device budget: a model that does not fit on top is refused"
    )
    throttle_pct: float = Field(
        85.0,
        gt=0,
        le=100,
        description="memory spent over this share of the budget halves the frame rate: less CPU/GPU load and "
        "heat, no memory freed (buffers are preallocated); formerly soft_limit_pct (still read, deprecated)",
    )
    hard_limit_pct: float = Field(
        95.0, gt=0, le=100, description="RSS over this share stops the daemon cleanly (exit 3)"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "soft_limit_pct" in data:
            if "throttle_pct" in data:
                raise ValueError("soft_limit_pct is the old name of throttle_pct: give only throttle_pct")
            logging.getLogger(__name__).warning(
                "config: memory.soft_limit_pct is deprecated, read as memory.throttle_pct (it halves the frame "
                "rate, which frees no memory); rename it"
            )
            data = {("throttle_pct" if k == "soft_limit_pct" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> MemoryConfig:
        if self.throttle_pct >= self.hard_limit_pct:
            raise ValueError("throttle_pct must be below hard_limit_pct")
        return self


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
    groups: list[str] = Field(
        [], description="fleet groups of this device (edged push --group), shown in the retained status"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")

    @field_validator("device_id")
    @classmethod
    def _device(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', '-' (it becomes a topic level)")
        return v

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[str]) -> list[str]:
        bad = [g for g in v if not _NAME.match(g)]
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

    @property
    def topic_root(self) -> str:
        return f"{self.mqtt.topic_prefix}/{self.device_id}"


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, override from the environment and validate; raise ConfigError naming key and file."""
    path = Path(path)
    environ = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
    raw = _parse_yaml(text, path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {type(raw).__name__}")
    _apply_env(raw, environ, path)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: " + "; ".join(_describe(e) for e in exc.errors())) from exc
    return _resolve_paths(cfg, path, environ)


def _describe(err: Mapping[str, Any]) -> str:
    where = ""
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    msg = msg.removeprefix("Value error, ")
    return f"{where or '(top level)'}: {msg}"


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str], path: Path) -> None:
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in {"EDGED_CACHE", "EDGED_DEMO_DIR"}:
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__")]
        if not all(keys):
            raise ConfigError(f"{path}: environment variable {name}: empty key level")
        if not environ[name].strip():
            raise ConfigError(
                f"{path}: environment variable {name} is set but empty; unset it to keep the file's value "
                "(or give `null` to mean none)"
            )
        try:
            value = yaml.load(environ[name], Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: environment variable {name}: not a YAML value: {_yaml_problem(exc)}") from exc
        node: Any = raw
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list):
                if not key.isdigit() or int(key) >= len(node):
                    raise ConfigError(f"{path}: environment variable {name}: no list item {key}")
                if last:
                    node[int(key)] = value
                else:
                    node = node[int(key)]
            elif isinstance(node, dict):
                if last:
                    node[key] = value
                else:
                    node = node.setdefault(key, {})
            else:
                raise ConfigError(f"{path}: environment variable {name}: {key!r} is not a section")


_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def load_mqtt_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> MqttConfig:
    """Only the `mqtt` section of a config file (what `edged push` needs; a device config will do, and so
    does a file holding nothing but an `mqtt:` section). Paths resolve as in load_config."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
    raw = _parse_yaml(text, path) or {}
    section = raw.get("mqtt", {}) if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: mqtt: must be a mapping")
    try:
        mqtt = MqttConfig.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(
            f"{path}: " + "; ".join(_describe({**e, "loc": ("mqtt", *e["loc"])}) for e in exc.errors())
        ) from exc
    return _resolve_mqtt(mqtt, _path_fixer(path, os.environ if environ is None else environ))


def watch_settings(
    path: Path | None,
    *,
    device: str | None = None,
    host: str | None = None,
    port: int | None = None,
    prefix: str | None = None,
    cafile: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    username: str | None = None,
    password_file: Path | None = None,
) -> tuple[MqttConfig, str]:
    """What a subscriber (`edged watch`) needs and nothing more: the broker settings of `path` (any file
    with an `mqtt:` section, or none) with the given flags over them, and the device id (`device`, else
    the file's `device_id`). Flag paths are taken as given (relative to the working directory)."""
    mqtt = load_mqtt_config(path) if path is not None else MqttConfig()
    if device is None and path is not None:
        raw = _parse_yaml(path.read_text(encoding="utf-8"), path)
        found = raw.get("device_id") if isinstance(raw, dict) else None
        device = found if isinstance(found, str) else None
    where = f"{path}: " if path is not None else ""
    if device is None:
        raise ConfigError(f"{where}no device to watch: give --device ID (or a config with a device_id)")
    if not _NAME.match(device):
        raise ConfigError(f"device {device!r}: must be 1-64 of letters, digits, '_', '.', '-' (it is a topic level)")
    doc: dict[str, Any] = mqtt.model_dump()
    doc.update({k: v for k, v in (("host", host), ("port", port), ("topic_prefix", prefix)) if v is not None})
    if username is not None:
        doc["username"] = username
    if password_file is not None:
        doc["password_file"] = password_file
    if cafile is not None or cert is not None or key is not None:
        tls = dict(doc["tls"] or {})
        tls.update({k: v for k, v in (("ca_file", cafile), ("cert_file", cert), ("key_file", key)) if v is not None})
        if "ca_file" not in tls:
            raise ConfigError(f"{where}--cert/--key need --cafile (the CA that signed the broker's certificate)")
        doc["tls"] = tls
        if port is None and path is None:
            doc["port"] = 8883  # MQTT over TLS
    try:
        return MqttConfig.model_validate(doc), device
    except ValidationError as exc:
        raise ConfigError(
            where + "; ".join(_describe({**e, "loc": ("mqtt", *e["loc"])}) for e in exc.errors())
        ) from exc


def _resolve_mqtt(mqtt: MqttConfig, fix: Callable[[Path | None], Path | None]) -> MqttConfig:
    tls = mqtt.tls
    if tls is not None:
        tls = tls.model_copy(
            update={"ca_file": fix(tls.ca_file), "cert_file": fix(tls.cert_file), "key_file": fix(tls.key_file)}
        )
    return mqtt.model_copy(update={"tls": tls, "password_file": fix(mqtt.password_file)})


def _resolve_paths(cfg: Config, path: Path, environ: Mapping[str, str]) -> Config:
    """Paths: ~ and $VARIABLES expanded (``${CREDENTIALS_DIRECTORY}/mqtt_password`` under systemd's
    LoadCredential=), then taken relative to the config file's folder."""
    fix = _path_fixer(path, environ)
    mqtt = _resolve_mqtt(cfg.mqtt, fix)
    model = cfg.model.model_copy(update={"package": fix(cfg.model.package), "keys_dir": fix(cfg.model.keys_dir)})
    governor = cfg.governor.model_copy(update={"sysfs_root": fix(cfg.governor.sysfs_root)})
    ota = cfg.ota.model_copy(update={"http_ca_file": fix(cfg.ota.http_ca_file)})
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
        }
    )


def _path_fixer(path: Path, environ: Mapping[str, str]) -> Callable[[Path | None], Path | None]:
    base = path.parent

    def fix(p: Path | None) -> Path | None:
        if p is None:
            return None
        expanded = _VAR.sub(lambda m: environ.get(m.group(1) or m.group(2), m.group(0)), str(p))
        if "$" in expanded:
            raise ConfigError(
                f"{path}: path {str(p)!r} names an environment variable that is not set "
                "(CREDENTIALS_DIRECTORY is set only under systemd with LoadCredential=)"
            )
        p = Path(expanded).expanduser()
        return p if p.is_absolute() else (base / p)

    return fix
