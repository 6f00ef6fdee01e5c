"""Remote configuration, the config side: which keys a signed document may change (the allow-list), the
overlay merged over the file's config, and the result validated exactly as ``edged check-config`` validates
the file, every problem named by its key path.

An overlay has the shape of the config file, except that ``cameras`` is a mapping by camera name (a
document changes the cameras the file names; it never adds or removes one):

    detection: {score_threshold: 0.6}
    cameras:
      lobby:
        fps_max: 5
        detection: {zones: [{name: door, points: [[0, 0], [100, 0], [100, 100]]}]}

Mappings merge key by key; a list (zones, labels) or a scalar replaces the file's whole; ``null`` sets null.
What may change, and why the rest may not, is `ALLOWED` / `REFUSED` below (docs/operator.md, "Remote
configuration", shows the same table).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edged.errors import ConfigError

from ..capture.redact import redact
from ..capture.registry import scheme_of
from . import Config, _resolve_paths
from .file import apply_env, describe_error, read_yaml

# top-level key -> the keys under it a document may set ("*": any key of the section)
ALLOWED: dict[str, tuple[str, ...]] = {
    "detection": ("*",),
    "telemetry": ("*",),
    "memory": ("*",),
    "governor": (
        "zones", "warm_c", "hot_c", "critical_c", "hysteresis_c", "min_dwell_s", "warm_fps_scale",
        "critical_action", "power_cap_w",
    ),
    "log_level": (),
    "cameras": (),  # per camera: CAMERA_KEYS
}  # fmt: skip
CAMERA_KEYS = ("uri", "fps_max", "detection", "stall_timeout_s", "reconnect_min_s", "reconnect_max_s")
# camera URIs a document may name: network cameras and the test pattern; file:// only inside the state dir
REMOTE_URI_SCHEMES = ("rtsp", "rtsps", "http", "https", "snapshot+http", "snapshot+https", "synthetic", "file")
_WHY_NOT = "may not change remotely"
REFUSED: dict[str, str] = {
    "mqtt": "the broker, its TLS and credentials carry the documents: a bad one would cut the device off "
    "from the fleet that could fix it",
    "spool": "the durable spool's size and place are the device's storage",
    "ota": "model pushes have their own signed channel (edged push)",
    "model": "a model changes by a signed package (edged push), with probation, not by config",
    "remote_config": "the channel documents arrive by (and its keys) is set on the device only",
    "device_id": "the device's identity and topics",
    "state_dir": "the device's storage",
    "groups": "the groups decide which documents reach the device",
    "health": "the local endpoint binds an address on the device",
    "homeassistant": "discovery names topics outside the device's own",
    "inference": "batching needs a restart",
    "upload": "where the device's evidence goes, and the credentials for it, is set on the device only",
    "labelling": "frames of the device's cameras leave it through this: set on the device only",
    "clips": "the clip store's size and place are the device's storage",
    "stages": "a stage's model changes by a signed package, not by config",
}
GOVERNOR_LOCAL = "the governor's enabled, interval_s and sysfs_root need a restart; sysfs_root is a path"


def refusals(overlay: Mapping[str, Any], cfg: Config) -> list[str]:
    """Every key of `overlay` no document may set, as ``key.path: why``; a camera URI outside
    `REMOTE_URI_SCHEMES`, a ``file://`` outside `cfg`'s state dir and a camera `cfg` does not have included."""
    out: list[str] = []
    for key, value in overlay.items():
        if key not in Config.model_fields:
            out.append(f"{key}: unknown key")
            continue
        if key not in ALLOWED:
            why = REFUSED.get(key, "")
            out.append(f"{key}: {_WHY_NOT}" + (f" ({why})" if why else ""))
            continue
        sub = ALLOWED[key]
        if key == "cameras":
            out += _camera_refusals(value, cfg)
        elif sub and sub != ("*",):
            if not isinstance(value, Mapping):
                continue  # the validation names the type
            out += [f"{key}.{k}: {_WHY_NOT} ({GOVERNOR_LOCAL})" for k in value if k not in sub and k in _GOV_LOCAL]
    return out


_GOV_LOCAL = ("enabled", "interval_s", "sysfs_root")


