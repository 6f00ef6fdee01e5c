"""docs/architecture.md read as data: its module tables and its "What may import what" table.

tests/test_architecture.py checks the module tables against the tree; tests/test_layout.py takes its import
rules from the page instead of keeping a copy. A row the reader cannot read is an error naming the page and
the row, never a rule silently dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
RULES_HEADING = "## What may import what"
_CODE = re.compile(r"`([^`]+)`")
_SEPARATOR = re.compile(r"^\|[\s|:-]+\|$")
_PIPE = re.compile(r"(?<!\\)\|")  # a cell's border; `\|` is a pipe inside a cell


def _rows(lines: list[str]) -> list[list[str]]:
    """The cells of every table row in `lines`, header separators left out."""
    rows = []
    for line in lines:
        line = line.strip()
        if line.startswith("|") and line.endswith("|") and not _SEPARATOR.match(line):
            rows.append([cell.strip().replace("\\|", "|") for cell in _PIPE.split(line[1:-1])])
    return rows


def modules(text: str | None = None) -> dict[str, str]:
    """Every module the page's tables name (a row whose first cell is one `path.py`): path -> what it does."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    found: dict[str, str] = {}
    for cells in _rows(text.splitlines()):
        names = _CODE.findall(cells[0])
        if len(names) == 1 and cells[0] == f"`{names[0]}`" and names[0].endswith(".py"):
            if names[0] in found:
                raise ValueError(f"{PAGE.name}: {names[0]} has two rows")
            found[names[0]] = " | ".join(cells[1:])
    return found


def import_rules(text: str | None = None) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The "What may import what" table: (what every part may import, {part: what else it may import}).

    A part's key is its import name (`edged.deploy`, `edged.daemon.capture`); its last cell lists module
    names in backticks, or says "nothing of ours"."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    if RULES_HEADING not in lines:
        raise ValueError(f"{PAGE.name}: no {RULES_HEADING!r} section")
    section = lines[lines.index(RULES_HEADING) + 1 :]
    section = section[: next((i for i, line in enumerate(section) if line.startswith("## ")), len(section))]
    shared: tuple[str, ...] | None = None
    rules: dict[str, tuple[str, ...]] = {}
    for cells in _rows(section)[1:]:  # the first row is the header
        allowed = tuple(_CODE.findall(cells[-1]))
        if not allowed and cells[-1] != "nothing of ours":
            raise ValueError(f"{PAGE.name}: {RULES_HEADING[3:]}: cannot read the row {cells}")
        if cells[0] == "every part":
            shared = allowed
            continue
        key = _CODE.fullmatch(cells[0])
        if key is None or not key.group(1).startswith("edged."):
            raise ValueError(f"{PAGE.name}: {RULES_HEADING[3:]}: a row's part is not an `edged.*` name: {cells}")
        if key.group(1) in rules:
            raise ValueError(f"{PAGE.name}: {RULES_HEADING[3:]}: {key.group(1)} has two rows")
        rules[key.group(1)] = allowed
    if shared is None:
        raise ValueError(f"{PAGE.name}: {RULES_HEADING[3:]}: no 'every part' row")
    return shared, rules
