"""Nothing enters a replicated SQLite log that the nodes cannot apply (issue 45, item 1), on in-process bookies.

A function registered on one connection only (sqlite3's `create_function`) may compute values,
but a schema that calls it (a partial index, a CHECK constraint, a trigger) would be a record
no other node can apply: such a statement fails at the client with sqlite3's
OperationalError "no such function: ...", nothing is appended and no node stops. Registered on
the database (walkit.adapters.sqlite.create_function, before connect), the same schema works
on every node.
"""

from __future__ import annotations

import itertools

import pytest

import walkit.adapters.sqlite as sq

from .sqlitehelpers import Nodes, memory_cluster, unique

_functions = itertools.count()

#: Schemas calling function {f}: the statements before, and the one that calls it.
POISON = {
    "partial index": (["CREATE TABLE t(x)"], "CREATE INDEX t_f ON t(x) WHERE {f}(x) IS NOT NULL"),
    "check constraint": ([], "CREATE TABLE t(x CHECK ({f}(x)))"),
    "trigger": (["CREATE TABLE t(x)", "CREATE TABLE seen(y)"],
                "CREATE TRIGGER t_f AFTER INSERT ON t BEGIN INSERT INTO seen VALUES ({f}(new.x)); END"),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with memory_cluster(tmp_path_factory.mktemp("sqlite-poison")) as made:
        yield made


@pytest.fixture
def nodes(cluster, tmp_path):
    made = Nodes(cluster, tmp_path)
    yield made
    made.close()


def pair(nodes):
    name = unique("poison")
    first, second = nodes.connect(name, "n0"), nodes.connect(name, "n1")
    return (first, second) if first.is_leader else (second, first)


def function_name() -> str:
    """function_name is a SQL function name no other test registered (the database's definitions are per process)."""
    return f"keep{next(_functions)}"


def next_entry(position):
    """next_entry is the log position right after `position`: where the next record goes if nothing was appended."""
    return (position.ledger_id, position.entry_id + 1)


def statements(case: str, f: str) -> tuple[list[str], str]:
    setup, poison = POISON[case]
    return setup, poison.format(f=f)


@pytest.mark.parametrize("case", sorted(POISON))
def test_a_schema_calling_a_connection_function_fails_at_the_client_and_nothing_is_appended(nodes, case):
    leader, follower = pair(nodes)
    f = function_name()
    leader.create_function(f, 1, lambda x: 1, deterministic=True)
    setup, poison = statements(case, f)
    for sql in setup:
        leader.execute(sql)
    leader.execute("CREATE TABLE after(y)")
    before = leader.position
    with pytest.raises(sq.OperationalError) as caught:
        leader.execute(poison)
    assert type(caught.value) is sq.OperationalError and str(caught.value) == f"no such function: {f}"
    assert not leader.in_transaction
    with leader:
        leader.execute("INSERT INTO after VALUES (?)", (f,))
    assert (leader.position.ledger_id, leader.position.entry_id) == next_entry(before)    # nothing appended between
    follower.read_barrier()
    assert follower.execute("SELECT y FROM after").fetchall() == [(f,)]
    assert leader._database.machine.failed is None and follower._database.machine.failed is None
    names = {row[0] for row in follower.execute("SELECT name FROM sqlite_schema")}
    assert not names & {"t_f"} and ("t" in names) == bool(setup)


@pytest.mark.parametrize("case", sorted(POISON))
def test_a_schema_calling_a_database_function_applies_on_every_node(nodes, case):
    f = function_name()
    sq.create_function(f, 1, lambda x: x * 2, deterministic=True)
    leader, follower = pair(nodes)
    setup, schema = statements(case, f)
    for sql in [*setup, schema]:
        leader.execute(sql)
    with leader:
        leader.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    follower.read_barrier()
    for conn in (leader, follower):
        assert conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
        if case == "trigger":
            assert conn.execute("SELECT y FROM seen ORDER BY y").fetchall() == [(2,), (4,)]
        assert conn._database.machine.failed is None


def test_a_transaction_that_fails_its_trial_rolls_back_whole_and_appends_nothing(nodes):
    leader, follower = pair(nodes)
    f = function_name()
    leader.create_function(f, 1, lambda x: 1, deterministic=True)
    leader.execute("CREATE TABLE t(x)")
    before = leader.position
    leader.execute("INSERT INTO t VALUES (1)")                    # opens a transaction (isolation_level "")
    leader.execute(f"CREATE INDEX t_f ON t(x) WHERE {f}(x) > 0")
    with pytest.raises(sq.OperationalError, match=f"^no such function: {f}$"):
        leader.commit()
    assert not leader.in_transaction
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with leader:
        leader.execute("INSERT INTO t VALUES (2)")
    assert (leader.position.ledger_id, leader.position.entry_id) == next_entry(before)    # nothing appended between
    follower.read_barrier()
    assert follower.execute("SELECT x FROM t").fetchall() == [(2,)]
