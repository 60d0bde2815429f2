from __future__ import annotations
import threading
import pytest
apsw = pytest.importorskip("apsw")
import walkit.adapters.sqlite as sq
from walkit.testing.processes import wait_until
from .sqlite_review_helpers import HeldAppend, commit_in_thread, file_rows
from .sqlitehelpers import cluster, nodes, unique  # noqa
from .test_zz_probe_group import pair


def test_query_only_in_member(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    leader.execute("INSERT INTO t VALUES (1, 'a')")
    try:
        leader.execute("PRAGMA query_only = ON")
        leader.commit()
        print("commit ok")
    except Exception as exc:
        print("commit raised", repr(exc))
    other = sq.connect(leader._database.path, name=leader._database.name, check_same_thread=False, timeout=5)
    try:
        with other:
            other.execute("INSERT INTO t VALUES (2, 'b')")
        print("other ok")
    except Exception as exc:
        print("other raised", repr(exc))
    print("failed:", leader._database.machine.failed)
    print(leader._database.machine.db.execute("PRAGMA query_only").fetchall())
    print(file_rows(leader._database.path), follower.execute("select * from t").fetchall())
    assert leader._database.machine.failed is None


def test_temp_trigger_in_member(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    leader.execute("CREATE TABLE audit(id)")
    leader.commit()
    leader.execute("INSERT INTO t VALUES (1, 'a')")
    leader.execute("CREATE TEMP TRIGGER mine AFTER INSERT ON t BEGIN INSERT INTO audit VALUES (new.id); END")
    leader.commit()
    other = sq.connect(leader._database.path, name=leader._database.name, check_same_thread=False, timeout=5)
    with other:
        other.execute("INSERT INTO t VALUES (2, 'b')")
    follower.read_barrier()
    print(other.execute("select * from audit").fetchall(), follower.execute("select * from audit").fetchall())
    print(leader._database.machine.db.execute("select name from temp.sqlite_master").fetchall())
    assert follower.execute("select * from audit").fetchall() == []


def test_interrupt_rolls_back():
    db = apsw.Connection(":memory:")
    db.execute("create table t(x)")
    db.execute("begin")
    db.execute("insert into t values (1)")
    db.execute("savepoint a")
    n = [0]
    def prog():
        n[0] += 1
        return n[0] > 5
    db.set_progress_handler(prog, 1)
    try:
        db.execute("insert into t select value from generate_series(1, 100000)")
    except Exception as e:
        print("raised", repr(e))
    db.set_progress_handler(None)
    print("in txn", db.in_transaction)
