"""The store's files on disk: atomic writes and links that survive a power cut, the crash-test seam, a
package's head (manifest and signature) read with size caps, and capped copies of its files."""

from __future__ import annotations

import os
import signal
import tarfile
from pathlib import Path
from typing import Any

from edged.errors import Code, PackageError, StateDirError

from ..package import MANIFEST, MAX_MANIFEST_BYTES, Manifest, check_members, tar_members
from ..signing import SIG_FILE

# Crash-test seam: EDGEDTEST_CRASH_AT=<step> SIGKILLs the process when the store reaches <step> (the
# default `on_step`); tests in-process pass their own `on_step`.
CRASH_ENV = "EDGEDTEST_CRASH_AT"


def crash_at_env_step(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """StateDirError, naming the file, when it cannot be written (a read-only or full file system)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        raise StateDirError(f"cannot write {path}: {exc.strerror or exc}") from exc


def link_atomic(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, link)
        fsync_dir(link.parent)
    except OSError as exc:
        raise StateDirError(f"cannot point {link} at {target}: {exc.strerror or exc}") from exc


def read_head(source: Path) -> tuple[bytes, bytes]:
    """manifest.json and manifest.sig of a package folder or tar, size-capped, nothing else read."""
    if source.is_dir():
        parts = []
        for fname, cap in ((MANIFEST, MAX_MANIFEST_BYTES), (SIG_FILE, 4096)):
            p = source / fname
            if not p.is_file():
                raise PackageError(
                    f"{source}: no {fname}", code=Code.UNSIGNED if fname == SIG_FILE else Code.NOT_A_PACKAGE
                )
            if p.stat().st_size > cap:
                raise PackageError(f"{p}: over {cap} bytes", code=Code.TOO_LARGE)
            parts.append(p.read_bytes())
        return parts[0], parts[1]
    if not source.exists():
        raise PackageError(f"{source}: no such file or folder", code=Code.NOT_FOUND)
    if not source.is_file() or not tarfile.is_tarfile(source):
        raise PackageError(f"{source}: neither a package folder nor a tar file", code=Code.NOT_A_PACKAGE)
    with tarfile.open(source) as tar:
        out: dict[str, bytes] = {}
        for fname, cap in ((MANIFEST, MAX_MANIFEST_BYTES), (SIG_FILE, 4096)):
            try:
                member = tar.getmember(fname)
            except KeyError:
                raise PackageError(
                    f"{source}: no {fname}", code=Code.UNSIGNED if fname == SIG_FILE else Code.NOT_A_PACKAGE
                ) from None
            if not member.isfile() or member.size > cap:
                raise PackageError(f"{source}: {fname} is not a file under {cap} bytes", code=Code.TOO_LARGE)
            f = tar.extractfile(member)
            out[fname] = f.read() if f else b""
    return out[MANIFEST], out[SIG_FILE]


def copy_files(source: Path, stage: Path, m: Manifest) -> None:
    """Copy exactly the files the manifest lists, never more bytes than it declares for each."""
    if source.is_dir():
        for name, entry in m.files.items():
            src = source / name
            if not src.is_file():
                raise PackageError(f"{src}: listed in the manifest but missing", code=Code.FILE_MISSING)
            copy_capped(src.open("rb"), stage / name, entry.size, str(src))
        return
    with tarfile.open(source) as tar:
        members = tar_members(tar, str(source))
        check_members(members, m, str(source))  # nothing undeclared, nothing over its declared size
        for name, entry in m.files.items():
            mem = members.get(name)
            if mem is None or not mem.isfile():
                raise PackageError(
                    f"{source}: {name} is listed in the manifest but not in the tar", code=Code.FILE_MISSING
                )
            f = tar.extractfile(mem)
            if f is None:
                raise PackageError(f"{source}: {name} cannot be read", code=Code.FILE_MISSING)
            copy_capped(f, stage / name, entry.size, f"{source}:{name}")


def copy_capped(src: Any, dst: Path, size: int, where: str) -> None:
    written = 0
    with src, open(dst, "wb") as out:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > size:
                raise PackageError(f"{where}: longer than the {size} bytes the manifest declares", code=Code.TOO_LONG)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if written != size:
        raise PackageError(f"{where}: {written} bytes, the manifest says {size}", code=Code.SIZE_MISMATCH)
