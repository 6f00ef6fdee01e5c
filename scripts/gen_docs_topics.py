"""docs/reference/topics.md, from ``edged.protocol`` (scripts/gen_docs.py): the topic table and its
builders, every JSON Schema the package ships, and the error codes."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import types
from typing import Any

from gen_docs_markdown import GENERATED, md


def topics_reference() -> str | None:
    """docs/reference/topics.md from ``edged.protocol``, or None while that room does not exist: the topic
    table (``edged.protocol.topics``' docstring) and its builders, every JSON Schema the package ships
    (``edged.protocol.schemas.FILES``), and the error codes (``Code``)."""
    try:
        protocol = importlib.import_module("edged.protocol")
    except ImportError:
        return None
    lines = [
        "# Topic and schema reference",
        "",
        GENERATED,
        "",
        "What the broker sees, from `edged.protocol` (the code the daemon, `edged push` and `edged watch` share).",
        "How to consume it: the [subscriber guide](../subscriber.md).",
        "",
    ]
    topics = _module("edged.protocol.topics")
    if topics is not None:
        lines += ["## Topics", ""]
        doc = inspect.getdoc(topics) or ""
        for paragraph in doc.split("\n\n"):
            lines += [md(" ".join(paragraph.split())), ""]
        lines += _topic_table(getattr(topics, "TOPICS", ()))
        builders = sorted(
            (n, f)
            for n, f in vars(topics).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == topics.__name__
        )
        if builders:
            lines += ["Builders (`edged.protocol.topics`):", ""]
            for n, f in builders:
                first = " ".join((inspect.getdoc(f) or "").split("\n\n")[0].split())
                signature = str(inspect.signature(f)).replace("'", "")
                lines.append(f"- `{n}{signature}`" + (f": {md(first)}" if first else ""))
            lines.append("")
    schemas = _module("edged.protocol.schemas")
    files = getattr(schemas, "FILES", None)
    load = getattr(schemas, "schema", None)
    if isinstance(files, dict) and callable(load):
        lines += ["## Schemas", ""]
        for sid in sorted(files):
            doc = load(sid)
            lines += [f"### `{sid}`", ""]
            if doc.get("description"):
                lines += [md(" ".join(str(doc["description"]).split())), ""]
            props = doc.get("properties") or {}
            required = set(doc.get("required") or ())
            if props:
                lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
                for name in props:
                    prop = props[name] if isinstance(props[name], dict) else {}
                    desc = md(" ".join(str(prop.get("description", "")).split()))
                    lines.append(f"| `{name}` | {_schema_type(prop)} | {'yes' if name in required else ''} | {desc} |")
                lines.append("")
            lines += ["```json", json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False), "```", ""]
    code = getattr(protocol, "Code", None)
    if isinstance(code, type) and issubclass(code, enum.Enum):
        comments = _member_comments(code)
        lines += ["## Error codes", "", "Every `error.code` on the wire (`Code`):", ""]
        lines += ["| code | meaning |", "|---|---|"]
        members: list[enum.Enum] = list(code)
        for member in sorted(members, key=lambda m: str(m.value)):
            lines.append(f"| `{member.value}` | {md(comments.get(member.name, ''))} |")
        lines.append("")
    return "\n".join(lines)


# the table's three parts, by a row's scope
_SCOPES = (
    ("device", "A device's topics, under its root (``…`` is ``<topic_prefix>/<device_id>``):"),
    ("fleet", "A fleet's topics, beside the devices' roots:"),
    ("other", "Outside the prefix, named in the shipped ACLs:"),
)


def _topic_table(rows: Any) -> list[str]:
    """``edged.protocol.topics.TOPICS`` as Markdown tables, one per scope, in the table's order."""
    lines: list[str] = []
    for scope, intro in _SCOPES:
        mine = [t for t in rows if t.scope == scope]
        if not mine:
            continue
        lines += [md(intro), "", "| topic | dir | QoS | retained | written by | also read by | payload |"]
        lines.append("|---|---|---|---|---|---|---|")
        for t in mine:
            readers = ", ".join(t.readers) or "-"
            cells = [
                f"`{t.shown}`",
                t.direction,
                t.qos,
                "yes" if t.retained else "no",
                t.writer,
                readers,
                md(t.payload),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if lines:
        lines += [
            md(
                "dir: out, a device publishes it; in, a device reads it. *also read by*: who reads it by an ACL "
                "grant of its own; the backend reads every topic under the prefix as well. MQTT filters and ACL "
                "rights come from the same table "
                "(``edged.protocol.topics.TOPICS``; systemd/mosquitto/edged.acl and central.acl are made from it)."
            ),
            "",
        ]
    return lines


def _module(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _schema_type(prop: dict[str, Any]) -> str:
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    t = prop.get("type")
    if isinstance(t, list):
        return " \\| ".join(str(x) for x in t)
    if t is not None:
        return str(t)
    if "$ref" in prop:
        return f"`{prop['$ref']}`"
    if "oneOf" in prop or "anyOf" in prop:
        return " \\| ".join(_schema_type(p) for p in prop.get("oneOf", prop.get("anyOf", [])) if isinstance(p, dict))
    return ""


def _member_comments(enum_class: type) -> dict[str, str]:
    """An enum's members' trailing comments (``NAME = "value"  # what it means``) from its source."""
    try:
        source = inspect.getsource(enum_class)
    except (OSError, TypeError):
        return {}
    found = {}
    for line in source.splitlines():
        m = re.match(r"\s*([A-Z][A-Z0-9_]*)\s*=\s*.+?#\s*(.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found
