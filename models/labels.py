"""A model package's labels: its labels file (one label per line) read, and held against the list the
manifest may give itself. Used by package.py when a package is verified."""

from __future__ import annotations

from pathlib import Path

from edged.errors import Code, PackageError


def read_labels(path: Path) -> list[str]:
    """One label per line; blank lines at the end are not labels."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path}: cannot read the labels: {exc}", code=Code.LABELS_INVALID) from exc
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def package_labels(path: Path, listed: list[str]) -> list[str]:
    """The labels of a package whose labels file is `path` and whose manifest lists `listed`: the file's
    when the manifest lists none; else the manifest's, and a file that contradicts them is refused,
    naming the first difference."""
    from_file = read_labels(path)
    if not listed:
        return from_file
    if from_file and from_file != listed:
        first = next(
            (i for i, (a, b) in enumerate(zip(from_file, listed, strict=False)) if a != b),
            min(len(from_file), len(listed)),
        )
        raise PackageError(
            f"{path}: {len(from_file)} labels, the manifest lists {len(listed)}; they differ at line "
            f"{first + 1} ({from_file[first] if first < len(from_file) else '<none>'!r} vs "
            f"{listed[first] if first < len(listed) else '<none>'!r})",
            code=Code.LABELS_MISMATCH,
        )
    return listed
