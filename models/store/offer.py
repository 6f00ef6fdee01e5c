"""Verification of an offered package (DESIGN §5), before anything is copied: the checks that need only
its manifest.json and manifest.sig, against this device and the store's state.

They run in the order of DESIGN §5 and stop at the first failure, each with its own code: the
manifest's size cap -> key pinned -> signature -> strict parse -> not expired -> not marked bad ->
not below the highest accepted version (equal and current: nothing to do) -> an engine declares its
compatibility, and it matches this device -> no file declared over `MAX_FILE_BYTES` -> space. Every
file's size and hash are checked later, as the files are copied (`Store.stage`) or written (OTA's
receiver hashes them, `Store.adopt` checks their sizes).
"""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from edged.errors import Code, PackageError

from ..compat import DeviceFacts, mismatches
from ..package import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from ..signing import TrustStore
from .state import ModelState

MAX_FILE_BYTES = 8 << 30  # no single model file over 8 GiB


@dataclass(frozen=True)
class Offer:
    """A package whose manifest passed every check that needs no file contents."""

    manifest: Manifest
    manifest_bytes: bytes
    sig_bytes: bytes
    key_id: str
    same_version: bool


class StoreState(Protocol):
    """What the checks read of the store (`edged.models.store.Store`)."""

    @property
    def state_dir(self) -> Path: ...

    def state(self, name: str) -> ModelState: ...

    def pointer(self, name: str, which: Literal["current", "previous"]) -> int | None: ...


def check_offer(
    store: StoreState,
    manifest_bytes: bytes,
    sig_bytes: bytes,
    trust: TrustStore,
    where: str,
    facts: DeviceFacts | None = None,
    now: dt.datetime | None = None,
) -> Offer:
    """Every check that needs only manifest.json and manifest.sig, in DESIGN §5's order."""
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise PackageError(
            f"{where}: manifest is {len(manifest_bytes)} bytes, over {MAX_MANIFEST_BYTES}", code=Code.TOO_LARGE
        )
    kid = trust.verify(manifest_bytes, sig_bytes, where)
    m = parse_manifest(manifest_bytes, where)
    same = admit(store, m, where, facts, now)
    return Offer(m, manifest_bytes, sig_bytes, kid, same)


def admit(
    store: StoreState, m: Manifest, where: str, facts: DeviceFacts | None = None, now: dt.datetime | None = None
) -> bool:
    """The checks of a verified manifest against this device and the store's state, which may change
    while a package downloads (so `Store.adopt` runs them again); True when this version is already current."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if m.expires is not None:
        try:
            expires = dt.datetime.fromisoformat(m.expires.replace("Z", "+00:00"))
        except ValueError as exc:
            raise PackageError(f"{where}: expires {m.expires!r} is not ISO 8601", code=Code.MANIFEST_INVALID) from exc
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=dt.timezone.utc)
        if expires <= now:
            raise PackageError(f"{where}: {m.name}@{m.version} expired at {m.expires}", code=Code.EXPIRED)
    state = store.state(m.name)
    if m.version in state.bad:
        raise PackageError(
            f"{where}: {m.name}@{m.version} was rolled back here and is never retried", code=Code.BAD_VERSION
        )
    if m.version < state.highest_accepted:
        raise PackageError(
            f"{where}: {m.name}@{m.version} is older than the highest accepted version "
            f"{state.highest_accepted} (replayed?)",
            code=Code.OLDER_VERSION,
        )
    same = m.version == state.highest_accepted and store.pointer(m.name, "current") == m.version
    if m.kind == "engine" and not m.compatibility:  # an engine runs only where it was built: it must say where
        raise PackageError(
            f"{where}: {m.name}@{m.version} is a TensorRT engine whose manifest declares no compatibility "
            "(TensorRT version, GPU compute capability, L4T release, platform); it cannot be checked "
            "against this device. Rebuild it with `edged build-engine`, which records them",
            code=Code.COMPATIBILITY_MISSING,
        )
    if m.kind == "engine" and facts is not None:  # ONNX packages run anywhere ONNX Runtime does
        problems = mismatches(m.compatibility, facts)
        if problems:
            raise PackageError(
                f"{where}: {m.name}@{m.version} cannot run here: {'; '.join(problems)}", code=Code.INCOMPATIBLE
            )
    if any(e.size > MAX_FILE_BYTES for e in m.files.values()):
        raise PackageError(f"{where}: a file is declared over {MAX_FILE_BYTES} bytes", code=Code.TOO_LARGE)
    need = sum(e.size for e in m.files.values())
    store.state_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(store.state_dir).free
    if not same and need * 1.1 > free:
        raise PackageError(f"{where}: needs {need >> 20} MiB, {free >> 20} MiB free", code=Code.NO_SPACE)
    return same
