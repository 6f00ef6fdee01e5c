"""One offered package's download, as a restart finds it (DESIGN §6): the state both of OTA's paths
(chunks over MQTT, `ota.chunks`; files over HTTP(S), `ota.download`) write through.

    <state_dir>/ota/<manifest sha256[:16]>/offer.json      the offer as accepted (a join rewrites it)
    <state_dir>/ota/<manifest sha256[:16]>/progress.json   file name -> bytes fsynced
    <state_dir>/ota/<manifest sha256[:16]>/package/        the files (``<name>.part`` until their hash checks)

Progress is recorded only after the bytes it counts were fsynced (at least every `PROGRESS_EVERY`
bytes), so a restart resumes from bytes that are on disk; a file whose hash does not match the signed
manifest's is discarded and its progress forgotten.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from edged.errors import PackageError
from edged.models.store import Offer
from edged.models.store.files import write_atomic
from edged.protocol.ota import ModelRef

from .download import PartFile

__all__ = ["PROGRESS_EVERY", "Transfer"]

PROGRESS_EVERY = 1 << 20  # fsync and persist progress at least every MiB


class Transfer:
    """One offered package's download: its folder, its offer and its persisted progress."""

    def __init__(self, folder: Path, transfer: str, offer: Offer, urls: dict[str, list[str]] | None = None) -> None:
        self.folder = folder  # offer.json and progress.json: the record a restart resumes from
        self.stage = folder / "package"  # the files, then the package the store adopts and renames in
        self.id = transfer
        self.former: set[str] = set()  # ids this transfer ran under before a newer offer joined it
        self.offer = offer
        self.ref = ModelRef(offer.manifest.name, offer.manifest.version)
        self.urls = urls or {}  # file name -> its URLs: downloaded over HTTP(S), not asked for in chunks
        # The cancel command against the transfer thread: set under `lock` unless the swap has begun
        # (`swapping`, set under `lock` by the thread once no cancel came), which a cancel can no longer stop.
        self.cancelled = threading.Event()
        self.swapping = False
        self.lock = threading.Lock()
        self.progress: dict[str, int] = {}
        p = folder / "progress.json"
        if p.exists():
            try:
                self.progress = {k: int(v) for k, v in json.loads(p.read_text()).items()}
            except (ValueError, AttributeError):
                self.progress = {}

    @property
    def total(self) -> int:
        return sum(e.size for e in self.offer.manifest.files.values())

    @property
    def have(self) -> int:
        return sum(min(self.progress.get(n, 0), e.size) for n, e in self.offer.manifest.files.items())

    def cancel(self) -> bool:
        """Ask the transfer to stop (the cancel command); False when too late: its swap has begun."""
        with self.lock:
            if self.swapping:
                return False
            self.cancelled.set()
            return True

    def begin_swap(self) -> bool:
        """The transfer thread, before the store adopts the package: False when cancelled (then stop)."""
        with self.lock:
            if self.cancelled.is_set():
                return False
            self.swapping = True
            return True

    def save(self) -> None:
        write_atomic(self.folder / "progress.json", json.dumps(self.progress).encode())

    def finish(self, part: PartFile, sha256: str) -> None:
        """The whole file: renamed to its name when its hash is the manifest's, else discarded (PackageError)."""
        try:
            part.finish(sha256, str(self.ref))
        except PackageError:
            self.progress.pop(part.name, None)
            self.save()
            raise
