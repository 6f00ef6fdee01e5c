"""Over-the-air model transfer, the device's side (DESIGN §6). MQTT carries all of it.

    pusher ── cmd/ota {transfer, manifest, sig} ──> device: every manifest check first (store.check_offer)
    device ── ota/req {transfer, file, offset, length} ──> pusher       (a window of chunk requests)
    pusher ── ota/data [2-byte header length][header JSON][bytes] ──> device
    device ── ota/status {transfer, state, bytes, total, error} ──> pusher   (QoS 1, retained)

(The framing, the offer's format and the states are the wire contract's: `edged.protocol.ota`.)

The device asks only for bytes inside each file's declared size and writes a chunk only where it
asked, so nothing is ever written past a declared size. A chunk is checked on arrival, on paho's
network thread, against the requests in flight (transfer, file, offset, length): anything nobody
asked for (junk with no transfer running, a stale or duplicate answer) is dropped there and counted,
so it is never held; what waits for the transfer thread is bounded in bytes. Progress (bytes fsynced per file) is kept
under ``<state_dir>/ota/<manifest sha256[:16]>/`` and survives a broker outage (requests are asked
again after `ota.retry_s` of silence plus a full-jitter backoff up to `MAX_REASK_S`, so devices that
lost the broker together do not all ask again at once) and a daemon restart (the transfer resumes at
start, from the persisted offsets, after checking the offer again). When every file is in, each is checked against its
sha256, the package is staged through the store (the same checks as a local install) and handed to
the model manager, which swaps it in on probation. States: accepted, downloading, verifying,
installing, probation (success), unchanged (already current: a no-op), rejected (a check refused
it), failed (the transfer could not complete), joined (the same package was offered again while
it downloaded: the transfer carries on under the newer offer's id, named in `by`).

A join (a second `edged push` of the package, or a pusher taking its transfer back) moves the
requests in flight to the new id and asks them again at once, so the transfer does not stall for
`retry_s`; chunks already accepted under the old id are still written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paho.mqtt.client import MQTTMessage

from edged.errors import Code, CommandError, EdgedError, PackageError, ProtocolError
from edged.models.compat import detect
from edged.models.package import MANIFEST, sha256_file
from edged.models.signing import SIG_FILE, TrustStore
from edged.models.store import Offer, Store, write_atomic
from edged.protocol import topics
from edged.protocol.backoff import Backoff
from edged.protocol.ota import (
    MAX_HEADER_BYTES,
    MAX_OFFER_BYTES,
    ChunkRequest,
    OfferArgs,
    OtaState,
    chunk_key,
    offer_payload,
    status_doc,
)

from .config import OtaConfig

__all__ = ["MAX_OFFER_BYTES", "OfferArgs", "OtaReceiver", "Transfer"]  # the offer's format: edged.protocol.ota

logger = logging.getLogger(__name__)

PROGRESS_EVERY = 1 << 20  # fsync and persist progress at least every MiB
MAX_REASK_S = 60.0  # the most the jittered part of the wait before asking again can grow to
DROP_LOG_EVERY_S = 60.0  # at most one log line a minute about chunks dropped on arrival


@dataclass
class _Chunk:
    transfer: str
    file: str
    offset: int
    data: bytes


class Transfer:
    """One offered package's download: its folder, its offer and its persisted progress."""

    def __init__(self, folder: Path, transfer: str, offer: Offer) -> None:
        self.folder = folder
        self.id = transfer
        self.former: set[str] = set()  # ids this transfer ran under before a newer offer joined it
        self.offer = offer
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

    def save(self) -> None:
        write_atomic(self.folder / "progress.json", json.dumps(self.progress).encode())