def _camera_refusals(value: Any, cfg: Config) -> list[str]:
    if not isinstance(value, Mapping):
        return ["cameras: a mapping by camera name (a document changes cameras, it never adds or removes one)"]
    out: list[str] = []
    names = [c.name for c in cfg.cameras]
    for name, cam in value.items():
        where = f"cameras.{name}"
        if name not in names:
            out.append(f"{where}: no such camera here (cameras: {', '.join(names)}); a document never adds one")
            continue
        if not isinstance(cam, Mapping):
            out.append(f"{where}: a mapping of the camera's keys")
            continue
        for k, v in cam.items():
            if k not in CAMERA_KEYS:
                why = " (a path, a credential or a capture path)" if k in _CAMERA_FIELDS else ""
                out.append(f"{where}.{k}: {_WHY_NOT}{why}")
            elif k == "uri" and (problem := uri_refusal(v, cfg.state_dir)):
                out.append(f"{where}.uri: {problem}")
    return out


_CAMERA_FIELDS = ("password_file", "tls_ca_file", "tls_verify", "backend", "name", "loop", "realtime")


def uri_refusal(uri: Any, state_dir: Path) -> str:
    """Why a document may not give a camera `uri` ('' when it may)."""
    if not isinstance(uri, str):
        return ""  # the validation names the type
    scheme = scheme_of(uri)
    if scheme not in REMOTE_URI_SCHEMES:
        what = "a GStreamer pipeline can name any element" if scheme == "gst" else "a local device or pipeline"
        allowed = ", ".join(f"{s}://" for s in REMOTE_URI_SCHEMES)
        return f"{redact(uri)}: {scheme}:// {_WHY_NOT} ({what}); a document may give {allowed}"
    if scheme == "file":
        raw = uri[len("file://") :]
        target = Path(os.path.normpath(raw if os.path.isabs(raw) else state_dir / raw))
        base = Path(os.path.normpath(state_dir))
        if not target.is_relative_to(base) or Path(os.path.realpath(target)) != Path(os.path.realpath(base)) / (
            target.relative_to(base)
        ):
            return f"{uri}: a file outside the state dir ({state_dir}) may not be named remotely"
    return ""


def merge(raw: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` (the file's document) with `overlay` over it, as a new document; cameras by name."""
    out = copy.deepcopy(raw)
    for key, value in overlay.items():
        if key == "cameras" and isinstance(value, Mapping) and isinstance(out.get("cameras"), list):
            for cam in out["cameras"]:
                if isinstance(cam, dict) and cam.get("name") in value:
                    _merge_into(cam, value[cam["name"]])
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            _merge_into(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_into(into: dict[str, Any], overlay: Mapping[str, Any]) -> None:
    for k, v in overlay.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge_into(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def merged_overlays(overlays: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Several overlays as one (later ones over earlier ones): the groups' in `groups` order, then the device's."""
    out: dict[str, Any] = {}
    for o in overlays:
        out = merge(out, o)
        for key, value in o.items():  # cameras merge by name here too
            if key == "cameras" and isinstance(value, Mapping):
                cams = dict(out.get("cameras") or {}) if isinstance(out.get("cameras"), Mapping) else {}
                for name, cam in value.items():
                    cams[name] = merge(cams.get(name) or {}, cam) if isinstance(cam, Mapping) else cam
                out["cameras"] = cams
    return out


def load_with_overlay(
    path: str | os.PathLike[str], overlay: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> Config:
    """`load_config` with `overlay` merged over the file (after its ``EDGED_*`` overrides); a ConfigError
    naming each problem by its key path (a camera by its name: ``cameras.lobby.fps_max``)."""
    path = Path(path)
    environ = os.environ if environ is None else environ
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {type(raw).__name__}")
    apply_env(raw, environ, path)
    merged = merge(raw, overlay)
    try:
        cfg = Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError("; ".join(named_errors(exc.errors(), merged))) from exc
    return _resolve_paths(cfg, path, environ)


def named_errors(errors: list[Any], doc: Mapping[str, Any]) -> list[str]:
    """pydantic's errors as ``key.path: message``, a camera named as the overlay names it (by its name)."""
    out = []
    cams = doc.get("cameras") if isinstance(doc.get("cameras"), list) else []
    for err in errors:
        loc = list(err["loc"])
        if len(loc) >= 2 and loc[0] == "cameras" and isinstance(loc[1], int) and loc[1] < len(cams or []):
            cam = (cams or [])[loc[1]]
            if isinstance(cam, dict) and isinstance(cam.get("name"), str):
                loc[1] = cam["name"]
                text = describe_error({**err, "loc": ("_", *loc[1:])})
                out.append("cameras." + text[2:])
                continue
        out.append(describe_error({**err, "loc": tuple(loc)}))
    return out
