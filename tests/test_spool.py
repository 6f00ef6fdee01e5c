"""The spool's cost does not grow with its backlog: no statement it runs per commit or per send scans the
messages table (asserted on SQLite's query plans, not on timings), and its running counts stay exact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edged.daemon.delivery.spool import Spool


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _counts(path: Path) -> tuple[int, int]:
    with sqlite3.connect(str(path)) as db:
        rows, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM messages").fetchone()
    return int(rows), int(size)


def test_no_statement_per_commit_or_send_scans_the_table(tmp_path: Path) -> None:
    clock = Clock()
    spool = Spool(tmp_path / "s.db", max_bytes=100 * 100, max_age_s=60, clock=clock)
    for i in range(150):  # over the byte bound: the commit drops the 50 oldest
        spool.append("edged/d/results/a", b"%03d" % i + b" " * 97, 1)
    statements: list[str] = []
    spool.db.set_trace_callback(statements.append)
    spool.commit()
    assert spool.dropped == 50
    clock.t += 30
    for _ in range(50):
        spool.append("edged/d/results/a", b"x" * 100, 1)
    spool.commit()
    assert spool.dropped == 100 and spool.rows == 100
    clock.t += 45  # the first 50 left are past max_age_s now: the age bound drops them
    spool.append("edged/d/results/a", b"y" * 100, 1)
    spool.commit()
    rows = spool.after(0, 20)
    spool.delete([r.id for r in rows[:7]] + [r.id for r in rows[9:20]])  # PUBACKs with a gap: two runs
    spool.after(rows[-1].id, 20)
    spool.close()

    plans: dict[str, list[str]] = {}
    with sqlite3.connect(str(tmp_path / "s.db")) as db:
        for sql in statements:
            verb = sql.split(None, 1)[0].upper()
            if verb not in ("SELECT", "INSERT", "DELETE", "UPDATE"):
                continue
            plans[sql] = [r[3] for r in db.execute(f"EXPLAIN QUERY PLAN {sql}")]
    verbs = {sql.split(None, 1)[0].upper() for sql in plans}
    assert verbs >= {"SELECT", "INSERT", "DELETE"}, plans  # the commit, the bounds, the send and the delete
    scans = {sql: plan for sql, plan in plans.items() if any(p.startswith("SCAN messages") for p in plan)}
    assert not scans, f"statements that scan the whole messages table: {scans}"
    assert spool.dropped == 150 and spool.rows == 51 - 18
    assert _counts(tmp_path / "s.db") == (spool.rows, spool.bytes)


def test_running_counts_stay_exact_and_rebuild_at_open(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=0)
    for i in range(120):
        spool.append("t", b"z" * (50 + i % 7), 1)
        if i % 9 == 0:
            spool.commit()
    spool.commit()
    rows = spool.after(0, 1000)
    spool.delete([r.id for r in rows[::3]] + [rows[0].id])  # scattered ids, one twice
    assert _counts(tmp_path / "s.db") == (spool.rows, spool.bytes) and spool.bytes <= 10_000
    spool.close()
    again = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=0)
    assert (again.rows, again.bytes) == (spool.rows, spool.bytes)
    again.close()


def test_age_goes_on_from_the_newest_row_after_a_crash(tmp_path: Path) -> None:
    """The clock is saved once a minute, not with every commit: after a crash between two saves, the
    newest row carries it, so no row is younger than the clock it is judged by."""
    clock = Clock()
    spool = Spool(tmp_path / "s.db", 10**6, max_age_s=100, clock=clock)
    spool.commit()  # the clock is saved (0 s)
    clock.t += 50
    spool.append("t", b"a", 1)
    spool.commit()  # the row says 50 s; the saved clock still 0 s
    spool.db.close()  # a crash: no close(), no clock saved

    boot = Clock(3.0)
    again = Spool(tmp_path / "s.db", 10**6, max_age_s=100, clock=boot)
    assert again.clock_s() >= 50
    boot.t += 99
    again.commit()
    assert again.rows == 1
    boot.t += 2
    again.commit()
    assert again.rows == 0 and again.dropped == 1
    again.close()


def test_ids_never_go_back_and_an_older_spool_is_kept(tmp_path: Path) -> None:
    """Row ids come from the spool, not from AUTOINCREMENT (which rewrites sqlite_sequence with every
    commit): they still never go back within a run, even when the table empties, and a file of an
    older edged keeps its rows, its ids going on after them."""
    spool = Spool(tmp_path / "s.db", 10**6, 3600)
    for _ in range(3):
        spool.append("t", b"a", 1)
    spool.commit()
    spool.delete([r.id for r in spool.after(0, 10)])
    spool.commit()
    assert spool.rows == 0
    spool.append("t", b"b", 1)
    spool.commit()
    assert [r.id for r in spool.after(3, 10)] == [4]  # a cursor at 3 finds it
    spool.close()
    with sqlite3.connect(str(tmp_path / "s.db")) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        assert "AUTOINCREMENT" not in sql.upper()
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()  # older edged

    older = tmp_path / "older.db"
    with sqlite3.connect(str(older)) as db:
        db.execute(
            "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL, "
            "qos INTEGER NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL, clock_s REAL NOT NULL DEFAULT 0)"
        )
        db.executemany(
            "INSERT INTO messages (topic, payload, qos, created, size) VALUES ('t', ?, 1, 0, 1)", [(b"o",)] * 5
        )
        db.execute("DELETE FROM messages WHERE id <= 2")
    spool = Spool(older, 10**6, 3600)
    spool.append("t", b"n", 1)
    spool.commit()
    assert [(r.id, r.payload) for r in spool.after(0, 10)] == [(3, b"o"), (4, b"o"), (5, b"o"), (6, b"n")]
    spool.delete([3, 4, 5, 6])
    spool.close()
    again = Spool(older, 10**6, 3600)  # empty at open: its table is the new one now
    again.close()
    with sqlite3.connect(str(older)) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        assert "AUTOINCREMENT" not in sql.upper()


def test_the_clock_survives_a_crash_after_the_newest_rows_were_delivered(tmp_path: Path) -> None:
    """The newest row carries the clock across a crash between two saves; when the newest rows were
    delivered (deleted), the commit that deletes them saves the clock, so an older row still waiting (a
    refused topic's) is not made younger by up to a minute."""
    clock = Clock()
    spool = Spool(tmp_path / "s.db", 10**6, max_age_s=100, clock=clock)
    spool.append("held", b"a", 1)
    spool.commit()  # the held row: 0 s
    clock.t += 50
    spool.append("t", b"b", 1)
    spool.commit()  # 50 s; the saved clock is older (saved once a minute)
    spool.delete([spool.after(1, 10)[0].id])  # its PUBACK
    spool.commit()  # deletes only: the newest row leaves the file
    spool.db.close()  # a crash: no close(), no clock saved by it

    boot = Clock(3.0)
    again = Spool(tmp_path / "s.db", 10**6, max_age_s=100, clock=boot)
    assert again.clock_s() >= 50
    boot.t += 51  # the held row is 101 s old now
    again.commit()
    assert again.rows == 0 and again.dropped == 1
    again.close()


def _acked_after_the_bound_dropped_them(path: Path) -> Spool:
    """15 rows of 100 bytes through a 1,000-byte bound: the first 10 are sent, then the bound drops the
    oldest 5 of them, then all 10 PUBACKs come. The file holds 6..15, of which 6..10 are delivered."""
    spool = Spool(path, max_bytes=1000, max_age_s=0)
    for _ in range(10):
        spool.append("t", b"x" * 100, 1)
    spool.commit()
    sent = spool.after(0, 10)
    for _ in range(5):
        spool.append("t", b"y" * 100, 1)
    spool.commit()
    assert spool.dropped == 5 and spool.rows == 10
    spool.delete([r.id for r in sent])
    return spool


def test_lost_counts_what_was_not_delivered_when_acks_come_for_dropped_rows(tmp_path: Path) -> None:
    """`spool_lost` subtracted every acknowledged id from the rows a lost file held, also those the
    bound had already dropped (not in the file any more): here 0 instead of 5."""
    state = tmp_path / "state"
    spool = _acked_after_the_bound_dropped_them(state / "s.db")
    for p in state.iterdir():
        p.unlink()
    state.rmdir()
    state.write_text("")  # the state folder is a file now: the spool cannot be re-created at stop
    assert spool.close() == 5 and spool.lost == 5

    spool = _acked_after_the_bound_dropped_them(tmp_path / "c.db")
    spool.recover_corrupt("found corrupt")  # the file is moved aside: what it held undelivered is lost
    assert spool.lost == 5
    spool.close()
