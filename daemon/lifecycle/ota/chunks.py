"""A package file in chunks over MQTT, the device's side of OTA's default path (DESIGN §6); the
receiver (`lifecycle.ota`) hands each file here unless the offer named its URLs (`ota.download`).

    device ── ota/req {transfer, file, offset, length} ──> pusher       (a window of chunk requests)
    pusher ── ota/data [2-byte header length][header JSON][bytes] ──> device

(The framing is the wire contract's: `edged.protocol.ota`.)

The device asks only for bytes inside each file's declared size and writes a chunk only where it
asked, so nothing is ever written past a declared size. A chunk is checked on arrival, on paho's
network thread, against the requests in flight (transfer, file, offset, length): anything nobody
asked for (junk with no transfer running, a stale or duplicate answer) is dropped there and counted,
so it is never held; what waits for the transfer thread is bounded in bytes. Chunks are written in
order through a `PartFile` (hashed as they are written) and the progress is recorded every
`PROGRESS_EVERY` bytes (`ota.transfer`). A broker outage is survived: requests are asked again after
`ota.retry_s` of silence plus a full-jitter backoff up to `MAX_REASK_S`, so devices that lost the broker
together do not all ask again at once.

The cancel command stops a fetch within a quarter second (`Transfer.cancelled`, checked between
chunks); the receiver then drops the files.

A join (the same package offered again under a new transfer id) moves the requests in flight to the
new id (`ChunkFetcher.rename`) and the receiver asks them again at once, so the transfer does not stall
for `retry_s`; chunks already accepted under the old id are still written.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from paho.mqtt.client import MQTTMessage

from edged.errors import Code, EdgedError, ProtocolError
from edged.protocol import topics
from edged.protocol.backoff import Backoff
from edged.protocol.ota import MAX_HEADER_BYTES, ChunkRequest, chunk_key

from ...config import OtaConfig
from .download import PartFile
from .transfer import PROGRESS_EVERY, Transfer

__all__ = ["DROP_LOG_EVERY_S", "MAX_REASK_S", "ChunkFetcher", "OtaLink"]

logger = logging.getLogger(__name__)

MAX_REASK_S = 60.0  # the most the jittered part of the wait before asking again can grow to
DROP_LOG_EVERY_S = 60.0  # at most one log line a minute about chunks dropped on arrival


class OtaLink(Protocol):
    """Where the receiver talks: the device's MQTT session (delivery.publisher.Publisher)."""

    def topic(self, suffix: str) -> str: ...

    def publish_direct(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool: ...


@dataclass
class _Chunk:
    transfer: str
    file: str
    offset: int
    data: bytes


class ChunkFetcher:
    """Asks for a file's chunks (a window of requests), takes the answers on paho's network thread, and
    writes them in order on the transfer thread; `progress(t)` reports each step on ota/status."""

    def __init__(
        self, cfg: OtaConfig, link: OtaLink, stop: threading.Event, progress: Callable[[Transfer], None]
    ) -> None:
        self.cfg = cfg
        self._link = link
        self._stop = stop
        self._progress = progress
        self._chunks: queue.Queue[_Chunk] = queue.Queue()
        # What the transfer thread asked for and has not received: (transfer, file, offset) -> length. The
        # network thread queues only these, so nothing unasked-for is ever held (bounded in bytes too).
        self._wanted: dict[tuple[str, str, int], int] = {}
        self.queued_bytes = 0
        self.max_queued_bytes = 2 * cfg.window * cfg.chunk_kb * 1024
        self._want_lock = threading.Lock()
        self.bad_chunks = 0  # asked for, but the wrong length (never written)
        self.dropped_chunks = 0  # not asked for (no transfer, another transfer, a stale or unknown chunk)
        self.dropped_bytes = 0
        self._dropped_logged = (0.0, 0)  # (monotonic time, dropped_chunks) of the last log line

    @property
    def max_message_bytes(self) -> int:
        """The largest legitimate message on ota/data: a whole chunk and the longest header its framing allows."""
        return self.cfg.chunk_kb * 1024 + 2 + MAX_HEADER_BYTES

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
            elif self.queued_bytes + size > self.max_queued_bytes:
                drop = "queue full"
            else:
                drop = ""
                del self._wanted[key]
                self.queued_bytes += size
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

    # ---- requests (the transfer thread asks; a join, on the command thread, moves them) ------
    def _ask(self, t: Transfer, name: str, offset: int, length: int) -> None:
        with self._want_lock:  # the id read under the lock: a join moves what is in _wanted and asks it again
            req = ChunkRequest(transfer=t.id, file=name, offset=offset, length=length)
            self._wanted[(t.id, name, offset)] = length
        self.request(req)

    def request(self, req: ChunkRequest) -> None:
        self._link.publish_direct(self._link.topic(topics.OTA_REQUEST), req.payload(), qos=0, retain=False)

    def rename(self, t: Transfer, new_id: str) -> list[ChunkRequest]:
        """`t` carries on under `new_id` (its old id kept in `t.former`): the requests in flight move to the
        new id, returned for the caller to ask again (the new pusher serves only its own id; answers under
        the old one are dropped on arrival, and waiting for them would cost `retry_s`)."""
        with self._want_lock:  # against _ask: a request is in _wanted under the id it is published with
            old, t.id = t.id, new_id
            t.former.add(old)
            moved = [(f, off, n) for (tr, f, off), n in self._wanted.items() if tr == old]
            for f, off, n in moved:
                del self._wanted[(old, f, off)]
                self._wanted[(t.id, f, off)] = n
        return [ChunkRequest(transfer=new_id, file=f, offset=off, length=n) for f, off, n in moved]

    def _forget(self) -> None:
        """Stop wanting the requests in flight (one transfer runs at a time): late answers are dropped."""
        with self._want_lock:
            self._wanted.clear()

    # ---- one file (the transfer thread) ------------------------------------------------------
    def fetch(self, t: Transfer, name: str, size: int, sha256: str) -> None:
        """Download one file into ``<name>.part``, hashing each chunk as it is written (in order), and rename
        it to its name only when its sha256 is the signed manifest's: the file is never read again here."""
        part = PartFile(t.stage, name, size, t.progress.get(name, 0))
        try:
            chunk_bytes = self.cfg.chunk_kb * 1024
            asked: dict[int, int] = {}  # offset -> length, in flight
            next_off = part.done
            last_data = last_ask = time.monotonic()
            reask = Backoff(self.cfg.retry_s, max(self.cfg.retry_s, MAX_REASK_S))
            quiet_s = self.cfg.retry_s + reask.next_s()  # jittered: a fleet offered together asks again apart
            since_save = 0
            last_status = 0.0
            while part.done < size and not self._stop.is_set() and not t.cancelled.is_set():
                while len(asked) < self.cfg.window and next_off < size:
                    n = min(chunk_bytes, size - next_off)
                    self._ask(t, name, next_off, n)
                    asked[next_off] = n
                    next_off += n
                    last_ask = time.monotonic()
                try:
                    c = self._chunks.get(timeout=0.25)
                    with self._want_lock:
                        self.queued_bytes -= len(c.data)
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
                        next_off = part.done
                    continue
                ours = c.transfer == t.id or c.transfer in t.former  # accepted before a newer offer joined
                if not ours or c.file != name or c.offset != part.done or c.offset not in asked:
                    continue  # a duplicate, a stale answer, another transfer's chunk
                if len(c.data) != asked[c.offset] or c.offset + len(c.data) > size:
                    asked.clear()  # the wrong length (on_data counted it): ask again from here
                    self._forget()
                    next_off = part.done
                    continue  # never written: only the bytes asked for, inside the declared size
                part.write(c.data)  # in order: chunks are written only at `done`
                del asked[c.offset]
                since_save += len(c.data)
                last_data = time.monotonic()
                if reask.failures > 1:  # answered again after asking again: back to the first step
                    reask.reset()
                    quiet_s = self.cfg.retry_s + reask.next_s()
                if since_save >= PROGRESS_EVERY or part.done == size:
                    t.progress[name] = part.sync()
                    t.save()
                    since_save = 0
                if last_data - last_status >= 0.5 or part.done == size:
                    self._progress(t)
                    last_status = last_data
            if part.done < size:
                return  # stopping (what arrived is kept for a resume) or cancelled (the receiver drops it)
            t.finish(part, sha256)
        finally:
            self._forget()
            part.close()