class OtaReceiver:
    def __init__(
        self,
        cfg: OtaConfig,
        store: Store,
        keys_dir: Path,
        publish: Callable[[str, bytes, int, bool], bool],
        topic: Callable[[str], str],
        install: Callable[[Path, str], dict[str, Any]],
        rejected: Callable[[str | None, EdgedError, str], None],
        stop: threading.Event,
    ) -> None:
        """`publish(topic, payload, qos, retain)`; `topic(suffix)` is the device's topic; `install(stage,
        transfer)` swaps a staged package in (ModelManager.install_staged, which reports its own refusals)
        and raises when refused; `rejected(ref or None, error, transfer)` reports a refusal before that."""
        self.cfg = cfg
        self.store = store
        self.keys_dir = keys_dir
        self.root = store.state_dir / "ota"
        self._publish = publish
        self._topic = topic
        self._install = install
        self._rejected = rejected
        self._stop = stop
        self._chunks: queue.Queue[_Chunk] = queue.Queue()
        # What the transfer thread asked for and has not received: (transfer, file, offset) -> length. The
        # network thread queues only these, so nothing unasked-for is ever held (bounded in bytes too).
        self._wanted: dict[tuple[str, str, int], int] = {}
        self._queued_bytes = 0
        self.max_queued_bytes = 2 * cfg.window * cfg.chunk_kb * 1024
        self._want_lock = threading.Lock()
        self._lock = threading.Lock()
        self._current: Transfer | None = None
        self._thread: threading.Thread | None = None
        self.bad_chunks = 0  # asked for, but the wrong length (never written)
        self.dropped_chunks = 0  # not asked for (no transfer, another transfer, a stale or unknown chunk)
        self.dropped_bytes = 0
        self._dropped_logged = (0.0, 0)  # (monotonic time, dropped_chunks) of the last log line
        self.completed = 0

    @property
    def max_message_bytes(self) -> int:
        """The largest legitimate message on ota/data: a whole chunk and the longest header its framing allows."""
        return self.cfg.chunk_kb * 1024 + 2 + MAX_HEADER_BYTES

    # ---- the offer (command thread) --------------------------------------------------------
    def offer(self, args: OfferArgs) -> dict[str, Any]:
        manifest_bytes, sig_bytes = args.decode()
        where = f"offer {args.transfer}"
        try:
            offer = self.store.check_offer(manifest_bytes, sig_bytes, TrustStore.load(self.keys_dir), where, detect())
        except PackageError as exc:
            self.status(args.transfer, OtaState.REJECTED, error=exc)
            self._rejected(None, exc, args.transfer)
            raise CommandError(exc.code, str(exc)) from exc
        m = offer.manifest
        if offer.same_version:
            self.status(args.transfer, OtaState.UNCHANGED, model=(m.name, m.version))
            return {"state": OtaState.UNCHANGED, "model": {"name": m.name, "version": m.version}}
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
                raise CommandError(
                    Code.BUSY, f"a transfer of {cur.offer.manifest.name}@{cur.offer.manifest.version} runs"
                )
            folder = self.root / key
            for other in self.root.glob("*") if self.root.is_dir() else []:
                if other.name != key:
                    shutil.rmtree(other, ignore_errors=True)  # one transfer at a time: an older offer is dropped
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / "offer.json", offer_payload(args))
            t = Transfer(folder, args.transfer, offer)
            self._start(t)
            return self._accepted(t)

    def _join(self, t: Transfer, args: OfferArgs) -> None:
        """Carry on with the running transfer `t` under the newer offer's id: say so on the old id's status,
        and ask the requests in flight again under the new id (its pusher serves only its own id; answers
        under the old one are dropped on arrival, and waiting for them would cost `retry_s`)."""
        with self._want_lock:  # against _ask: a request is in _wanted under the id it is published with
            old, t.id = t.id, args.transfer
            t.former.add(old)
            moved = [(f, off, n) for (tr, f, off), n in self._wanted.items() if tr == old]
            for f, off, n in moved:
                del self._wanted[(old, f, off)]
                self._wanted[(t.id, f, off)] = n
        write_atomic(t.folder / "offer.json", offer_payload(args))  # a restart resumes under the new id
        m = t.offer.manifest
        logger.info("ota: transfer %s of %s@%d joined by %s (a new offer of it)", old, m.name, m.version, t.id)
        self.status(old, OtaState.JOINED, model=(m.name, m.version), done=t.have, total=t.total, by=t.id)
        for f, off, n in moved:
            req = ChunkRequest(transfer=t.id, file=f, offset=off, length=n)
            self._publish(self._topic(topics.OTA_REQUEST), req.payload(), 0, False)

    def _accepted(self, t: Transfer) -> dict[str, Any]:
        m = t.offer.manifest
        self.status(t.id, OtaState.ACCEPTED, model=(m.name, m.version), done=t.have, total=t.total)
        return {
            "state": OtaState.ACCEPTED,
            "model": {"name": m.name, "version": m.version},
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
            t = Transfer(folder, args.transfer, offer)
            logger.info(
                "ota: resuming transfer %s of %s@%d at %d of %d bytes",
                t.id,
                offer.manifest.name,
                offer.manifest.version,
                t.have,
                t.total,
            )
            with self._lock:
                self._start(t)
            return

    def _start(self, t: Transfer) -> None:
        self._current = t
        self._thread = threading.Thread(target=self._run, args=(t,), name="ota", daemon=True)
        self._thread.start()

    # ---- chunks (paho's network thread: check the header, queue only what was asked for) -----
    def on_data(self, msg: MQTTMessage) -> None:
        payload = msg.payload
        try:
            key, start = chunk_key(payload)
        except ProtocolError:
            self._drop(len(payload), "malformed")
            return
        size = len(payload) - start
        with self._want_lock:
            length = self._wanted.get(key)
            if length is None:
                drop = "not asked for"
            elif size != length:  # asked for, the wrong length: never written; the transfer asks again
                drop = ""
                del self._wanted[key]
                self.bad_chunks += 1
            elif self._queued_bytes + size > self.max_queued_bytes:
                drop = "queue full"
            else:
                drop = ""
                del self._wanted[key]
                self._queued_bytes += size
        if drop:
            self._drop(len(payload), drop)  # asked for again after retry_s when it was wanted
            return
        data = bytes(payload[start:]) if length == size else b""  # b"": the wrong length, never written
        self._chunks.put_nowait(_Chunk(*key, data))

    def _drop(self, nbytes: int, why: str) -> None:
        self.dropped_chunks += 1
        self.dropped_bytes += nbytes
        now = time.monotonic()
        last_t, last_n = self._dropped_logged
        if now - last_t >= DROP_LOG_EVERY_S:
            self._dropped_logged = (now, self.dropped_chunks)
            logger.warning(
                "ota: dropped %d chunk(s) on ota/data since the last report (this one %s, %d bytes); %d dropped in all",
                self.dropped_chunks - last_n,
                why,
                nbytes,
                self.dropped_chunks,
            )

    def stats(self) -> dict[str, Any]:
        """For telemetry: the running transfer, chunks dropped on arrival, bytes waiting to be written."""
        cur = self._current
        running = cur is not None and self._thread is not None and self._thread.is_alive()
        return {
            "transfer": cur.id if running and cur is not None else None,
            "completed": self.completed,
            "chunks_dropped": self.dropped_chunks,
            "chunks_dropped_bytes": self.dropped_bytes,
            "chunks_bad": self.bad_chunks,
            "queued_bytes": self._queued_bytes,
        }

    def _forget(self) -> None:
        """Stop wanting the requests in flight (one transfer runs at a time): late answers are dropped."""
        with self._want_lock:
            self._wanted.clear()

    # ---- the transfer thread ---------------------------------------------------------------
    def _run(self, t: Transfer) -> None:
        m = t.offer.manifest
        ref = (m.name, m.version)
        swapping = False
        try:
            for name in sorted(m.files):
                self._fetch(t, name, m.files[name].size)
                if self._stop.is_set():
                    return
            self.status(t.id, OtaState.VERIFYING, model=ref, done=t.total, total=t.total)
            for name, entry in m.files.items():
                part = t.folder / f"{name}.part"
                if part.exists():
                    if sha256_file(part) != entry.sha256:
                        part.unlink()
                        t.progress.pop(name, None)
                        t.save()
                        raise PackageError(
                            f"{m.name}@{m.version}: {name}: sha256 does not match the manifest (corrupt or "
                            "tampered in transit); the file is discarded",
                            code=Code.HASH_MISMATCH,
                        )
                    os.replace(part, t.folder / name)
            write_atomic(t.folder / MANIFEST, t.offer.manifest_bytes)
            write_atomic(t.folder / SIG_FILE, t.offer.sig_bytes)
            self.status(t.id, OtaState.INSTALLING, model=ref, done=t.total, total=t.total)
            _, stage = self.store.stage(t.folder, TrustStore.load(self.keys_dir), detect())
            if stage is None:
                self.status(t.id, OtaState.UNCHANGED, model=ref)
            else:
                swapping = True  # from here the model manager reports a refusal itself
                result = self._install(stage, t.id)
                self.status(t.id, OtaState.PROBATION, model=ref, done=t.total, total=t.total, detail=result)
            self.completed += 1
            shutil.rmtree(t.folder, ignore_errors=True)
        except EdgedError as exc:
            logger.error("ota: transfer %s of %s@%d refused: %s", t.id, m.name, m.version, exc)
            stalled = exc.code == Code.STALLED  # what arrived is kept: the same package offered again resumes
            self.status(t.id, OtaState.FAILED if stalled else OtaState.REJECTED, model=ref, error=exc)
            if not swapping:
                self._rejected(f"{m.name}@{m.version}", exc, t.id)
            if not stalled:
                shutil.rmtree(t.folder, ignore_errors=True)
        except Exception as exc:  # a thread boundary: report it, keep what arrived for a resume
            logger.exception("ota: transfer %s failed", t.id)
            failure = EdgedError(f"{type(exc).__name__}: {exc}", code=Code.FAILED)
            self.status(t.id, OtaState.FAILED, model=ref, error=failure)

    def _fetch(self, t: Transfer, name: str, size: int) -> None:
        part = t.folder / f"{name}.part"
        if (t.folder / name).exists():  # renamed in by a run that stopped before installing
            os.replace(t.folder / name, part)
        done = min(t.progress.get(name, 0), size)
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, done)  # bytes past the last persisted offset may be torn: fetch them again
            chunk_bytes = self.cfg.chunk_kb * 1024
            asked: dict[int, int] = {}  # offset -> length, in flight
            next_off = done
            last_data = last_ask = time.monotonic()
            reask = Backoff(self.cfg.retry_s, max(self.cfg.retry_s, MAX_REASK_S))
            quiet_s = self.cfg.retry_s + reask.next_s()  # jittered: a fleet offered together asks again apart
            since_save = 0
            last_status = 0.0
            m = t.offer.manifest
            while done < size and not self._stop.is_set():
                while len(asked) < self.cfg.window and next_off < size:
                    n = min(chunk_bytes, size - next_off)
                    self._ask(t, name, next_off, n)
                    asked[next_off] = n
                    next_off += n
                    last_ask = time.monotonic()
                try:
                    c = self._chunks.get(timeout=0.25)
                    with self._want_lock:
                        self._queued_bytes -= len(c.data)
                except queue.Empty:
                    now = time.monotonic()
                    if now - last_data > self.cfg.give_up_s:
                        raise EdgedError(
                            f"no data for {self.cfg.give_up_s:.0f} s; {t.have} of {t.total} bytes kept for a resume",
                            code=Code.STALLED,
                        ) from None
                    if now - last_ask > quiet_s:  # lost requests or chunks (broker away?): ask again
                        quiet_s = self.cfg.retry_s + reask.next_s()
                        asked.clear()
                        self._forget()
                        next_off = done
                    continue
                ours = c.transfer == t.id or c.transfer in t.former  # accepted before a newer offer joined
                if not ours or c.file != name or c.offset != done or c.offset not in asked:
                    continue  # a duplicate, a stale answer, another transfer's chunk
                if len(c.data) != asked[c.offset] or c.offset + len(c.data) > size:
                    asked.clear()  # the wrong length (on_data counted it): ask again from here
                    self._forget()
                    next_off = done
                    continue  # never written: only the bytes asked for, inside the declared size
                os.pwrite(fd, c.data, c.offset)
                del asked[c.offset]
                done += len(c.data)
                since_save += len(c.data)
                last_data = time.monotonic()
                if reask.failures > 1:  # answered again after asking again: back to the first step
                    reask.reset()
                    quiet_s = self.cfg.retry_s + reask.next_s()
                if since_save >= PROGRESS_EVERY or done == size:
                    os.fsync(fd)
                    t.progress[name] = done
                    t.save()
                    since_save = 0
                if last_data - last_status >= 0.5 or done == size:
                    self.status(t.id, OtaState.DOWNLOADING, model=(m.name, m.version), done=t.have, total=t.total)
                    last_status = last_data
        finally:
            self._forget()
            os.close(fd)

    def _ask(self, t: Transfer, name: str, offset: int, length: int) -> None:
        with self._want_lock:  # the id read under the lock: a join moves what is in _wanted and asks it again
            req = ChunkRequest(transfer=t.id, file=name, offset=offset, length=length)
            self._wanted[(t.id, name, offset)] = length
        self._publish(self._topic(topics.OTA_REQUEST), req.payload(), 0, False)

    def status(
        self,
        transfer: str,
        state: OtaState,
        model: tuple[str, int] | None = None,
        done: int | None = None,
        total: int | None = None,
        error: EdgedError | None = None,
        detail: dict[str, Any] | None = None,
        by: str | None = None,
    ) -> None:
        doc = status_doc(transfer, state, model, done, total, error, detail, by)
        self._publish(self._topic(topics.OTA_STATUS), json.dumps(doc).encode(), 1, True)
