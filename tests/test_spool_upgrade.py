"""An older edged's spool file is opened without writing to it: what it holds can be delivered even on a
full disk at the first start after an upgrade; the file is upgraded by the first commit that can write."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from edged.daemon.delivery.spool import Spool, SpoolError

from .test_faults_delivery import fill, tmpfs


def _older_spool(path: Path, n: int) -> None:
    """A spool file as the first edged wrote it: AUTOINCREMENT ids, no clock column, no meta or ids table."""
    with sqlite3.connect(str(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL, "
            "qos INTEGER NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL)"
        )
        db.executemany(
            "INSERT INTO messages (topic, payload, qos, created, size) VALUES ('edged/d/results/a', ?, 1, 0, 100)",
            [(b"%03d" % i + b"." * 97,) for i in range(n)],
        )
    db.close()


def test_an_older_spool_opens_without_writes_and_the_first_commit_upgrades_it(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    _older_spool(path, 5)
    spool = Spool(path, 10**6, 3600)
    assert Path(f"{path}-wal").stat().st_size == 0  # nothing written at open (the upgrade wrote 4 pages here)
    rows = spool.after(0, 10)
    assert [r.payload[:3] for r in rows] == [b"000", b"001", b"002", b"003", b"004"] and spool.rows == 5
    spool.delete([rows[0].id, rows[1].id])
    spool.append("edged/d/results/a", b"new", 1)
    spool.commit()  # upgrades the file, then deletes and inserts
    assert [r.id for r in spool.after(0, 10)] == [3, 4, 5, 6] and spool.rows == 4
    spool.close()
    with sqlite3.connect(str(path)) as db:
        assert "clock_s" in {r[1] for r in db.execute("PRAGMA table_info(messages)")}
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 4
    db.close()


def test_a_full_disk_at_the_first_start_after_an_upgrade_still_delivers(tmp_path: Path) -> None:
    """A real full tmpfs: the older file opens (the spool gives up its reserve for SQLite's -shm index; the
    open used to fail with 'disk I/O error'), its rows are read and delivered; new messages wait in
    memory if there is no room, then the file is upgraded and they are written."""
    with tmpfs(tmp_path / "fs", "1m") as fs:
        path = fs / "spool.db"
        _older_spool(path, 50)
        with open(fs / "spool.db.reserve", "wb") as f:  # the reserve an edged of the last release keeps
            f.truncate(64 * 1024)
            f.write(b"\0" * 64 * 1024)
        fill(fs)
        spool = Spool(path, 10**6, 3600)
        assert spool.rows == 50
        rows = spool.after(0, 100)
        assert len(rows) == 50
        spool.delete([r.id for r in rows[:30]])  # their PUBACKs
        spool.append("edged/d/results/a", b"new", 1)
        with contextlib.suppress(SpoolError):  # the deliveries go first; the upgrade and the new one if room
            spool.commit()
        written = 1 - spool.pending_commit
        assert spool.rows == 20 + written
        assert [r.id for r in spool.after(0, 100)] == [r.id for r in rows[30:]] + [51] * written
        (fs / "filler").unlink()
        spool.commit()
        assert spool.pending_commit == 0 and spool.rows == 21
        spool.close()
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            assert db.execute("SELECT COUNT(*), MAX(id) FROM messages").fetchone() == (21, 51)
        db.close()


def test_an_empty_older_spool_gets_the_new_table_at_its_first_commit(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    _older_spool(path, 0)
    spool = Spool(path, 10**6, 3600)
    spool.commit()
    spool.close()
    with sqlite3.connect(str(path)) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    db.close()
    assert "AUTOINCREMENT" not in sql.upper() and "clock_s" in sql
