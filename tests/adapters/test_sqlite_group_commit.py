"""Group commit on the leader (walkit.adapters.sqlite.machine's module doc): concurrent writers share log entries.

Nodes run on the in-process MemoryCluster of sqlitehelpers. What is shown: transactions of
concurrent writers share log entries, every one of them applied once on every node and none
lost (a counter every transaction increments ends at the number of commits); a member sees the
members before it while no reader sees any of them until the group commits; a transaction that
read before it wrote does not join and fails as SQLite does once the database moved; with
`group_commit=False` (a connect() keyword) every transaction is a log entry of its own.
"""

from __future__ import annotations

import threading

import pytest

apsw = pytest.importorskip("apsw")

import walkit.adapters.sqlite as sq                                          # noqa: E402
from walkit.replication import batch                                         # noqa: E402
from walkit.testing.processes import wait_until                             # noqa: E402

from .sqlite_review_helpers import HeldAppend, commit_in_thread, file_rows  # noqa: E402
from .sqlitehelpers import cluster, nodes, unique                           # noqa: E402,F401 - fixtures

WRITERS, EACH = 4, 40


def pair(nodes, **options):
    """pair opens two nodes of a new database with table t and a counter; it returns (leader, follower)."""
    name = unique("group")
    first = nodes.connect(name, "n0", check_same_thread=False, **options)
    second = nodes.connect(name, "n1", check_same_thread=False, **options)
    wait_until(lambda: first.is_leader or second.is_leader, 30, "no leader")
    leader, follower = (first, second) if first.is_leader else (second, first)
    leader.executescript("CREATE TABLE t(id INTEGER PRIMARY KEY, writer, seen); CREATE TABLE counter(n);"
                         "INSERT INTO counter VALUES (0)")
    follower.read_barrier()
    return leader, follower


def entry_sizes(conn) -> list[int]:
    """entry_sizes is how many records each entry of the database's log holds, up to what `conn` applied."""
    database = conn._database

    def read():
        sizes, last = [], None
        for entry in database.client.read_log(f"replicated-{database.name}"):
            sizes.append(len(batch.decode(entry.payload)))
            last = entry.position
        return sizes if last is not None and last >= conn.position[:2] else None
    return wait_until(read, 10, "the log to reach the leader's position")


def write_concurrently(leader, threads: int, each: int, **options) -> list[BaseException]:
    """write_concurrently runs `threads` connections of the leader's file (connect's `options`), `each`
    transactions each: a row holding how many rows it saw, and the counter incremented."""
    database = leader._database
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(k: int) -> None:
        conn = sq.connect(database.path, name=database.name, timeout=30, **options)
        try:
            start.wait()
            for _ in range(each):
                conn.execute("INSERT INTO t(writer, seen) VALUES (?, (SELECT count(*) FROM t))", (k,))
                conn.execute("UPDATE counter SET n = n + 1")
                conn.commit()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)
        finally:
            conn.close()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not any(worker.is_alive() for worker in workers)
    return errors


def test_concurrent_writers_share_log_entries_and_every_commit_is_applied_once_in_order(nodes):
    leader, follower = pair(nodes)
    before = sum(entry_sizes(leader))
    assert write_concurrently(leader, WRITERS, EACH) == []
    total = WRITERS * EACH
    assert leader.execute("SELECT n FROM counter").fetchone() == (total,)          # no update lost
    # each transaction saw every one committed before it, in the order the log holds them
    assert [r[0] for r in leader.execute("SELECT seen FROM t ORDER BY id")] == list(range(total))
    sizes = entry_sizes(leader)
    assert sum(sizes) - before == total                                            # one record each
    assert max(sizes) > 1, f"no entry holds two transactions: {sizes}"
    follower.read_barrier()
    assert follower.execute("SELECT * FROM t ORDER BY id").fetchall() == leader.execute(
        "SELECT * FROM t ORDER BY id").fetchall()
    assert follower.execute("SELECT n FROM counter").fetchone() == (total,)
    assert follower.position == leader.position


def test_with_group_commit_off_every_transaction_is_an_entry_of_its_own(nodes):
    leader, follower = pair(nodes)
    before = len(entry_sizes(leader))
    assert write_concurrently(leader, WRITERS, 10, group_commit=False) == []
    sizes = entry_sizes(leader)
    assert sizes[before:] == [1] * (WRITERS * 10)
    assert leader.execute("SELECT n FROM counter").fetchone() == (WRITERS * 10,)


