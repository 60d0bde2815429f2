"""The leader's trial keeps its record applied in the apply connection's open transaction (SqliteMachine.trial).

When that record comes back from the log as the next one to apply, only its position is
written before COMMIT; the record is not applied twice. Anything else rolls the kept trial
back first: another record applied before it (so the file is never ahead of the log, and the
kept record later applies on the state the log gives it), a dropped trial (the append failed),
a restore from a snapshot. Nothing outside the apply connection sees a kept trial. The records
here are SQL steps on an SqliteMachine over a file, without a log: positions are given.
"""

from __future__ import annotations

import pytest

pytest.importorskip("apsw")

from walkit.core.loglist import Position                                   # noqa: E402

from walkit.adapters.sqlite.machine import SqliteMachine                  # noqa: E402
from walkit.adapters.sqlite.records import Transaction                    # noqa: E402


def record(*sql: str, t: int = 1) -> bytes:
    txn = Transaction(commit_ms=t, node="n1")
    for text in sql:
        txn.add_sql(text)
    return txn.encode()


def rows(path) -> list[tuple]:
    """rows is the table as another connection reads it (committed state only)."""
    import apsw
    db = apsw.Connection(str(path))
    try:
        return db.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    finally:
        db.close()


@pytest.fixture
def machine(tmp_path):
    m = SqliteMachine(str(tmp_path / "db.sqlite"), "kept")
    m.apply(record("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"), Position(1, 0))
    yield m
    m.close()


def test_a_kept_trial_is_seen_by_nobody_and_its_record_is_applied_once(machine, tmp_path):
    insert = record("INSERT INTO t VALUES (1, 'a')")     # applied twice, it fails (the id is taken)
    machine.trial(insert)
    assert rows(tmp_path / "db.sqlite") == []                # another connection reads the committed file
    assert machine.apply(insert, Position(1, 1)) == (1, 1, 0)
    assert machine.failed is None and rows(tmp_path / "db.sqlite") == [(1, "a")]
    assert machine.position == (1, 1, 0) and not machine.db.in_transaction


def test_another_record_applied_first_rolls_the_kept_trial_back(machine, tmp_path):
    mine = record("INSERT INTO t VALUES (2, (SELECT count(*) FROM t))", t=2)
    machine.trial(mine)                                      # it counts 0 rows here
    other = record("INSERT INTO t VALUES (1, 'other')", t=3)
    machine.apply(other, Position(1, 1))
    assert rows(tmp_path / "db.sqlite") == [(1, "other")]
    machine.apply(mine, Position(1, 2))                      # applied again, on the state the log gives it
    assert rows(tmp_path / "db.sqlite") == [(1, "other"), (2, 1)]
    assert machine.position == (1, 2, 0)


def test_a_dropped_trial_leaves_the_file_as_it_was_and_the_next_trial_starts_clean(machine, tmp_path):
    machine.trial(record("INSERT INTO t VALUES (1, 'dropped')"))
    machine.drop_trial()
    assert not machine.db.in_transaction and rows(tmp_path / "db.sqlite") == []
    machine.drop_trial()                                     # twice: nothing
    second = record("INSERT INTO t VALUES (1, 'second')")
    machine.trial(second)
    machine.trial(second)                                    # a trial again rolls the kept one back first
    machine.apply(second, Position(1, 1))
    assert rows(tmp_path / "db.sqlite") == [(1, "second")]


def test_a_failing_trial_keeps_nothing(machine, tmp_path):
    from walkit.adapters.sqlite.errors import OperationalError
    with pytest.raises(OperationalError):
        machine.trial(record("INSERT INTO t VALUES (1, 'x')", "INSERT INTO nowhere VALUES (1)"))
    assert not machine.db.in_transaction
    machine.apply(record("INSERT INTO t VALUES (1, 'y')"), Position(1, 1))
    assert rows(tmp_path / "db.sqlite") == [(1, "y")]



def test_a_record_of_the_same_bytes_applied_first_takes_the_kept_trial_as_its_own(machine, tmp_path):
    """Bytes name the record: one equal to the kept trial, met first, has its effect on the same
    state (nothing applied since the trial), so it is committed as it; the trial's own position,
    later, applies it again as any record."""
    bump = record("UPDATE t SET v = v + 1")
    machine.apply(record("INSERT INTO t VALUES (1, 0)"), Position(1, 1))
    machine.trial(bump)
    machine.apply(bump, Position(1, 2))
    machine.apply(bump, Position(1, 3))
    assert rows(tmp_path / "db.sqlite") == [(1, 2)]
