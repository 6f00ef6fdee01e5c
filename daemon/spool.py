"""The durable spool: messages wait in SQLite (WAL) until the broker acknowledges them.

The publisher thread owns the connection (one thread, no locks). A message is appended, committed
in groups every `commit_interval_ms` (synchronous=FULL: a commit is on disk when it returns), handed
to paho, and deleted only when its PUBACK arrives. After a crash or a restart every row still here
is published again (QoS 1 is at-least-once: consumers dedupe on boot_id + seq). Bounded by bytes and
age: the oldest rows are dropped first, and counted.

Loss window: on power loss or a crash of the process, the results of at most the last
`commit_interval_ms` that were not yet committed; nothing that was committed. Deletes are not synced
to disk at once: after a power cut, some acknowledged messages may be sent again (duplicates, which
consumers drop by boot_id + seq), never fewer.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    created REAL NOT NULL,
    size INTEGER NOT NULL
)
"""


@dataclass(frozen=True)
class Row:
    id: int
    topic: str
    payload: bytes
    qos: int


class Spool:
    def __init__(self, path: Path, max_bytes: int, max_age_s: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(SCHEMA)
        self.bytes, self.rows = self.db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM messages").fetchone()
        self.dropped = 0  # rows dropped by the byte or age bound since start
        self._pending: list[tuple[str, bytes, int, float, int]] = []
        if self.rows:
            logger.info(
                "spool: %d messages (%.1f MB) from before this start will be sent", self.rows, self.bytes / 2**20
            )

    @property
    def pending_commit(self) -> int:
        return len(self._pending)

    def append(self, topic: str, payload: bytes, qos: int) -> None:
        self._pending.append((topic, payload, qos, time.time(), len(payload)))

    def commit(self) -> None:
        """Write what was appended since the last commit, then enforce the bounds."""
        if self._pending:
            self.db.execute("PRAGMA synchronous=FULL")  # on disk when commit() returns
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO messages (topic, payload, qos, created, size) VALUES (?, ?, ?, ?, ?)", self._pending
            )
            self.db.execute("COMMIT")
            self.rows += len(self._pending)
            self.bytes += sum(p[4] for p in self._pending)
            self._pending.clear()
        self._enforce()

    def _enforce(self) -> None:
        dropped = 0
        if self.max_age_s and self.rows:
            cur = self.db.execute("DELETE FROM messages WHERE created < ?", (time.time() - self.max_age_s,))
            dropped += cur.rowcount
        if self.bytes > self.max_bytes:
            # drop the oldest rows until what is left fits
            excess = self.bytes - self.max_bytes
            cut = self.db.execute(
                "SELECT id FROM (SELECT id, SUM(size) OVER (ORDER BY id) AS running FROM messages) "
                "WHERE running >= ? ORDER BY id LIMIT 1",
                (excess,),
            ).fetchone()
            if cut is not None:
                dropped += self.db.execute("DELETE FROM messages WHERE id <= ?", (cut[0],)).rowcount
        if dropped:
            self.dropped += dropped
            self.bytes, self.rows = self.db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM messages").fetchone()
            logger.warning("spool: over its bounds, dropped the %d oldest messages (%d so far)", dropped, self.dropped)

    def after(self, last_id: int, limit: int) -> list[Row]:
        """Committed rows with id > last_id, oldest first."""
        return [
            Row(*r)
            for r in self.db.execute(
                "SELECT id, topic, payload, qos FROM messages WHERE id > ? ORDER BY id LIMIT ?", (last_id, limit)
            )
        ]

    def delete(self, ids: list[int]) -> None:
        if not ids:
            return
        # A delete lost to a power cut only means the message is sent once more (at-least-once), so
        # deletes do not wait for the disk (WAL, synchronous=NORMAL: durable at the next checkpoint).
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("BEGIN")
        for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):
            marks = ",".join("?" * len(chunk))
            for (size,) in self.db.execute(f"DELETE FROM messages WHERE id IN ({marks}) RETURNING size", chunk):  # noqa: S608
                self.bytes -= size
                self.rows -= 1
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.commit()
        self.db.close()
