"""The spool's file and its storage faults: opening, WAL settings, the reserve, quarantine, re-creation.

`Spool` (spool/__init__.py) is the message side; this is the file under it. One connection, owned by the
publisher thread.

Faults, each raised as a `SpoolError` (the caller retries with backoff) or handled here:
- A failed write (disk full, I/O error) keeps the appended messages in memory, bounded by
  `max_unsaved_bytes` (the oldest go first, counted in `dropped_unsaved`), for the next commit.
- The file deleted or replaced under us (its path no longer names the inode we write to): the rows
  still in the open, unlinked file are copied into a new file at the path, ids kept.
- A corrupt file (at open, or a read that finds it malformed): renamed aside to
  `spool.db.corrupt-<UTC time>` (with its -wal and -shm) and a new one started; its rows are lost, counted.
- A full disk at open: an existing file is only read there (an older edged's file is upgraded by the
  first commit that can write, after that commit's deliveries), and the reserve is given up when even
  reading needs room (SQLite's -shm index), so what the file holds is still delivered.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sqlite3
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from edged.errors import SpoolCorrupt as SpoolCorrupt  # defined in edged.errors, importable here as before
from edged.errors import SpoolError as SpoolError

logger = logging.getLogger("edged.daemon.delivery.spool")
_T = TypeVar("_T")

# Row ids are handed out by the spool (`_last_id`), not by AUTOINCREMENT, which rewrites the
# sqlite_sequence page with every commit (a third of the bytes a small commit writes). The `ids` table
# keeps sqlite_sequence in the file for an older edged that reads it. A file of an older edged keeps
# its AUTOINCREMENT table until it is found empty at open.
SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    clock_s REAL NOT NULL DEFAULT 0
)
""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ids (id INTEGER PRIMARY KEY AUTOINCREMENT)",
)
CLOCK_SAVE_INTERVAL_S = 60.0  # the spool clock is saved this often (and at close); the newest row carries it too
COLUMNS = "id, topic, payload, qos, created, size, clock_s"


def _corrupt(exc: sqlite3.Error) -> bool:
    # SQLITE_CORRUPT and SQLITE_NOTADB are the plain DatabaseError; FULL, IOERR, LOCKED, READONLY
    # are OperationalError (Python 3.10 has no sqlite_errorcode to ask)
    return type(exc) is sqlite3.DatabaseError


def _full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == 13 or "disk is full" in str(exc)  # 13: SQLITE_FULL


def _set_sequence(db: sqlite3.Connection, last_id: int) -> None:
    """AUTOINCREMENT goes on after `last_id` (sqlite_sequence has no key: delete, then insert)."""
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
    db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('messages', ?)", (last_id,))


class SpoolFile:
    """The SQLite file at `path`: open (or create), quarantine, re-create, write with the reserve. It also
    carries the spool's clock, which is saved in the file."""

    def __init__(self, path: Path, clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self.path = path
        self._clock = clock
        self._wall = wall
        self.rows = 0  # rows in the file, and their bytes: read at open, kept in step by every write
        self.bytes = 0
        self.lost = 0  # rows lost with a corrupt file, or a deleted one that could not be re-spooled
        self.errors = 0  # failed storage operations
        self.recovered = 0  # files quarantined or re-created
        self.recoveries: deque[dict[str, Any]] = deque()  # what happened, for the daemon's events
        self._last_id = 0  # the highest id handed out: a new file continues after it
        self._reserve_retry_at = 0.0
        self.reserve_releases = 0  # times the reserve file was given up on a full disk
        self._clock_base = 0.0
        self._clock_t0 = clock()
        self._open = False  # False between closing a file and opening its replacement (see _ensure_open)
        self._has_clock = True  # the file's messages have their clock_s column (an older edged's may not)
        self._upgrade_pending = False  # the file is an older edged's: _upgrade runs at the next commit

    def clock_s(self) -> float:
        """The spool's clock: seconds the daemon has run with this spool, carried across restarts."""
        return self._clock_base + self._clock() - self._clock_t0

    def _open_or_quarantine(self) -> None:
        """Open the file at `path`; a corrupt one is moved aside and a new one started."""
        try:
            existing = self.path.exists() and self.path.stat().st_size > 0
            try:
                self._connect()
            except sqlite3.OperationalError as exc:
                # a full disk: even reading a file (to deliver what it holds) needs room for SQLite's -shm index
                if not (existing and (_full(exc) or "disk I/O error" in str(exc)) and self._release_reserve()):
                    raise
                self._connect()
        except sqlite3.Error as exc:
            if not _corrupt(exc):
                raise SpoolError(f"spool {self.path}: cannot open: {exc}") from exc
            self._quarantine(str(exc))
            self._connect_or_raise()

    def _ensure_open(self) -> None:
        """A recovery that failed half-way (the corrupt file could not be moved aside, the new one could not
        be created) left no open file: try again now. SpoolError until it works; the caller backs off."""
        if not self._open:
            try:
                self._open_or_quarantine()
            except OSError as exc:
                raise SpoolError(f"spool {self.path}: cannot open: {exc}") from exc

    def _close_db(self) -> None:
        self._open = False
        self.db.close()

    def _connect(self) -> None:
        """Open (or create) the file at `path`; reads its counts and clock, which also finds a corrupt file."""
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            # SQLite lets the WAL grow to 1000 pages (4 MB) before it is checkpointed and reused: on a
            # small filesystem that is all of it. Checkpoint at 1/16 of the filesystem there instead.
            fs = os.statvfs(self.path.parent)
            # The spool never fills its filesystem by itself: it holds at most a quarter of it (with
            # SQLite's pages, the WAL and the reserve, about half); more is dropped like max_bytes.
            self.fs_budget = fs.f_blocks * fs.f_frsize // 4
            wal_pages = max(4, min(1000, fs.f_blocks * fs.f_frsize // 16 // 4096))
            db.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
            db.execute(f"PRAGMA journal_size_limit={wal_pages * 4096 * 2}")
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            new_file = "messages" not in tables
            if new_file:  # one transaction: a file half created on a full disk would pass for an older one
                db.execute("BEGIN")
                for stmt in SCHEMA:
                    db.execute(stmt)
                _set_sequence(db, self._last_id)  # for an older edged; ids go on after the old file's
                db.execute("COMMIT")
                tables = {"messages", "meta", "ids", "sqlite_sequence"}
            # An existing file is only read here: the writes an older edged's file needs (see _upgrade) wait
            # for the first commit, so that a full disk at the first start after an upgrade does not stop
            # what the file holds from being delivered (deletes need no new schema).
            self._has_clock = "clock_s" in {r[1] for r in db.execute("PRAGMA table_info(messages)")}
            saved = db.execute("SELECT value FROM meta WHERE key = 'clock_s'").fetchone() if "meta" in tables else None
            clock_col = "clock_s" if self._has_clock else "0"
            newest = db.execute(
                f"SELECT {clock_col}, id FROM messages WHERE id > 0 ORDER BY id DESC LIMIT 1"  # noqa: S608
            ).fetchone()
            # the running counts: read once here, then kept in step by every insert and delete
            self.bytes, self.rows = db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM messages").fetchone()
            table = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'").fetchone()
            seq = (
                db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
                if "sqlite_sequence" in tables
                else None
            )
            self._upgrade_pending = (
                not self._has_clock
                or not {"meta", "ids", "sqlite_sequence"} <= tables
                or (not self.rows and "AUTOINCREMENT" in table[0].upper())  # an older edged's, empty: the new one
                or seq is None
                or seq[0] < self._last_id
            )
            st = os.stat(self.path)
        except (sqlite3.Error, OSError):
            db.close()
            raise
        self.db = db
        self._open = True
        self._ident = (st.st_dev, st.st_ino)
        # The clock goes on from the file's saved value (saved at least every CLOCK_SAVE_INTERVAL_S), from
        # its newest row (a crash between two saves), or from ours when this is a new file. So a row's
        # clock_s never exceeds the clock, and rows are in clock order by id: the oldest come first.
        newest_s = float(newest[0]) if newest else 0.0
        self._clock_base = max(float(saved[0]) if saved else 0.0, newest_s, self.clock_s())
        self._clock_t0 = self._clock()
        self._last_id = max(self._last_id, seq[0] if seq else 0, newest[1] if newest else 0)

    def _upgrade(self) -> None:
        """The file of an older edged, made this one's in one transaction (run by the first commit): the
        clock column and table, the `ids` table, sqlite_sequence, and an empty AUTOINCREMENT table replaced."""
        db = self.db
        db.execute("BEGIN")
        for stmt in SCHEMA[1:]:
            db.execute(stmt)
        if not self._has_clock:  # an older edged's rows: their age counts from now (`created` is a wall time)
            db.execute("ALTER TABLE messages ADD COLUMN clock_s REAL NOT NULL DEFAULT 0")
        table = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'").fetchone()
        if not self.rows and "AUTOINCREMENT" in table[0].upper():
            db.execute("DROP TABLE messages")
            db.execute(SCHEMA[0])
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
        if seq is None or seq[0] < self._last_id:
            _set_sequence(db, self._last_id)
        db.execute("COMMIT")
        self._has_clock, self._upgrade_pending = True, False
        logger.info("spool: %s upgraded from an older edged's file (%d messages kept)", self.path, self.rows)

    def _connect_or_raise(self) -> None:
        try:
            self._connect()
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"spool {self.path}: cannot create a new spool file: {exc}") from exc

    def _move_aside(self, kind: str) -> Path:
        stamp = dt.datetime.fromtimestamp(self._wall(), dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        dest = self.path.with_name(f"{self.path.name}.{kind}-{stamp}")
        n = 1
        while dest.exists():
            n += 1
            dest = self.path.with_name(f"{self.path.name}.{kind}-{stamp}.{n}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, f"{dest}{suffix}")
        return dest

    def _quarantine(self, reason: str) -> None:
        """Rename a corrupt file aside (with its -wal and -shm); the caller opens a new one."""
        try:
            dest = self._move_aside("corrupt")
        except OSError as exc:
            raise SpoolError(f"spool {self.path} is corrupt ({reason}) and cannot be moved aside: {exc}") from exc
        self.recovered += 1
        logger.error("spool: %s is corrupt (%s); moved it to %s and started a new spool", self.path, reason, dest)
        self.recoveries.append(
            {
                "type": "spool_recovered",
                "reason": "corrupt",
                "error": reason,
                "path": str(self.path),
                "quarantined": str(dest),
            }
        )

    def recover_corrupt(self, reason: str) -> None:
        """A read or write found the open file corrupt: quarantine it, start a new one; its rows are lost."""
        lost = self.rows
        self._close_db()
        self._quarantine(reason)
        self.lost += lost
        self.rows = self.bytes = 0
        self.recoveries[-1]["lost"] = lost
        logger.error("spool: %d messages were in the corrupt spool and are lost", lost)
        self._connect_or_raise()  # on failure, the next call tries again (_ensure_open)

    def _check_file(self) -> None:
        """Our path must still name the file we write to. If it was deleted or replaced (rm -rf of the
        state directory), the rows still in the open, unlinked file are copied into a new file at the
        path. Copied next to it first and renamed in: closing the old connection deletes its -wal and
        -shm by name, which must not be the new file's."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._ident:
                return
            what = "replaced"
        except (FileNotFoundError, NotADirectoryError):  # gone, or its directory is not one any more
            what = "deleted"
        except OSError as exc:
            raise SpoolError(f"spool {self.path}: cannot stat: {exc}") from exc
        tmp = self.path.with_name(f"{self.path.name}.new")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{tmp}{suffix}").unlink(missing_ok=True)
            n, size = self._copy_to(tmp)
            if what == "replaced":
                aside: Path | None = self._move_aside("replaced")
            else:
                aside = None
                for suffix in ("-wal", "-shm"):  # ours, left behind by a delete of the file alone: copied
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        except (OSError, sqlite3.Error) as exc:
            self.errors += 1
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):  # best effort: the directory may be gone, or a file
                    Path(f"{tmp}{suffix}").unlink(missing_ok=True)
            raise SpoolError(
                f"spool {self.path} was {what} and cannot be re-created: {exc}; its {self.rows} messages are "
                f"held in the deleted file until it can"
            ) from exc
        self._close_db()
        try:
            os.replace(tmp, self.path)
        except OSError as exc:
            self.lost += n
            raise SpoolError(f"spool {self.path}: cannot rename {tmp} into place: {exc}") from exc
        finally:
            self._connect_or_raise()
        self.bytes, self.rows = size, n
        self.recovered += 1
        logger.error(
            "spool: %s was %s while running%s; re-created it with the %d messages not yet acknowledged (none lost)",
            self.path,
            what,
            f" (the file found there is now {aside})" if aside else "",
            n,
        )
        self.recoveries.append(
            {"type": "spool_recovered", "reason": what, "path": str(self.path), "messages": n, "lost": 0}
        )

    def _copy_to(self, dest: Path) -> tuple[int, int]:
        """Every row of the open file into a new spool file `dest` (ids, sequence and clock kept)."""
        new = sqlite3.connect(str(dest), isolation_level=None)
        n = size = 0
        try:
            new.execute("PRAGMA journal_mode=WAL")
            for stmt in SCHEMA:
                new.execute(stmt)
            new.execute("BEGIN")
            columns = COLUMNS if self._has_clock else COLUMNS.replace("clock_s", "0")  # not upgraded yet
            cur = self.db.execute(f"SELECT {columns} FROM messages ORDER BY id")  # noqa: S608
            while chunk := cur.fetchmany(1000):
                new.executemany(f"INSERT INTO messages ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", chunk)  # noqa: S608
                n += len(chunk)
                size += sum(r[5] for r in chunk)
            _set_sequence(new, self._last_id)
            new.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock_s', ?)", (self.clock_s(),))
            new.execute("COMMIT")
        finally:
            new.close()
        return n, size

    def _error(self, what: str, exc: sqlite3.Error) -> SpoolError:
        self.errors += 1
        cls = SpoolCorrupt if _corrupt(exc) else SpoolError
        return cls(f"spool {self.path}: cannot {what}: {exc}")

    def _write(self, what: str, op: Callable[[], _T], may_use_reserve: bool = False) -> _T:
        """Run a write transaction. On a full disk, give back the space the WAL holds (a truncating
        checkpoint: the WAL grows to SQLite's autocheckpoint size, 4 MB, before it is reused, which on
        a small filesystem is most of it) and try once more. The checkpoint itself needs a little room
        in the database file, and a delete needs some in the WAL: for them the reserve file is given
        up, so that delivering what is spooled always frees space."""
        try:
            return op()
        except sqlite3.Error as exc:
            self._rollback()
            if not _full(exc):
                raise self._error(what, exc) from exc
        try:
            self._checkpoint()
            return op()
        except sqlite3.Error as exc:
            self._rollback()
            if not (_full(exc) and may_use_reserve and self._release_reserve()):
                raise self._error(what, exc) from exc
        try:
            self._checkpoint()
            return op()
        except sqlite3.Error as exc:
            self._rollback()
            raise self._error(what, exc) from exc

    def _checkpoint(self) -> None:
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            if not (_full(exc) and self._release_reserve()):
                raise
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    @property
    def _reserve_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}.reserve")

    def _hold_reserve(self) -> None:
        """Keep `spool.db.reserve`: space set aside for the spool's own checkpoints and deletes on a
        full disk (1/16 of the filesystem, 64 kB to 4 MB). Best effort: retried every few seconds."""
        now = self._clock()
        if now < self._reserve_retry_at or self._reserve_path.exists():
            return
        try:
            st = os.statvfs(self.path.parent)
            size = min(4 * 2**20, max(64 * 1024, st.f_blocks * st.f_frsize // 16))
            fd = os.open(self._reserve_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):  # the folder may be gone or a file now: retried later
                self._reserve_path.unlink(missing_ok=True)
            self._reserve_retry_at = now + 5.0

    def _release_reserve(self) -> bool:
        try:
            size = self._reserve_path.stat().st_size
            self._reserve_path.unlink()
        except OSError:
            return False
        self._reserve_retry_at = self._clock() + 5.0
        self.reserve_releases += 1
        log = logger.warning if self.reserve_releases == 1 else logger.debug  # it recurs while the disk is full
        log("spool: the disk is full; gave up the %d kB reserve to checkpoint or delete", size // 1024)
        return True

    def _rollback(self) -> None:
        if self._open and self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                logger.debug("spool: rollback failed", exc_info=True)  # SQLite rolled back itself
