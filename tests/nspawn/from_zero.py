"""docs/operator.md "A secured site from zero" as a script: the numbered list's fenced ``sh`` blocks,
in order, exactly as the doc has them (less the list item's indentation). tests/test_nspawn.py runs the
script inside the container (tests/nspawn/site.sh); tests/test_docs.py checks the steps are there."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
HEADING = "## A secured site from zero"
_ITEM = re.compile(r"^(\d+)\. (.+)$")
_FENCE = re.compile(r"^( *)```sh\n(.*?)^\1```$", re.S | re.M)


@dataclass(frozen=True)
class Step:
    number: int
    title: str  # the item's first words, up to a colon, stop or bracket
    code: str  # the fenced block, dedented by the item's indentation


def steps(doc: str) -> list[Step]:
    """The numbered steps under HEADING, each with its one ``sh`` block; an error names what is missing."""
    start = doc.find("\n" + HEADING + "\n")
    if start < 0:
        raise ValueError(f"no heading {HEADING!r}")
    body = doc[start + len(HEADING) + 2 :]
    end = body.find("\n## ")
    body = body[: end if end >= 0 else None]
    items = [m for m in re.finditer(r"^\d+\. .+$", body, re.M)]
    out: list[Step] = []
    for i, m in enumerate(items):
        chunk = body[m.end() : items[i + 1].start() if i + 1 < len(items) else None]
        item = _ITEM.match(m.group(0))
        if item is None:  # the pattern above matched the same line
            raise ValueError(f"not a step: {m.group(0)!r}")
        blocks = list(_FENCE.finditer(chunk))
        if len(blocks) != 1:
            raise ValueError(f"step {item.group(1)} has {len(blocks)} sh blocks, not one")
        indent = blocks[0].group(1)
        code = "".join(
            line[len(indent) :] if line.startswith(indent) else line for line in blocks[0].group(2).splitlines(True)
        )
        title = re.split(r" \(|[:.]", item.group(2))[0].strip()
        out.append(Step(int(item.group(1)), title, code))
    if [s.number for s in out] != list(range(1, len(out) + 1)):
        raise ValueError(f"steps numbered {[s.number for s in out]}")
    return out


def names(step: Step) -> list[str]:
    """The variables a step assigns (step 1: the site's names)."""
    return [line.split("=", 1)[0] for line in step.code.splitlines() if re.match(r"^[A-Z_]+=", line)]


def script(doc: str, values: dict[str, str]) -> str:
    """A bash script that runs every step's block verbatim, in order, in one shell, stopping at the first
    that fails; after step 1 the names in ``values`` are set again (the container's broker and device).
    Each step prints ``PASS: from zero, step N: title`` once it exits 0."""
    parts = ["set -e -o pipefail\n"]
    for step in steps(doc):
        parts.append(f"echo '--- step {step.number}' >&2\n")
        parts.append(step.code)
        if step.number == 1:
            unknown = set(values) - set(names(step))
            if unknown:
                raise ValueError(f"step 1 does not name {sorted(unknown)}")
            parts.extend(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
        parts.append(f"echo {shlex.quote(f'PASS: from zero, step {step.number}: {step.title}')}\n")
    return "".join(parts)


if __name__ == "__main__":
    print(script(DOC.read_text(encoding="utf-8"), {}), end="")