def test_a_member_sees_the_members_before_it_and_no_reader_sees_either_until_the_group_commits(nodes):
    leader, follower = pair(nodes)
    database = leader._database
    path, name = database.path, database.name
    other = sq.connect(path, name=name, check_same_thread=False, timeout=10)
    reader = sq.connect(path, name=name, check_same_thread=False)
    try:
        with HeldAppend() as held:
            first, first_outcome = commit_in_thread(leader, "INSERT INTO t(writer, seen) VALUES "
                                                            "('first', (SELECT count(*) FROM t))")
            assert held.reached.wait(30), "the first transaction's entry was never acknowledged"
            second, second_outcome = commit_in_thread(other, "INSERT INTO t(writer, seen) VALUES "
                                                             "('second', (SELECT count(*) FROM t))")
            wait_until(lambda: len(database.machine.kept) == 2, 30, "the second transaction did not join")
            # both are on their way to the log (the first is in it): no reader of the file sees them
            assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)
            assert file_rows(path, "SELECT count(*) FROM t") == [(0,)]
            assert first.is_alive() and second.is_alive()                    # neither COMMIT returned yet
        first.join(60)
        second.join(60)
        assert first_outcome == {"ok": True} and second_outcome == {"ok": True}
        assert reader.execute("SELECT writer, seen FROM t ORDER BY id").fetchall() == [("first", 0), ("second", 1)]
        follower.read_barrier()
        assert follower.execute("SELECT writer, seen FROM t ORDER BY id").fetchall() == [("first", 0),
                                                                                         ("second", 1)]
    finally:
        other.close()
        reader.close()


def test_a_transaction_that_read_before_writing_does_not_join_and_fails_as_sqlite_does_once_the_database_moved(
        nodes):
    leader, follower = pair(nodes)
    database = leader._database
    reading = sq.connect(database.path, name=database.name, check_same_thread=False, timeout=0.5)
    try:
        reading.execute("BEGIN")
        assert reading.execute("SELECT count(*) FROM t").fetchone() == (0,)       # it read the file as it was
        with HeldAppend() as held:
            thread, outcome = commit_in_thread(leader, "INSERT INTO t(writer) VALUES ('member')")
            assert held.reached.wait(30)
            # a member is on its way: the reader's write waits for the group to drain, at most its timeout
            with pytest.raises(sq.OperationalError, match="database is locked"):
                reading.execute("INSERT INTO t(writer) VALUES ('reader')")
        thread.join(60)
        assert outcome == {"ok": True}
        # the database moved since it read: SQLite's SQLITE_BUSY_SNAPSHOT, "database is locked"
        with pytest.raises(sq.OperationalError, match="database is locked"):
            reading.execute("INSERT INTO t(writer) VALUES ('reader')")
        reading.rollback()
        reading.execute("BEGIN")                              # read again, then write: it runs on its connection
        assert reading.execute("SELECT count(*) FROM t").fetchone() == (1,)
        reading.execute("INSERT INTO t(writer) VALUES ('reader')")
        assert reading._txn.member is None
        reading.commit()
        follower.read_barrier()
        assert follower.execute("SELECT writer FROM t ORDER BY id").fetchall() == [("member",), ("reader",)]
    finally:
        reading.close()


def test_a_connection_with_a_function_of_its_own_writes_on_its_connection_between_groups(nodes):
    leader, follower = pair(nodes)
    database = leader._database
    own = sq.connect(database.path, name=database.name, check_same_thread=False)
    try:
        own.create_function("twice", 1, lambda x: 2 * x)
        own.execute("INSERT INTO t(writer, seen) VALUES ('own', twice(21))")
        assert own._txn.member is None                       # the function is on this connection only
        own.commit()
        leader.execute("INSERT INTO t(writer, seen) VALUES ('member', 1)")
        assert leader._txn.member is not None
        leader.commit()
        follower.read_barrier()
        assert follower.execute("SELECT writer, seen FROM t ORDER BY id").fetchall() == [("own", 42), ("member", 1)]
    finally:
        own.close()


def test_a_member_cannot_name_the_groups_savepoints(nodes):
    leader, follower = pair(nodes)
    leader.execute("INSERT INTO t(writer) VALUES ('member')")
    savepoint = leader._txn.member.savepoint
    for sql in (f'ROLLBACK TO "{savepoint}"', f'RELEASE "{savepoint}"', "SAVEPOINT _walkit_group_x"):
        with pytest.raises(sq.OperationalError, match="no such savepoint"):
            leader.execute(sql)
    leader.commit()
    follower.read_barrier()
    assert follower.execute("SELECT writer FROM t").fetchall() == [("member",)]
