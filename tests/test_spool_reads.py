"""What the spool's hot path asks of SQLite (issue 18, delivery): a group is inserted in a few statements,
not one per row, and rows this process just committed are handed to the sender from memory, with the
same answers as a read of the file (asserted on the statements SQLite is given, not on timings). Each
step of SQLite lets go of the interpreter lock; under load, taking it back can wait for another thread's
switch interval."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edged.daemon.delivery.spool import INSERT_ROWS, Spool


def _traced(spool: Spool) -> list[str]:
    statements: list[str] = []
    spool.db.set_trace_callback(statements.append)
    return statements


def _reads(statements: list[str]) -> list[str]:
    return [s for s in statements if s.upper().startswith("SELECT") and "FROM MESSAGES" in s.upper()]


def _from_file(path: Path, last_id: int, limit: int) -> list[tuple[int, str, bytes, int]]:
    with sqlite3.connect(str(path)) as db:
        rows = db.execute(
            "SELECT id, topic, payload, qos FROM messages WHERE id > ? ORDER BY id LIMIT ?", (last_id, limit)
        ).fetchall()
    return [(int(i), str(t), bytes(p), int(q)) for i, t, p, q in rows]


def test_a_group_is_inserted_in_a_few_statements_and_sent_from_memory(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", 10**8, 3600)
    n = 2 * INSERT_ROWS + 44
    for i in range(n):
        spool.append(f"edged/d/results/{i % 3}", b"%05d" % i, i % 2)
    statements = _traced(spool)
    spool.commit()
    inserts = [s for s in statements if s.upper().startswith("INSERT INTO MESSAGES")]
    assert len(inserts) == 3, f"{len(inserts)} INSERT statements for {n} rows"
    assert (spool.rows, spool.pending_commit) == (n, 0)

    statements.clear()
    sent = spool.after(0, 150) + spool.after(150, 150)
    assert not _reads(statements), f"read back from the file: {_reads(statements)}"
    assert [tuple(r) for r in sent] == _from_file(tmp_path / "s.db", 0, 300)  # the file's own answer
    assert [r.id for r in sent] == list(range(1, 301))
    spool.close()


def test_reads_from_memory_answer_as_the_file_does(tmp_path: Path) -> None:
    """Acknowledged rows past the cursor (a refused topic's retry), rows the bounds dropped, a cursor sent
    back below what is in memory, rows past the memory bound, a corrupt file's lost rows."""
    path = tmp_path / "s.db"
    spool = Spool(path, max_bytes=100 * 100, max_age_s=0, max_unsaved_bytes=100 * 100)  # keeps 50 rows
    for _ in range(20):
        spool.append("t", b"a" * 100, 1)
    spool.commit()
    spool.delete([3, 4, 7])  # PUBACKs of rows a cursor sent back to 2 will meet again
    statements = _traced(spool)
    assert [r.id for r in spool.after(2, 5)] == [5, 6, 8, 9, 10]
    assert not _reads(statements)

    for _ in range(90):  # over the byte bound (100 rows): the oldest go; over the memory bound (50 rows)
        spool.append("t", b"b" * 100, 1)
    spool.commit()
    assert spool.dropped > 0
    statements.clear()
    newest = spool.after(105, 10)
    assert [r.id for r in newest] == [106, 107, 108, 109, 110] and not _reads(statements)
    statements.clear()
    oldest = spool.after(0, 10)  # below what memory holds: from the file, after the dropped rows
    assert _reads(statements)
    assert [tuple(r) for r in oldest] == _from_file(path, 0, 10) and oldest[0].id > 10

    spool.recover_corrupt("a test")  # the rows went with the file: memory does not hand them out
    assert spool.after(oldest[-1].id, 10) == [] and spool.after(105, 10) == []
    spool.append("t", b"c", 1)
    spool.commit()
    assert [(r.id, r.payload) for r in spool.after(105, 10)] == [(111, b"c")]
    spool.close()


def test_a_cursor_sent_back_after_deliveries_reads_what_the_file_holds(tmp_path: Path) -> None:
    """A refused topic's hold ends and the sender goes back to its first held row: rows of other topics it
    was handed from memory since were acknowledged and deleted with a commit; they are not handed out again."""
    spool = Spool(tmp_path / "s.db", 10**6, 0)
    for i, topic in enumerate("abab", 1):
        spool.append(topic, b"row%d" % i, 1)
    spool.commit()
    assert [r.id for r in spool.after(0, 10)] == [1, 2, 3, 4]
    spool.delete([2, 4])  # b's PUBACKs; a is refused (held)
    spool.commit()
    again = spool.after(0, 10)
    assert [tuple(r) for r in again] == _from_file(tmp_path / "s.db", 0, 10) and [r.id for r in again] == [1, 3]
    spool.append("b", b"row5", 1)
    spool.commit()
    assert [r.id for r in spool.after(3, 10)] == [5]  # and past it, the newest rows as before
    spool.close()
