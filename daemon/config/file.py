"""Reading a config file, before validation: YAML with unique keys, ``EDGED_<SECTION>__<KEY>``
environment overrides, paths expanded and taken relative to the file, and pydantic's errors turned into
one sentence per key path. Used by daemon/config/__init__.py (the whole file) and daemon/config/mqtt.py (only its
``mqtt`` section); both re-raise as ConfigError naming the file."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from edged.errors import ConfigError

from ..capture.redact import scrub

ENV_PREFIX = "EDGED_"
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")

PathFixer = Callable[[Path | None], Path | None]
"""A path of the config, as written -> the path it names (None stays None)."""

Overrides = dict[tuple[str | int, ...], str]
"""The key paths ``EDGED_*`` variables set (``("cameras", 0, "uri")``) -> the variable that set each."""


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


def parse_yaml(text: str, path: Path) -> Any:
    """YAML with unique keys; a ConfigError naming the file (and the line of a repeated key)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{path}: line {exc.line}: duplicate key {exc.key!r} (first at line {exc.first_line}); "
            "a second one would replace the first: merge them into one"
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from exc


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's message with line and column but without its quote of the line: that line may hold
    a camera URI with a password."""
    if isinstance(exc, yaml.MarkedYAMLError):
        for mark in (exc.context_mark, exc.problem_mark):
            if mark is not None:
                mark.buffer = None  # no snippet
    return scrub(str(exc))


def read_yaml(path: Path) -> Any:
    """The file's YAML document (None for an empty file); a ConfigError naming the file when it cannot be
    read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
    return parse_yaml(text, path)


def describe_error(err: Mapping[str, Any]) -> str:
    """One of pydantic's errors as `key.path[1].key: message` (`unknown key` for a key no section has)."""
    where = ""
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    msg = msg.removeprefix("Value error, ")
    return f"{where or '(top level)'}: {msg}"


def describe_errors(errors: list[Any], path: Path, overrides: Overrides, section: tuple[str, ...] = ()) -> str:
    """pydantic's errors, each blamed on where its value came from: the file (``edged.yaml: mqtt.port: ...``)
    or the ``EDGED_*`` variable that set the key or a section above it (``environment variable
    EDGED_MQTT__PORT: mqtt.port: ...``). `section`: the key path the validated document sits at."""
    from_file: list[str] = []
    from_env: list[str] = []
    for err in errors:
        loc = (*section, *err["loc"])
        text = describe_error({**err, "loc": loc})
        var = next((v for k, v in sorted(overrides.items(), key=lambda kv: -len(kv[0])) if loc[: len(k)] == k), None)
        if var is None:
            from_file.append(text)
        else:
            from_env.append(f"environment variable {var}: {text}")
    return "; ".join(([f"{path}: " + "; ".join(from_file)] if from_file else []) + from_env)


def apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], path: Path, sections: set[str] | None = None
) -> Overrides:
    """Write each ``EDGED_<SECTION>__<KEY>`` variable of `environ` into `raw` (the parsed file), its value
    parsed as a YAML scalar; list items by index. EDGED_CACHE and EDGED_DEMO_DIR are not config keys.
    `sections`: only the variables of these top-level keys (a reader of the ``mqtt`` section alone). Returns
    the key paths set, for errors that name the variable."""
    overrides: Overrides = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in {"EDGED_CACHE", "EDGED_DEMO_DIR"}:
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__")]
        if sections is not None and keys[0] not in sections:
            continue
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
            raise ConfigError(f"{path}: environment variable {name}: not a YAML value: {yaml_problem(exc)}") from exc
        node: Any = raw
        where: list[str | int] = []
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list):
                if not key.isdigit() or int(key) >= len(node):
                    raise ConfigError(f"{path}: environment variable {name}: no list item {key}")
                where.append(int(key))
                if last:
                    node[int(key)] = value
                else:
                    node = node[int(key)]
            elif isinstance(node, dict):
                where.append(key)
                if last:
                    node[key] = value
                else:
                    node = node.setdefault(key, {})
            else:
                raise ConfigError(f"{path}: environment variable {name}: {key!r} is not a section")
        overrides[tuple(where)] = name
    return overrides


def path_fixer(path: Path, environ: Mapping[str, str]) -> PathFixer:
    """Paths of the config file at `path`: ~ and $VARIABLES expanded (``${CREDENTIALS_DIRECTORY}/mqtt_password``
    under systemd's LoadCredential=), then taken relative to the file's folder; an unset variable is an error."""
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
