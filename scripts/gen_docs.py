"""Generate the reference pages from the code: the config keys, the command line and its man page.

    python scripts/gen_docs.py            write docs/reference/*.md and docs/edged.1
    python scripts/gen_docs.py --check    write nothing; exit 1 naming every page that drifted

Sources: the pydantic models of ``edged.daemon.config`` (docs/reference/config.md),
``edged.cli.build_parser()`` (docs/reference/cli.md, docs/edged.1) and, once it exists,
``edged.protocol`` (docs/reference/topics.md; skipped while it cannot be imported). The output is
deterministic: sorted where the code has no order of its own, no dates, no terminal width (argparse's
own formatter is not used, so neither COLUMNS nor the Python version changes a byte).
``tests/test_docs.py`` regenerates every page and compares it with the committed file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when loaded by path
from gen_docs_cli import cli_reference, man_page
from gen_docs_config import config_keys as config_keys
from gen_docs_config import config_reference
from gen_docs_topics import topics_reference

REPO = Path(__file__).resolve().parent.parent


PAGES: dict[str, Callable[[], str | None]] = {
    "docs/reference/config.md": config_reference,
    "docs/reference/cli.md": cli_reference,
    "docs/edged.1": man_page,
    "docs/reference/topics.md": topics_reference,
}


def render() -> dict[str, str]:
    """Every page that can be generated here, path (relative to the repository) -> text."""
    out = {}
    for path, make in PAGES.items():
        text = make()
        if text is not None:
            out[path] = text.rstrip("\n") + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the pages that drifted")
    args = ap.parse_args(argv)
    drifted = []
    for rel, text in render().items():
        path = REPO / rel
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        if args.check:
            drifted.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    for rel in drifted:
        print(f"{rel}: drifted from the code; run python scripts/gen_docs.py and commit it", file=sys.stderr)
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
