"""docs/reference/config.md, from the pydantic models of ``edged.daemon.config`` (scripts/gen_docs.py):
every key path in the models' own order, with its type, default, constraints and description."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from gen_docs_markdown import GENERATED, anchor, md
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if _is_model(t):
        return "section"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(t, str(t))


def _value(v: Any) -> str:
    if v is None:
        return "`null`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, float) and v.is_integer():
        return f"`{int(v)}`"
    if isinstance(v, Path):
        return f"`{v}`"
    if isinstance(v, list):
        return "`[" + ", ".join(str(x) for x in v) + "]`"
    return f"`{v}`"


def _constraints(f: FieldInfo) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least", "max_length": "at most"}
    out = []
    for m in f.metadata:
        for attr, word in words.items():
            if getattr(m, attr, None) is not None:
                val = getattr(m, attr)
                if attr.endswith("length"):
                    out.append(f"{word} {val} item{'s' if val != 1 else ''}")
                else:
                    out.append(f"{word} {_value(val).strip('`')}")
    return ", ".join(out)


def _models(t: Any) -> list[tuple[type[BaseModel], bool]]:
    """The sections a field's type holds: (model, is a list item)."""
    if _is_model(t):
        return [(t, False)]
    found: list[tuple[type[BaseModel], bool]] = []
    for a in typing.get_args(t):
        if _is_model(a):
            found.append((a, typing.get_origin(t) is list))
        else:
            found.extend(_models(a))
    return found


def config_keys(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every key path of the config (``cameras[].reconnect_max_s``), sections before their keys, in the
    models' own order."""
    if model is None:
        from edged.daemon.config import Config

        model = Config
    for name, field in model.model_fields.items():
        path = prefix + name
        yield path, field
        for sub, is_list in _models(field.annotation):
            yield from config_keys(sub, path + ("[]." if is_list else "."))


def config_reference() -> str:
    from edged.daemon.config import Config

    lines = [
        "# Configuration reference",
        "",
        GENERATED,
        "",
        "Every key of `edged.yaml`, from the pydantic models in `daemon/config/__init__.py`. Unknown keys are errors;",
        "an error names the key path and the file. How the file is read (environment overrides, relative",
        "paths, `${VARIABLES}`, what `systemctl reload` applies) is in the",
        "[operator guide](../operator.md#configuration); `examples/edged.example.yaml` is a commented example.",
        "",
    ]
    sections: list[tuple[str, list[tuple[str, FieldInfo]]]] = [("top level", [])]
    for path, field in config_keys(Config):
        held = _models(field.annotation)
        if held:
            sections.append((path + ("[]" if held[0][1] else ""), []))
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else "top level"
        target = next(s for s in sections if s[0] == parent)
        target[1].append((path, field))
    lines.append("Sections: " + ", ".join(f"[`{name}`](#{anchor(name)})" for name, _ in sections[1:]) + ".")
    lines.append("")
    for name, keys in sections:
        if not keys:
            continue
        title = name if name == "top level" else f"`{name}`"
        lines += [f"## {title}", ""]
        parent_field = dict(config_keys(Config)).get(name.removesuffix("[]"))
        if parent_field is not None and parent_field.description:
            about = parent_field.description[0].upper() + parent_field.description[1:] + "."
            if parent_field.is_required():
                about += " Required."
            else:
                about += " Optional." if parent_field.get_default() is None else ""
            limits = _constraints(parent_field)
            lines += [md(about + (f" {limits[0].upper()}{limits[1:]}." if limits else "")), ""]
        lines += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        for path, f in keys:
            default = "(required)" if f.is_required() else _value(f.get_default(call_default_factory=True))
            desc = md(f.description or "")
            lines.append(f"| `{path}` | {_type_name(f.annotation)} | {default} | {_constraints(f)} | {desc} |")
        lines.append("")
    return "\n".join(lines)
