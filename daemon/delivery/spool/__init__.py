"""The durable spool: messages wait in SQLite (WAL) until the broker acknowledges them.

The publisher thread owns the connection (one thread, no locks). A message is appended, committed
in groups every `commit_interval_ms` (synchronous=FULL: a commit is on disk when it returns), handed
to paho, and deleted only when its PUBACK arrives. After a crash or a restart every row still here
is published again (QoS 1 is at-least-once: consumers dedupe on boot_id + seq). Bounded by bytes and
age: the oldest rows are dropped first, and counted.

Loss window: on power loss or a crash of the process, the results of at most the last
`commit_interval_ms` that were not yet committed; nothing that was committed. Deletes are not synced
to disk at once: an acknowledged message leaves the file with the next commit (at most
`commit_interval_ms` later, in the same transaction as that commit's inserts, so that the table's
tail page is written once per batch, not twice), and that commit is synced only if it has inserts.
So after a power cut or a crash, some acknowledged messages may be sent again (duplicates, which
consumers drop by boot_id + seq), never fewer.

Flash wear: a commit writes the pages it changes to the WAL (4 kB each) and syncs it. The spool
keeps that to about one page per batch: the deletes ride in the commit, row ids come from the spool
rather than AUTOINCREMENT (whose sqlite_sequence page would be rewritten with every commit), and the
clock is saved once a minute rather than with every commit (the newest row carries it across a crash;
a commit that deletes the newest rows while older ones wait, a refused topic's, saves it with them).

Age: `max_age_s` is judged on the spool's own clock, a monotonic clock carried across restarts in
the file (`meta.clock_s`), never on the wall clock, which jumps on boards without an RTC when NTP
sets it. Time the daemon is not running does not count toward a message's age.

Cost: nothing per commit or per send depends on how many rows wait. Rows are inserted up to 128 to a
statement, read after a cursor by id (those this process just committed, from memory), deleted by id
ranges, and the bounds cut a prefix walked from the oldest row (rows are in clock order by id); `rows`
and `bytes` are counted once at open and kept in step by every write.
Storage faults (disk full, I/O errors, a deleted, replaced or corrupt file): see file.py.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from edged.errors import SpoolCorrupt, SpoolError

from .file import CLOCK_SAVE_INTERVAL_S, SpoolFile

__all__ = ["Row", "Spool", "SpoolCorrupt", "SpoolError"]

logger = logging.getLogger(__name__)


class Row(NamedTuple):  # a tuple: built for every row sent, a frozen dataclass costs 4x as much
    id: int
    topic: str
    payload: bytes
    qos: int


INSERT_ROWS = 128  # rows per INSERT statement: 7 parameters each, within SQLite's oldest limit of 999


@functools.lru_cache(maxsize=8)
def _insert_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO messages (id, topic, payload, qos, created, size, clock_s) VALUES {values}"  # noqa: S608


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Row ids as runs of consecutive ids (first, last): PUBACKs come in order, so a few ranges."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


class Spool(SpoolFile):
    def __init__(
        self,
        path: Path,
        max_bytes: int,
        max_age_s: float,
        *,
        max_unsaved_bytes: int = 4 * 2**20,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: a monotonic clock in seconds (ages); `wall`: the wall clock (stored for information
        and naming quarantined files only). Both are seams for tests."""
        super().__init__(path, clock, wall)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.max_unsaved_bytes = max_unsaved_bytes
        self.dropped = 0  # rows dropped by the byte or age bound since start
        self.dropped_unsaved = 0  # messages never written: over max_unsaved_bytes while writes failed
        self._pending: deque[tuple[str, bytes, int, float, int, float]] = deque()
        self._pending_bytes = 0
        self._acked: set[int] = set()  # acknowledged rows not yet deleted from the file (see delete)
        self._acked_max = 0  # the highest id in _acked (0 when it is empty): after() skips them only past it
        self._dropped_upto = 0  # every row up to this id is gone from the file (the bounds cut a prefix)
        self._failing = False  # the last write failed: deletes are not deferred
        self._clock_saved = 0.0
        self._bounds_logged_at = -1e9
        path.parent.mkdir(parents=True, exist_ok=True)
        self._open_or_quarantine()
        # The rows this process committed, kept for after() (see there): every committed row with an id over
        # _unsent_floor is in _unsent, oldest first, until a read passes it or the memory bound drops it
        self._unsent: deque[Row] = deque()
        self._unsent_bytes = 0
        self._unsent_floor = self._last_id
        self._served_upto = 0  # the newest id after() has handed out from memory
        self._hold_reserve()
        if self.rows:
            logger.info(
                "spool: %d messages (%.1f MB) from before this start will be sent", self.rows, self.bytes / 2**20
            )

    # --- messages ----------------------------------------------------------------------------------
    def clock_s(self) -> float:
        """The spool's clock: seconds the daemon has run with this spool, carried across restarts."""
        return self._clock_base + self._clock() - self._clock_t0

    @property
    def pending_commit(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def last_id(self) -> int:
        """The newest committed row's id (ids never go back)."""
        return self._last_id

    def append(self, topic: str, payload: bytes, qos: int) -> None:
        """Held in memory until commit(); bounded by `max_unsaved_bytes` (the oldest go, counted)."""
        self._pending.append((topic, payload, qos, self._wall(), len(payload), self.clock_s()))
        self._pending_bytes += len(payload)
        while self._pending_bytes > self.max_unsaved_bytes and len(self._pending) > 1:
            self._pending_bytes -= self._pending.popleft()[4]
            self.dropped_unsaved += 1

    def commit(self) -> None:
        """Write what was appended since the last commit, then enforce the bounds. SpoolError when the
        storage fails: what was appended stays in memory for the next try."""
        self._ensure_open()
        self._check_file()
        if self._upgrade_pending:  # an older edged's file (see SpoolFile._upgrade)
            if self._acked:
                self._save(inserts=False)  # deliveries first: they need no new schema, and free space
            try:
                self._write("upgrade an older edged's spool file", self._upgrade)
            except SpoolError:
                self._failing = True  # new messages wait in memory; deliveries are deleted at once
                raise
        if self._pending and self._acked:
            try:
                self._save(inserts=True)
            except SpoolError:
                self._save(inserts=False)  # deliveries free space: they go through alone (with the reserve)
                self._failing = True  # the inserts still fail: later deliveries are deleted at once
                raise
        elif self._pending or self._acked:
            self._save(inserts=bool(self._pending))
        try:
            self._enforce()
        except sqlite3.Error as exc:
            self._rollback()
            raise self._error("enforce its bounds", exc) from exc
        self._hold_reserve()

    def _enforce(self) -> None:
        now = self.clock_s()
        if now - self._clock_saved >= CLOCK_SAVE_INTERVAL_S:
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock_s', ?)", (now,))
            self._clock_saved = now
        limit = min(self.max_bytes, self.fs_budget)
        if not self.rows or (self.bytes <= limit and not self.max_age_s):
            return
        dropped = self._drop_oldest(now - self.max_age_s if self.max_age_s else -1.0, self.bytes - limit)
        if dropped:
            self.dropped += dropped
            t = self._clock()
            if t >= self._bounds_logged_at + 60.0:  # a full spool drops at every commit: say so once a minute
                self._bounds_logged_at = t
                limit_s = f"{limit / 2**20:.2f} MB, {self.max_age_s:g} s"
                logger.warning(
                    "spool: over its bounds (%s), dropped the %d oldest messages (%d so far)",
                    limit_s,
                    dropped,
                    self.dropped,
                )

    def _drop_oldest(self, cutoff: float, excess: int) -> int:
        """Drop the oldest rows: those older than `cutoff` on the spool clock, and then more until `excess`
        bytes are freed. Rows are in clock order by id (see _connect), so both are a prefix of the table:
        it is walked from its head in growing chunks and cut there. The cost is that of the rows dropped,
        not of the rows kept."""
        dropped = head = 0
        chunk = 8
        while True:
            rows = self.db.execute(
                "SELECT id, size, clock_s FROM messages WHERE id > ? ORDER BY id LIMIT ?", (head, chunk)
            ).fetchall()
            cut = freed = n = 0
            for row_id, size, clock_s in rows:
                if clock_s >= cutoff and freed >= excess:
                    break
                cut, freed, n = row_id, freed + size, n + 1
            if not n:
                return dropped
            self.db.execute("DELETE FROM messages WHERE id > ? AND id <= ?", (head, cut))
            self._dropped_upto = max(self._dropped_upto, cut)
            if self._acked:  # (empty here: the commit deleted them first) never counted as in the file again
                self._acked = {i for i in self._acked if i > cut}
            self.rows -= n
            self.bytes -= freed
            excess -= freed
            dropped += n
            if n < len(rows) or len(rows) < chunk:
                return dropped
            head, chunk = cut, min(chunk * 4, 4096)

    def _save(self, inserts: bool) -> None:
        """One transaction: the deletes of acknowledged rows, then (`inserts`) the appended ones. Together,
        the table's tail page (where both happen while the broker keeps up) is written once, not twice.
        With inserts it is on disk when this returns (synchronous=FULL). Deletes alone do not wait for the
        disk (synchronous=NORMAL): a delete lost to a power cut only means a message sent once more."""
        acked = sorted(self._acked)
        now = self.clock_s()

        def write() -> tuple[int, int, bool]:
            self.db.execute(f"PRAGMA synchronous={'FULL' if inserts else 'NORMAL'}")
            self.db.execute("BEGIN IMMEDIATE")  # the write lock first: a read first could not wait for it
            freed = rows = 0
            for first, last in _runs(acked):  # per range, not per row: SQLite sums what a range frees
                size, n = self.db.execute(
                    "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM messages WHERE id >= ? AND id <= ?", (first, last)
                ).fetchone()
                if n:
                    self.db.execute("DELETE FROM messages WHERE id >= ? AND id <= ?", (first, last))
                    freed, rows = freed + size, rows + n
            clock = rows > 0 and not inserts and not self._upgrade_pending and self._older_rows_left(acked[-1])
            if clock:  # the newest row carried the clock across a crash (it is saved once a minute): now the
                # meta row does, in this transaction, or the older rows left would be judged younger
                self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock_s', ?)", (now,))
            if inserts:
                self._insert_pending()
            self.db.execute("COMMIT")
            return freed, rows, clock

        what = "write new messages" if inserts else "delete acknowledged messages"
        try:
            freed, rows, clock = self._write(what, write, may_use_reserve=not inserts)
        except SpoolError:
            self._failing = True
            raise
        self._failing = False
        if clock:
            self._clock_saved = now
        self._acked.difference_update(acked)
        if not self._acked:
            self._acked_max = 0
        self.bytes -= freed
        self.rows -= rows
        if inserts:
            self._keep_unsent()
            self._last_id += len(self._pending)
            self.rows += len(self._pending)
            self.bytes += self._pending_bytes
            self._pending.clear()
            self._pending_bytes = 0

    def _keep_unsent(self) -> None:
        """The rows just committed, for after(); bounded by half of max_unsaved_bytes (the oldest go first:
        after() reads those from the file)."""
        self._unsent.extend([Row(i, p[0], p[1], p[2]) for i, p in enumerate(self._pending, self._last_id + 1)])
        self._unsent_bytes += self._pending_bytes
        while self._unsent_bytes > self.max_unsaved_bytes // 2 and self._unsent:
            self._forget_unsent()

    def _forget_unsent(self) -> None:
        row = self._unsent.popleft()
        self._unsent_bytes -= len(row.payload)
        self._unsent_floor = row.id

    def _insert_pending(self) -> None:
        """The appended rows, INSERT_ROWS to a statement: one step of SQLite per statement, not per row. Each
        step lets go of the interpreter lock, and under load taking it back can wait for another thread's
        switch interval (5 ms): per-row steps made a group's insert the slowest part of the publisher."""
        pending, first = list(self._pending), self._last_id + 1
        for start in range(0, len(pending), INSERT_ROWS):
            chunk = pending[start : start + INSERT_ROWS]
            params: list[object] = []
            for row_id, row in enumerate(chunk, first + start):
                params.append(row_id)
                params.extend(row)
            self.db.execute(_insert_sql(len(chunk)), params)

    def _older_rows_left(self, last_deleted: int) -> bool:
        """Whether rows are left and all are older than a deleted one (one step down the id index). Left
        empty, the file needs no clock: ages only matter for the rows in it (and no page more is written
        for each delivery of a sparse stream, which empties it every time)."""
        newest = self.db.execute("SELECT id FROM messages WHERE id > 0 ORDER BY id DESC LIMIT 1").fetchone()
        return newest is not None and newest[0] < last_deleted

    def recover_corrupt(self, reason: str) -> None:
        """See SpoolFile.recover_corrupt: the rows acknowledged and not yet deleted are not lost."""
        self.rows -= len(self._acked)
        self._acked.clear()
        self._acked_max = 0
        self.forget_unsent()  # their rows are lost with the file
        super().recover_corrupt(reason)

    def after(self, last_id: int, limit: int) -> list[Row]:
        """Committed rows with id > last_id, oldest first; not those acknowledged and not yet deleted.

        Rows this process committed are read from memory while the cursor is past `_unsent_floor` (the
        sender reads each row once, right after its commit): a read from the file takes one SQLite step per
        row, and each step lets go of the interpreter lock, which under load can take milliseconds to get
        back. Older rows (from before this start, past the memory bound, or sent again after a refusal)
        come from the file."""
        self._ensure_open()
        if last_id < self._served_upto:
            # the sender went back (a refused topic's hold is over): what memory gave it since may have been
            # acknowledged and deleted meanwhile (and QoS 0 rows deleted when sent); the file knows, memory
            # does not, so it is read from there (memory takes over again past what it handed out)
            while self._unsent and self._unsent[0].id <= self._served_upto:
                self._forget_unsent()
            self._unsent_floor = max(self._unsent_floor, self._served_upto)
        if last_id >= self._unsent_floor:
            return self._after_unsent(last_id, limit)
        try:
            rows = self.db.execute(
                "SELECT id, topic, payload, qos FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                (last_id, limit + len(self._acked) if self._acked_max > last_id else limit),
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read messages", exc) from exc
        if self._acked_max <= last_id:  # the sender's cursor is past them (so no copy per read of a backlog)
            return [Row(*r) for r in rows]
        return [Row(*r) for r in rows if r[0] not in self._acked][:limit]

    def forget_unsent(self) -> None:
        """From now on after() reads every row committed so far from the file, as after a restart (benchmarks
        compare the two reads)."""
        self._unsent.clear()
        self._unsent_bytes = 0
        self._unsent_floor = self._last_id

    def _after_unsent(self, last_id: int, limit: int) -> list[Row]:
        unsent = self._unsent
        while unsent and (unsent[0].id <= last_id or unsent[0].id <= self._dropped_upto):
            self._forget_unsent()  # read past (the cursor only goes back below the floor), or cut by a bound
        skip = self._acked_max > last_id  # acknowledged rows past the cursor (a refused topic's retry)
        rows: list[Row] = []
        for row in unsent:
            if len(rows) >= limit:
                break
            if not (skip and row.id in self._acked):
                rows.append(row)
        if rows:
            self._served_upto = max(self._served_upto, rows[-1].id)
        return rows

    def delete(self, ids: list[int]) -> None:
        """Acknowledged rows: gone from after() at once, from the file with the next commit() (the publisher
        commits at least every commit_interval_ms), in the same transaction as its inserts. While the
        storage fails, at once: delivering what is spooled is what frees space."""
        # a PUBACK may come for a row the byte or age bound dropped meanwhile: it is not in the file any
        # more, and counting it as in the file would undercount what a lost file loses (close, recover_corrupt)
        ids = [i for i in ids if i > self._dropped_upto]
        if not ids:
            return
        self._ensure_open()
        self._acked.update(ids)
        self._acked_max = max(self._acked_max, *ids)
        if self._failing:
            self._save(inserts=False)

    def close(self) -> int:
        """Commit what is pending (re-creating a deleted file first) and close. Returns how many messages
        are lost because the storage failed; afterwards `rows` is what the file at `path` holds."""
        lost = 0
        try:
            self.commit()
            if self.clock_s() > self._clock_saved:
                self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock_s', ?)", (self.clock_s(),))
        except SpoolError as exc:
            lost = len(self._pending)
            try:
                st = os.stat(self.path)
                on_disk = (st.st_dev, st.st_ino) == self._ident
            except OSError:
                on_disk = False
            if not on_disk:  # the rows were only in a deleted file, which goes with this close
                lost += self.rows - len(self._acked)  # less those delivered
                self.rows = self.bytes = 0
            if lost:
                logger.error("spool: %d messages are lost at stop: %s", lost, exc)
            self.lost += lost
        except sqlite3.Error as exc:
            logger.warning("spool: the clock could not be saved at stop: %s", exc)
        finally:
            if self._open:
                self._close_db()
        return lost
