"""``edged push --mirror DIR_OR_URL``: a package's files on a web server, and the offer naming their URLs.

The devices then download the files over HTTP(S) (``edged.daemon.lifecycle.ota.download``) from nginx, a CDN or an
S3-compatible store instead of from ``edged push`` over MQTT; the signed manifest still goes over MQTT
and each file is checked against its sha256 on the device. The layout is content-addressed::

    <root>/sha256/<sha256 of the file>

so versions share unchanged files, a name never changes meaning, and a CDN may cache forever.

- ``--mirror DIR --mirror-url BASE``: the files are written into DIR (each to a hidden temporary name
  in its folder, fsynced, then renamed: a half-written file never has its final name, so it is never
  offered), and the offer names ``BASE/sha256/<hex>``: BASE is the URL at which the web server serves DIR.
- ``--mirror URL``: the files were uploaded there already (for instance ``aws s3 sync DIR s3://…`` after
  the first form without devices); the offer names ``URL/sha256/<hex>``.

Either way, before anything is offered, ``edged push`` asks each URL with a HEAD request that it is there
with the manifest's size, and fails (``mirror_failed``, every problem named) when not; ``--no-mirror-check``
skips that where only the devices reach the web server. HTTPS is checked against the system's CAs
(``SSL_CERT_FILE`` names others).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edged.errors import Code, EdgedError
from edged.models.package import Manifest, open_package
from edged.models.store.files import fsync_dir

LAYOUT = "sha256"  # the folder (and URL path) under the mirror's root
HEAD_TIMEOUT_S = 15.0


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def blob(sha256: str) -> str:
    """A file's path under the mirror's root (and under its base URL)."""
    return f"{LAYOUT}/{sha256}"


@dataclass(frozen=True)
class Mirror:
    """Where the package's files go (a directory) or are (a URL), and the base URL that serves them."""

    target: str
    url: str | None = None  # the base URL serving `target` when it is a directory
    check: bool = True  # HEAD each URL before the offer

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("--mirror-url needs --mirror DIR (the directory it serves)")
        if is_url(self.target):
            if self.url is not None and self.url != self.target:
                raise ValueError("--mirror URL takes no --mirror-url (the URL is where the files are)")
        elif self.url is None:
            raise ValueError(f"--mirror {self.target} (a directory) needs --mirror-url BASE: the URL serving it")
        elif not is_url(self.url):
            raise ValueError(f"--mirror-url {self.url!r} is not an http:// or https:// URL")

    @property
    def base(self) -> str:
        return (self.url or self.target).rstrip("/")

    def urls(self, manifest: Manifest) -> dict[str, list[str]]:
        return {name: [f"{self.base}/{blob(e.sha256)}"] for name, e in sorted(manifest.files.items())}

    def prepare(self, manifest: Manifest, files: dict[str, Path], out: TextIO) -> dict[str, list[str]]:
        """Write the files when the target is a directory, check the URLs, and return them for the offer."""
        if not is_url(self.target):
            wrote = write(Path(self.target), manifest, files)
            print(f"push: mirror {self.target}: {wrote} file(s) written, {len(files) - wrote} already there", file=out)
        urls = self.urls(manifest)
        if self.check:
            check(urls, manifest)
            print(f"push: mirror {self.base}: every file there with its size (HEAD)", file=out)
        return urls


def stage(package: Path, root: Path, base_url: str | None = None) -> list[str]:
    """``edged push PKG --mirror DIR`` without devices: the package's files written into DIR (to upload or
    sync elsewhere), nothing offered. One line per file: its name, its path under DIR (its URL with
    `base_url`)."""
    scratch = Path(tempfile.mkdtemp(prefix="edged-mirror-"))
    try:
        pkg = open_package(package, scratch=scratch)  # sizes and hashes: never mirror a corrupt copy
        m = pkg.manifest
        write(root, m, {name: pkg.root / name for name in m.files})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    where = (base_url or str(root)).rstrip("/")
    return [f"{name}\t{where}/{blob(e.sha256)}" for name, e in sorted(m.files.items())]


def write(root: Path, manifest: Manifest, files: dict[str, Path]) -> int:
    """Each file to ``root/sha256/<hex>`` atomically; one already there with the right size and hash is kept.
    Returns how many were written. EdgedError(mirror_failed) when the directory cannot be written or a
    source file is not what the manifest says."""
    folder = root / LAYOUT
    wrote = 0
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, entry in sorted(manifest.files.items()):
            dest = folder / entry.sha256
            if dest.is_file() and dest.stat().st_size == entry.size and _sha256(dest) == entry.sha256:
                continue
            tmp = folder / f".{entry.sha256}.{secrets.token_hex(4)}.tmp"  # hidden, and never an offered name
            try:
                digest = hashlib.sha256()
                with open(files[name], "rb") as src, open(tmp, "wb") as dst:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        dst.write(block)
                    dst.flush()
                    os.fsync(dst.fileno())
                if digest.hexdigest() != entry.sha256:
                    raise EdgedError(f"{files[name]}: changed while copied to the mirror", code=Code.MIRROR_FAILED)
                os.chmod(tmp, 0o644)  # a web server running as another user reads it
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            wrote += 1
        fsync_dir(folder)
    except OSError as exc:
        raise EdgedError(f"cannot write the mirror {root}: {exc}", code=Code.MIRROR_FAILED) from exc
    return wrote


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check(urls: dict[str, list[str]], manifest: Manifest, timeout_s: float = HEAD_TIMEOUT_S) -> None:
    """HEAD every URL: each must answer 2xx with the manifest's size. EdgedError(mirror_failed) naming each
    one that does not (its status, or its size, or why it could not be asked)."""
    problems = []
    for name, entry in sorted(manifest.files.items()):
        for url in urls[name]:
            try:
                request = urllib.request.Request(url, method="HEAD")  # noqa: S310  (http or https: Mirror checks)
                with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
                    length = resp.headers.get("Content-Length")
            except urllib.error.HTTPError as exc:
                exc.close()
                problems.append(f"{name}: HEAD {url}: HTTP {exc.code} {exc.reason}")
                continue
            except (urllib.error.URLError, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                problems.append(f"{name}: HEAD {url}: {reason}")
                continue
            if length is None or not length.isdigit() or int(length) != entry.size:
                problems.append(f"{name}: {url} is {length} bytes, the manifest says {entry.size}")
    if problems:
        raise EdgedError(
            "the package is not on the mirror as signed (nothing was offered): " + "; ".join(problems),
            code=Code.MIRROR_FAILED,
        )
