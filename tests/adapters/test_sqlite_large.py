"""A replicated SQLite transaction larger than a record may be: refused, rolled back, the leader leads on (issue 39).

COMMIT raises TransactionTooLarge, a sqlite3.DataError (sqlite3's class for SQLITE_TOOBIG,
"string or blob too big"); nothing reaches the log, the transaction's rows are absent, the
node keeps leading in the same term and the next transaction commits and replicates. A
schema statement that would travel as a too-large record is refused the same way.
"""

from __future__ import annotations

import sqlite3

import pytest

import walkit.adapters.sqlite as sq
from walkit.errors import RecordTooLarge

from walkit.testing.memory import MemoryCluster

from .test_sqlite_replication import nodes, pair  # noqa: F401 - the nodes fixture and the leader/follower pair

HUNDRED_MIB = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """cluster is 4 in-process bookies with 10 s sessions (the nodes fixture starts its nodes here).

    Building a 100 MiB transaction keeps this process busy; on a loaded machine that starved a
    1 s session, whose loss moved the leadership for a reason these tests are not about.
    """
    directory = tmp_path_factory.mktemp("sqlite-large")
    with MemoryCluster(f"sqlite://{directory}/metadata.db?ttl=10", bookies=4, add_timeout=2.0,
                       request_timeout=2.0) as made:
        yield made


def leadership(conn) -> tuple:
    """leadership is what a change of leadership would change: who leads, the election's epoch, the log's ledgers."""
    node = conn._database.node
    return node.leader, node.election.epoch, node.ledger_id, tuple(
        node.client.log_metadata(node.log_name).ledger_ids)


def log_end(conn):
    """log_end is the position of the last entry the bookies of the database's log hold."""
    return conn._database.node._log_end()


def check_refused(error: BaseException, limit: int) -> None:
    assert isinstance(error, sqlite3.DataError) and isinstance(error, RecordTooLarge)
    assert (error.sqlite_errorcode, error.sqlite_errorname) == (18, "SQLITE_TOOBIG")
    assert error.size > HUNDRED_MIB and error.limit == limit
    assert "string or blob too big" in str(error) and str(limit) in str(error) and "max_record_bytes" in str(error)


def test_a_100_mib_transaction_is_refused_rolled_back_and_the_leader_keeps_leading(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    with leader:
        leader.execute("INSERT INTO t VALUES (1, ?)", (b"small",))
    before, end = leadership(leader), log_end(leader)
    limit = leader._database.node.max_record_bytes

    leader.execute("INSERT INTO t VALUES (2, ?)", (b"x" * HUNDRED_MIB,))
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (2,)          # the transaction reads its own row
    with pytest.raises(sq.TransactionTooLarge) as refused:
        leader.commit()
    check_refused(refused.value, limit)
    assert not leader.in_transaction
    assert leader.execute("SELECT id FROM t ORDER BY id").fetchall() == [(1,)]  # rolled back: row 2 is absent
    assert log_end(leader) == end                                   # nothing reached the log
    assert leader.is_leader and leadership(leader) == before                     # same leader, term and ledger

    with leader:                                                                 # the next transaction commits
        leader.execute("INSERT INTO t VALUES (3, ?)", (b"next",))
    follower.read_barrier()
    assert follower.execute("SELECT id, b FROM t ORDER BY id").fetchall() == [(1, b"small"), (3, b"next")]
    assert leadership(leader) == before


def test_a_100_mib_transaction_in_a_with_block_raises_there_and_leaves_nothing(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    with pytest.raises(sqlite3.DataError):
        with leader:
            leader.executemany("INSERT INTO t VALUES (?, ?)", [(i, b"y" * (HUNDRED_MIB // 4)) for i in range(4)])
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert leader.is_leader
    with leader:
        leader.execute("INSERT INTO t VALUES (9, x'00')")
    follower.read_barrier()
    assert follower.execute("SELECT id FROM t").fetchall() == [(9,)]


def test_a_100_mib_schema_statement_is_refused_and_the_next_one_replicates(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY)")
    before, end = leadership(leader), log_end(leader)
    with pytest.raises(sq.TransactionTooLarge) as refused:   # CREATE TABLE ... AS travels with its rows' values
        leader.execute(f"CREATE TABLE big AS SELECT 1 AS id, zeroblob({HUNDRED_MIB}) AS b")
    check_refused(refused.value, leader._database.node.max_record_bytes)
    tables = "SELECT name FROM sqlite_schema WHERE type = 'table' AND name IN ('t', 'big', 'small') ORDER BY name"
    assert leader.execute(tables).fetchall() == [("t",)]     # rolled back: no table big
    assert log_end(leader) == end
    assert leader.is_leader and leadership(leader) == before

    leader.execute("CREATE TABLE small AS SELECT 1 AS id, zeroblob(10) AS b")
    follower.read_barrier()
    assert follower.execute(tables).fetchall() == [("small",), ("t",)]
    assert follower.execute("SELECT id, length(b) FROM small").fetchall() == [(1, 10)]


def test_the_limit_is_connects_max_record_bytes(nodes):
    leader, follower = pair(nodes, max_record_bytes=64 * 1024)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    with pytest.raises(sq.TransactionTooLarge) as refused:
        with leader:
            leader.execute("INSERT INTO t VALUES (1, ?)", (b"z" * (64 * 1024),))    # the blob and the record's framing
    assert refused.value.limit == 64 * 1024 and refused.value.setting == "connect(..., max_record_bytes=...)"
    with leader:
        leader.execute("INSERT INTO t VALUES (2, ?)", (b"z" * (60 * 1024),))
    follower.read_barrier()
    assert follower.execute("SELECT id, length(b) FROM t").fetchall() == [(2, 60 * 1024)]
