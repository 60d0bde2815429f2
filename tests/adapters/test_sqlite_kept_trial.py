"""The leader's trial keeps its record applied in the apply connection's open transaction (SqliteMachine.trial).

When that record comes back from the log as the next one to apply, only its position is
written before COMMIT; the record is not applied twice. Anything else rolls the kept trial
back first: another record applied before it (so the file is never ahead of the log, and the
kept record later applies on the state the log gives it), a dropped trial (the append failed),
a restore from a snapshot. Nothing outside the apply connection sees a kept trial. The records
here are SQL steps on an SqliteMachine over a file, without a log: positions are given.
"""

from __future__ import annotations

from concurrent.futures import Future

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


def sent(machine, record: bytes):
    """sent is a trial whose record went to the log (as Database marks it: its submit, here one that ended):
    the next trial builds on it."""
    member = machine.trial(record)
    member.future = Future()
    member.future.set_result(None)
    return member


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
    dropped = sent(machine, record("INSERT INTO t VALUES (1, 'dropped')"))
    machine.drop(dropped)
    assert not machine.db.in_transaction and rows(tmp_path / "db.sqlite") == [] and not machine.members
    machine.drop(dropped)                                    # twice: nothing
    second = record("INSERT INTO t VALUES (1, 'second')")
    machine.trial(record("INSERT INTO t VALUES (1, 'never sent')"))     # an interrupted commit's
    machine.trial(second)                                    # a trial drops one never sent first
    assert machine.kept == [second]
    machine.apply(second, Position(1, 1))
    assert rows(tmp_path / "db.sqlite") == [(1, "second")]


def test_trials_stack_as_a_group_committed_once_the_log_gave_back_all_of_them(machine, tmp_path):
    first = record("INSERT INTO t VALUES (1, (SELECT count(*) FROM t))", t=2)
    second = record("INSERT INTO t VALUES (2, (SELECT count(*) FROM t))", t=3)   # on top of the first: it counts 1
    sent(machine, first)
    sent(machine, second)
    assert machine.kept == [first, second] and rows(tmp_path / "db.sqlite") == []
    assert machine.apply(first, Position(1, 1)) == (1, 1, 0)
    assert rows(tmp_path / "db.sqlite") == [] and machine.position == (1, 0, 0)    # applied, not committed yet
    assert machine.through == (1, 1, 0) and machine.kept == [second]
    assert machine.apply(second, Position(1, 2)) == (1, 2, 0)
    assert rows(tmp_path / "db.sqlite") == [(1, 0), (2, 1)]                       # each applied once
    assert machine.position == (1, 2, 0) and not machine.members and not machine.db.in_transaction


def test_a_dropped_member_drops_those_after_it_and_the_applied_ones_are_committed(machine, tmp_path):
    one, two, three = (record(f"INSERT INTO t VALUES ({i}, 'v{i}')", t=i) for i in (1, 2, 3))
    sent(machine, one)
    middle = sent(machine, two)
    sent(machine, three)
    machine.apply(one, Position(1, 1))
    machine.drop(middle)                                     # its append failed: the third was built on it
    assert rows(tmp_path / "db.sqlite") == [(1, "v1")] and machine.position == (1, 1, 0)
    assert not machine.members and not machine.db.in_transaction
    machine.apply(two, Position(1, 2))                       # the log had them after all: applied as any record
    machine.apply(three, Position(1, 3))
    assert rows(tmp_path / "db.sqlite") == [(1, "v1"), (2, "v2"), (3, "v3")]


def test_a_snapshot_holds_the_members_applied_but_not_committed_yet(machine, tmp_path):
    import io
    one, two = record("INSERT INTO t VALUES (1, 'one')"), record("INSERT INTO t VALUES (2, 'two')")
    sent(machine, one)
    sent(machine, two)
    machine.apply(one, Position(1, 1))                       # the node's position: (1, 1); the file's: (1, 0)
    out = io.BytesIO()
    machine.snapshot(out)()
    other = SqliteMachine(str(tmp_path / "other.sqlite"), "kept")
    try:
        other.restore(io.BytesIO(out.getvalue()))
        assert other.position == (1, 1, 0) and rows(tmp_path / "other.sqlite") == [(1, "one")]
    finally:
        other.close()
    machine.apply(two, Position(1, 2))
    assert rows(tmp_path / "db.sqlite") == [(1, "one"), (2, "two")]


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
