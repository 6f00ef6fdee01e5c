"""Over-the-air model transfer, the device's side (DESIGN §6): the receiver, which takes an offer, runs
one transfer at a time on its own thread, and hands the verified package to the model manager. MQTT
carries all of it (the files in chunks: `ota.chunks`), or the offer over MQTT and the files over
HTTP(S) from a web server when the offer names their ``urls`` (`ota.download`: Range resume, a
bandwidth cap, TLS always verified, jittered retries).

    pusher ── cmd/ota {transfer, manifest, sig} ──> device: every manifest check first (store.check_offer)
    device ── ota/req {transfer, file, offset, length} ──> pusher       (a window of chunk requests)
    pusher ── ota/data [2-byte header length][header JSON][bytes] ──> device
    device ── ota/status {transfer, state, bytes, total, error} ──> pusher   (QoS 1, retained)

(The framing, the offer's format and the states are the wire contract's: `edged.protocol.ota`.)

Progress (bytes fsynced per file) is kept under ``<state_dir>/ota/<manifest sha256[:16]>/``
(`ota.transfer`; the files themselves in its ``package/``) and survives a broker outage (the chunk
path asks again, jittered) and a daemon restart (the transfer resumes at start, from the persisted
offsets, after checking the offer again).

Verified once, copied never: the offer's manifest is parsed and its signature checked once (a resume
checks the persisted offer again); each file is hashed as its chunks are written, in order (a resume
hashes the bytes it kept first), and a file is renamed from ``.part`` to its name only when its sha256
matches the signed manifest's, so no byte is trusted before its hash checks. The folder is then adopted
by the store as it is (`Store.adopt`: the store's state checked again, sizes, manifest and signature
written in) and one `Package` goes to the model manager, which swaps it in on probation; the store
renames the folder in (same file system), nothing is copied. A crash after that rename and before the
store recorded it leaves the version under ``versions/``: the resume finishes the install from it
(`Store.renamed_in`).

States: accepted, downloading, verifying,
installing, probation (success), unchanged (already current: a no-op), rejected (a check refused
it), failed (the transfer could not complete), joined (the same package was offered again while
it downloaded: the transfer carries on under the newer offer's id, named in `by`), cancelled (the
``cancel`` command stopped it: its files are dropped).

An offer with ``shadow`` (protocol/shadow.py) has the installer evaluate the candidate beside the serving
model before it swaps in (`Installer.shadow_staged`): the status is ``shadowing`` (its ``detail.shadow``: the
report's figures so far) until the verdict, then ``probation`` or ``rejected`` (``model_rejected`` or
``no_evidence``, with the last figures in ``detail``). One transfer at a time: another offer meanwhile is
``busy``, and a cancel is too late (the swap has begun).

The ``cancel`` command (`OtaReceiver.cancel`) stops the running transfer on either path while its files
download (a chunk fetch within a quarter second; an HTTP(S) read is cut at once, a connect within
``ota.http_timeout_s``), drops its folder, publishes ``cancelled`` and replies once the thread has
stopped; once every file is in and the swap has begun it is too late (``busy``: the ``rollback``
command undoes a swap). Nothing running is ``no_transfer``.

A join (a second `edged push` of the package, or a pusher taking its transfer back) moves the
requests in flight to the new id and asks them again at once (`ChunkFetcher.rename`), so the transfer
does not stall for `retry_s`; chunks already accepted under the old id are still written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from paho.mqtt.client import MQTTMessage

from edged.errors import Code, CommandError, EdgedError, PackageError
from edged.models.compat import detect
from edged.models.package import Manifest, Package
from edged.models.signing import TrustStore
from edged.models.store import Store
from edged.models.store.files import fsync_dir, write_atomic
from edged.protocol import topics
from edged.protocol.ota import (
    MAX_OFFER_BYTES,
    CancelArgs,
    ModelRef,
    OfferArgs,
    OtaState,
    offer_payload,
    status_doc,
)
from edged.protocol.shadow import ShadowAsk

from ...config import OtaConfig
from .chunks import ChunkFetcher, OtaLink
from .download import Downloader, PartFile
from .transfer import PROGRESS_EVERY, Transfer

__all__ = [
    "MAX_OFFER_BYTES",
    "CancelArgs",
    "Installer",
    "OfferArgs",
    "OtaLink",
    "OtaReceiver",
    "Transfer",
]  # the offer's format: edged.protocol.ota

logger = logging.getLogger(__name__)

CANCEL_STOP_S = 5.0  # what a cancel waits for the transfer thread, on top of a connect's ota.http_timeout_s


class Installer(Protocol):
    """Who takes a downloaded package: the model manager (lifecycle.manager.ModelManager)."""

    def install_staged(self, pkg: Package, transfer: str | None = None) -> dict[str, Any]:
        """Swap the staged package in, on probation; raises when refused (and reports that itself)."""
        ...

    def rejected(self, ref: ModelRef | None, exc: EdgedError, transfer: str | None = None) -> None:
        """Report a package refused before any swap (`ref` None: its manifest named nothing trusted)."""
        ...

    def shadow_staged(
        self,
        pkg: Package,
        transfer: str,
        ask: ShadowAsk,
        progress: Any,
        stop: threading.Event,
    ) -> dict[str, Any] | None:
        """Evaluate the staged package beside the serving model, then swap it in when it passes; raises when
        refused (and reports that itself); None when stopped first."""
        ...

    def check_stage(self, stage: str, m: Manifest) -> Any:
        """An offer with `stage`: raise (EdgedError) when this daemon cannot take the package for that stage."""
        ...

    def install_stage(self, pkg: Package, stage: str, transfer: str | None = None) -> dict[str, Any]:
        """Swap the staged package in as the cascade stage `stage`'s model, on probation of its own; raises when
        refused (and reports that itself)."""
        ...


class OtaReceiver:
    def __init__(
        self,
        cfg: OtaConfig,
        store: Store,
        keys_dir: Path,
        link: OtaLink,
        installer: Installer,
        stop: threading.Event,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.keys_dir = keys_dir
        self.root = store.state_dir / "ota"
        self._link = link
        self._installer = installer
        self._stop = stop
        self.chunks = ChunkFetcher(cfg, link, stop, self._downloading)  # the files' default path: MQTT
        self._lock = threading.Lock()
        self._current: Transfer | None = None
        self._thread: threading.Thread | None = None
        self.completed = 0
        self._http: Downloader | None = None  # made at the first offer with URLs (TLS settings checked then)
        self._asks: dict[str, ShadowAsk] = {}  # transfer folder -> its offer's shadow ask
        self._stages: dict[str, str] = {}  # transfer folder -> the cascade stage its offer names
        self._shadow_detail: dict[str, Any] = {}  # the running shadow's last figures (for a rejection's status)

    @property
    def max_message_bytes(self) -> int:
        """The largest legitimate message on ota/data (`ChunkFetcher.max_message_bytes`)."""
        return self.chunks.max_message_bytes

    def on_data(self, msg: MQTTMessage) -> None:
        """A chunk on ota/data (paho's network thread): checked and queued, or dropped, by `ChunkFetcher`."""
        self.chunks.on_data(msg)

    # ---- the offer (command thread) --------------------------------------------------------
    def offer(self, args: OfferArgs) -> dict[str, Any]:
        manifest_bytes, sig_bytes = args.decode()
        where = f"offer {args.transfer}"
        try:
            offer = self.store.check_offer(manifest_bytes, sig_bytes, TrustStore.load(self.keys_dir), where, detect())
        except PackageError as exc:
            self.status(args.transfer, OtaState.REJECTED, error=exc)
            self._installer.rejected(None, exc, args.transfer)
            raise CommandError(exc.code, str(exc)) from exc
        ref = ModelRef(offer.manifest.name, offer.manifest.version)
        self._check_stage(args, offer.manifest, ref)
        self._check_urls(args, set(offer.manifest.files))
        if offer.same_version:
            self.status(args.transfer, OtaState.UNCHANGED, model=ref)
            return {"state": OtaState.UNCHANGED, "model": ref.doc()}
        key = hashlib.sha256(manifest_bytes).hexdigest()[:16]
        with self._lock:
            cur = self._current
            if cur is not None and self._thread is not None and self._thread.is_alive():
                if cur.folder.name == key:  # the same package offered again (a new push): carry on under its id
                    old = cur.id
                    if old == args.transfer:
                        return self._accepted(cur)
                    self._join(cur, args)
                    return {**self._accepted(cur), "joined": old}
                raise CommandError(Code.BUSY, f"a transfer of {cur.ref} runs")
            folder = self.root / key
            for other in self.root.glob("*") if self.root.is_dir() else []:
                if other.name != key:
                    shutil.rmtree(other, ignore_errors=True)  # one transfer at a time: an older offer is dropped
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / "offer.json", offer_payload(args))
            t = Transfer(folder, args.transfer, offer, args.urls)
            self._ask(t, args.shadow, args.stage)
            self._start(t)
            return self._accepted(t)

    def cancel(self, args: CancelArgs) -> dict[str, Any]:
        """The ``cancel`` command: stop the running transfer, wait (bounded) for its thread to drop its files
        and publish ``cancelled``, and say what was cancelled."""
        with self._lock:
            t, thread = self._current, self._thread
            if t is None or thread is None or not thread.is_alive():
                raise CommandError(Code.NO_TRANSFER, "no transfer runs: nothing to cancel")
            if args.transfer is not None and args.transfer != t.id and args.transfer not in t.former:
                raise CommandError(
                    Code.NO_TRANSFER,
                    f"transfer {args.transfer} does not run (transfer {t.id} of {t.ref} does): nothing was cancelled",
                )
            if not t.cancel():
                raise CommandError(
                    Code.BUSY,
                    f"too late to cancel transfer {t.id} of {t.ref}: every file is in and its swap has begun (the "
                    "rollback command undoes a swap)",
                )
        logger.warning("ota: transfer %s of %s: cancel asked by command", t.id, t.ref)
        if self._http is not None:
            self._http.cancel()  # cuts a read blocked on the server (a chunk fetch sees the event by itself)
        wait_s = self.cfg.http_timeout_s + CANCEL_STOP_S
        thread.join(wait_s)
        if thread.is_alive():
            raise CommandError(
                Code.FAILED, f"transfer {t.id} of {t.ref} did not stop within {wait_s:.0f} s of the cancel"
            )
        return {"state": OtaState.CANCELLED, "transfer": t.id, "model": t.ref.doc(), "total": t.total}

    def unfinished(self, args: OfferArgs) -> bool:
        """Whether this offer's package has a transfer here that stopped short and is not running (stalled,
        or a download that failed: its bytes are kept): offering it again resumes it."""
        try:
            manifest_bytes, _ = args.decode()
        except CommandError:
            return False
        key = hashlib.sha256(manifest_bytes).hexdigest()[:16]
        with self._lock:
            cur = self._current
            if cur is not None and cur.folder.name == key and self._thread is not None and self._thread.is_alive():
                return False
            return (self.root / key / "offer.json").exists()

    def _join(self, t: Transfer, args: OfferArgs) -> None:
        """Carry on with the running transfer `t` under the newer offer's id: say so on the old id's status,
        and ask the requests in flight again under the new id (its pusher serves only its own id; answers
        under the old one are dropped on arrival, and waiting for them would cost `retry_s`)."""
        old = t.id  # only a join changes it, and joins run under self._lock
        again = self.chunks.rename(t, args.transfer)
        if args.urls is not None:  # the newer offer's URLs, from the next try on (a mirror fixed, say)
            t.urls = dict(args.urls)
        write_atomic(t.folder / "offer.json", offer_payload(args))  # a restart resumes under the new id
        logger.info("ota: transfer %s of %s joined by %s (a new offer of it)", old, t.ref, t.id)
        self.status(old, OtaState.JOINED, model=t.ref, done=t.have, total=t.total, by=t.id)
        for req in again:
            self.chunks.request(req)

    def _accepted(self, t: Transfer) -> dict[str, Any]:
        self.status(t.id, OtaState.ACCEPTED, model=t.ref, done=t.have, total=t.total)
        return {
            "state": OtaState.ACCEPTED,
            "model": t.ref.doc(),
            "have": t.have,
            "total": t.total,
        }

    def resume(self) -> None:
        """At start: carry on with a transfer a previous run left (its offer is checked again)."""
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir()):
            try:
                rec = json.loads((folder / "offer.json").read_text())
                args = OfferArgs.model_validate(rec)
                mb, sb = args.decode()
                offer = self.store.check_offer(
                    mb, sb, TrustStore.load(self.keys_dir), f"resumed {folder.name}", detect()
                )
            except (OSError, ValueError, EdgedError) as exc:
                logger.warning("ota: dropping the unfinished transfer in %s: %s", folder, exc)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            if offer.same_version:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            t = Transfer(folder, args.transfer, offer, args.urls)
            self._ask(t, args.shadow, args.stage)
            logger.info("ota: resuming transfer %s of %s at %d of %d bytes", t.id, t.ref, t.have, t.total)
            with self._lock:
                self._start(t)
            return

    def _ask(self, t: Transfer, ask: ShadowAsk | None, stage: str | None = None) -> None:
        self._asks.pop(t.folder.name, None)
        self._stages.pop(t.folder.name, None)
        if ask is not None:
            self._asks[t.folder.name] = ask
        if stage is not None:
            self._stages[t.folder.name] = stage

    def _check_stage(self, args: OfferArgs, m: Manifest, ref: ModelRef) -> None:
        """An offer naming a cascade stage: refused at once (rejected) when the daemon cannot take the package
        for that stage (cascade/swap.py says why, naming both); a stage is never shadowed."""
        if args.stage is None:
            return
        try:
            if args.shadow is not None:
                raise EdgedError(f"{ref}: a stage's version (stage {args.stage!r}) is not shadowed; push it without "
                                 "--shadow: its own probation judges it", code=Code.NOT_SUPPORTED)  # fmt: skip
            self._installer.check_stage(args.stage, m)
        except EdgedError as exc:
            self.status(args.transfer, OtaState.REJECTED, model=ref, error=exc)
            self._installer.rejected(ref, exc, args.transfer)
            raise CommandError(exc.code, str(exc)) from exc

    def _start(self, t: Transfer) -> None:
        self._current = t
        self._thread = threading.Thread(target=self._run, args=(t,), name="ota", daemon=True)
        self._thread.start()

    def stats(self) -> dict[str, Any]:
        """For telemetry: the running transfer, chunks dropped on arrival, bytes waiting to be written."""
        cur = self._current
        running = cur is not None and self._thread is not None and self._thread.is_alive()
        return {
            "transfer": cur.id if running and cur is not None else None,
            "completed": self.completed,
            "chunks_dropped": self.chunks.dropped_chunks,
            "chunks_dropped_bytes": self.chunks.dropped_bytes,
            "chunks_bad": self.chunks.bad_chunks,
            "queued_bytes": self.chunks.queued_bytes,
            # an offer with shadow: the figures so far (its ota status' detail.shadow)
            "shadow": self._shadow_detail.get(cur.id) if running and cur is not None else None,
        }

    def join(self, timeout_s: float) -> None:
        """Wait, bounded, for the transfer thread once the daemon stops (it sees the stop event): a swap it
        is running must not race the interpreter's exit (seen once: an abort at exit)."""
        t = self._thread
        if t is not None and t.is_alive():
            t.join(timeout_s)
            if t.is_alive():
                logger.warning("ota: the transfer thread did not stop within %.0f s", timeout_s)

    # ---- the transfer thread ---------------------------------------------------------------
    def _run(self, t: Transfer) -> None:
        m = t.offer.manifest
        swapping = False
        try:
            pkg = self.store.renamed_in(t.offer)  # renamed in by a run that crashed before recording it
            if pkg is None:
                t.stage.mkdir(parents=True, exist_ok=True)
                for name in sorted(m.files):
                    entry = m.files[name]
                    fetch = self._fetch_url if t.urls else self.chunks.fetch
                    fetch(t, name, entry.size, entry.sha256)
                    if self._stop.is_set() or t.cancelled.is_set():
                        break
            if not t.begin_swap():  # cancelled: from here on a cancel is too late
                self._drop_cancelled(t)
                return
            if pkg is None:
                if self._stop.is_set():
                    return  # a start resumes
                self.status(t.id, OtaState.VERIFYING, model=t.ref, done=t.total, total=t.total)
                fsync_dir(t.stage)  # every file hashed and renamed to its name
                pkg = self.store.adopt(t.offer, t.stage, detect())
            if self._stop.is_set():  # a swap now would race the shutdown (seen: an abort at exit); a start resumes
                return
            self.status(t.id, OtaState.INSTALLING, model=t.ref, done=t.total, total=t.total)
            if pkg is None:
                shutil.rmtree(t.folder, ignore_errors=True)  # gone before a status says so (a reader may look)
                self.status(t.id, OtaState.UNCHANGED, model=t.ref)
            else:
                swapping = True  # from here the model manager reports a refusal itself
                ask = self._asks.get(t.folder.name)
                stage = self._stages.get(t.folder.name)
                if stage is not None:  # a cascade stage's version (cascade/swap.py)
                    result = self._installer.install_stage(pkg, stage, t.id)
                elif ask is None:
                    result = self._installer.install_staged(pkg, t.id)
                else:
                    shadowed = self._installer.shadow_staged(pkg, t.id, ask, self._shadowing(t), self._stop)
                    if shadowed is None:
                        return  # stopped while shadowing: a start resumes (and shadows again)
                    result = {**shadowed, **self._shadow_detail.pop(t.id, {})}  # the verdict's figures
                shutil.rmtree(t.folder, ignore_errors=True)
                self.status(t.id, OtaState.PROBATION, model=t.ref, done=t.total, total=t.total, detail=result)
            self.completed += 1
        except EdgedError as exc:
            if t.cancelled.is_set() and not swapping:  # failed as the cancel came (its deadline, say): cancelled
                self._drop_cancelled(t)
                return
            logger.error("ota: transfer %s of %s refused: %s", t.id, t.ref, exc)
            # what arrived is kept: the same package offered again resumes
            stalled = exc.code in (Code.STALLED, Code.DOWNLOAD_FAILED)
            detail = self._shadow_detail.pop(t.id, None)  # a shadow's verdict: its figures
            if not stalled:  # gone before the status says so: whoever reads it finds the device as it was
                shutil.rmtree(t.folder, ignore_errors=True)
            self.status(t.id, OtaState.FAILED if stalled else OtaState.REJECTED, model=t.ref, error=exc, detail=detail)
            if not swapping:
                self._installer.rejected(t.ref, exc, t.id)
        except Exception as exc:  # a thread boundary: report it, keep what arrived for a resume
            logger.exception("ota: transfer %s failed", t.id)
            failure = EdgedError(f"{type(exc).__name__}: {exc}", code=Code.FAILED)
            self.status(t.id, OtaState.FAILED, model=t.ref, error=failure)

    def _shadowing(self, t: Transfer) -> Any:
        """The shadow's progress: ``shadowing`` with the figures so far; the verdict's figures are kept for the
        status that follows (``probation`` carries them in the install result, ``rejected`` in `detail`)."""

        def progress(state: str, summary: dict[str, Any]) -> None:
            self._shadow_detail[t.id] = summary
            if state == "running":
                self.status(t.id, OtaState.SHADOWING, model=t.ref, done=t.total, total=t.total, detail=summary)

        return progress

    def _drop_cancelled(self, t: Transfer) -> None:
        """The cancel command stopped `t`: its files are dropped (nothing resumes it) and ``cancelled`` said."""
        had = t.have
        shutil.rmtree(t.folder, ignore_errors=True)
        logger.warning(
            "ota: transfer %s of %s cancelled at %d of %d bytes; its files dropped", t.id, t.ref, had, t.total
        )
        self.status(t.id, OtaState.CANCELLED, model=t.ref, done=had, total=t.total)

    def _downloading(self, t: Transfer) -> None:
        self.status(t.id, OtaState.DOWNLOADING, model=t.ref, done=t.have, total=t.total)

    # ---- files over HTTP(S) (the offer named their URLs) -------------------------------------
    def _check_urls(self, args: OfferArgs, files: set[str]) -> None:
        """An offer with URLs names every file of its manifest and no other; TLS settings that do not load
        refuse it (the operator's mistake, said at once rather than at the first download)."""
        if args.urls is None:
            return
        missing, unknown = sorted(files - set(args.urls)), sorted(set(args.urls) - files)
        if missing or unknown:
            raise CommandError(
                Code.INVALID_ARGUMENTS,
                f"urls must name every file of the manifest and no other: missing {missing}, unknown {unknown}",
            )
        if self._http is None:
            try:
                self._http = Downloader(self.cfg, self._stop)
            except EdgedError as exc:  # ota.http_ca_file unreadable or not PEM
                raise CommandError(exc.code, str(exc)) from exc

    def _fetch_url(self, t: Transfer, name: str, size: int, sha256: str) -> None:
        """Download one file from its URLs into ``<name>.part`` (`Downloader`: resumed from the bytes held),
        fsynced and recorded every MiB or second, so a restart resumes near where it stopped; reported on
        ota/status like chunks, each retry with its error."""
        if self._http is None:  # a transfer resumed at start
            self._http = Downloader(self.cfg, self._stop)
        part = PartFile(t.stage, name, size, t.progress.get(name, 0))
        others = t.have - min(t.progress.get(name, 0), size)
        last = {"saved": time.monotonic(), "status": 0.0}

        def record() -> None:
            t.progress[name] = part.sync()
            t.save()
            last["saved"] = time.monotonic()

        def on_bytes() -> None:
            now = time.monotonic()
            if part.done - part.synced >= PROGRESS_EVERY or now - last["saved"] >= 1.0 or part.done == size:
                record()
            if now - last["status"] >= 0.5 or part.done == size:
                self.status(t.id, OtaState.DOWNLOADING, model=t.ref, done=others + part.done, total=t.total)
                last["status"] = now

        def on_retry(error: str, wait_s: float) -> None:
            detail = {"file": name, "at": part.done, "error": error[:300], "retry_in_s": round(wait_s, 1)}
            self.status(t.id, OtaState.DOWNLOADING, model=t.ref, done=others + part.done, total=t.total, detail=detail)

        try:
            self._http.fetch(lambda: t.urls[name], part, on_bytes, on_retry, t.cancelled)  # a join may bring new URLs
            if part.done < size:
                return  # stopping (what arrived is kept for a resume) or cancelled (dropped by `_run`)
            t.finish(part, sha256)
        finally:
            if part.path.exists() and part.done > part.synced:
                record()  # stopping or failed: a restart resumes from every byte held
            part.close()

    def status(
        self,
        transfer: str,
        state: OtaState,
        model: ModelRef | None = None,
        done: int | None = None,
        total: int | None = None,
        error: EdgedError | None = None,
        detail: dict[str, Any] | None = None,
        by: str | None = None,
    ) -> None:
        doc = status_doc(transfer, state, model, done, total, error, detail, by)
        payload = json.dumps(doc).encode()
        if not self._link.publish_direct(self._link.topic(topics.OTA_STATUS), payload, qos=1, retain=True):
            logger.warning("ota: transfer %s: status %s not sent (broker away or the MQTT queue full)", transfer, state)
