from __future__ import annotations
import threading
import pytest
apsw = pytest.importorskip("apsw")
import walkit.adapters.sqlite as sq
from walkit.testing.processes import wait_until
from .sqlite_review_helpers import HeldAppend, commit_in_thread, file_rows
from .sqlitehelpers import cluster, nodes, unique  # noqa


def pair(nodes, **options):
    name = unique("grp")
    first = nodes.connect(name, "n0", **options)
    second = nodes.connect(name, "n1", **options)
    wait_until(lambda: first.is_leader or second.is_leader, 30, "no leader")
    return (first, second) if first.is_leader else (second, first)


def test_definition_mid_group_then_writer(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, n)")
    with leader:
        leader.execute("INSERT INTO c VALUES (0, 0)")
    other = sq.connect(leader._database.path, name=leader._database.name, check_same_thread=False, timeout=30)
    machine = leader._database.machine
    with HeldAppend() as held:
        t1, o1 = commit_in_thread(leader, "UPDATE c SET n = n + 1")
        assert held.reached.wait(30)
        sq.create_function(unique("fn"), 1, lambda x: x, deterministic=True)
        print("group after register", machine.members)
        t2, o2 = commit_in_thread(other, "UPDATE c SET n = n + 1")
        wait_until(lambda: machine.kept and len(machine.kept) == 1 and not leader._database.write_lock.locked(), 10, "second sent")
        held.release()
        t1.join(30); t2.join(30)
    print(o1, o2, machine.failed)
    follower.read_barrier(10)
    print(leader.execute("SELECT * FROM c").fetchall(), follower.execute("SELECT * FROM c").fetchall())
    assert o1.get("ok") and o2.get("ok")
    assert leader.execute("SELECT n FROM c").fetchall() == [(2,)]
    other.close()


def test_on_conflict_rollback_mid_group_then_writer(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, n)")
    leader.execute("CREATE TABLE u(id INTEGER PRIMARY KEY, v UNIQUE ON CONFLICT ROLLBACK)")
    with leader:
        leader.execute("INSERT INTO c VALUES (0, 0)")
        leader.execute("INSERT INTO u VALUES (1, 1)")
    path, name = leader._database.path, leader._database.name
    other = sq.connect(path, name=name, check_same_thread=False, timeout=30)
    third = sq.connect(path, name=name, check_same_thread=False, timeout=30)
    machine = leader._database.machine
    with HeldAppend() as held:
        t1, o1 = commit_in_thread(leader, "UPDATE c SET n = n + 1")
        assert held.reached.wait(30)
        wait_until(lambda: not leader._database.write_lock.locked(), 10, "sent")
        with pytest.raises(sq.IntegrityError):
            other.execute("INSERT INTO u VALUES (2, 1)")
        print("group after rollback", machine.members, other.in_transaction)
        t2, o2 = commit_in_thread(third, "UPDATE c SET n = n + 1")
        wait_until(lambda: len(machine.kept) == 1 and not leader._database.write_lock.locked(), 10, "second sent")
        held.release()
        t1.join(30); t2.join(30)
    print(o1, o2, machine.failed)
    assert machine.failed is None
    follower.read_barrier(10)
    assert o1.get("ok") and o2.get("ok")
    assert leader.execute("SELECT n FROM c").fetchall() == [(2,)]
    other.close(); third.close()


def test_open_member_blocks_earlier_commit(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    other = sq.connect(leader._database.path, name=leader._database.name, check_same_thread=False, timeout=30)
    with HeldAppend() as held:
        t1, o1 = commit_in_thread(leader, "INSERT INTO t VALUES (1, 'a')")
        assert held.reached.wait(30)
        wait_until(lambda: not leader._database.write_lock.locked(), 10, "sent")
        other.execute("INSERT INTO t VALUES (2, 'b')")     # open, running member
        held.release()
        t1.join(5)
        print("first commit returned?", not t1.is_alive(), o1)
        alive = t1.is_alive()
        other.rollback()
        t1.join(30)
    assert not alive


def test_begin_immediate_reader_sees_member(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    other = sq.connect(leader._database.path, name=leader._database.name, check_same_thread=False, timeout=30)
    with HeldAppend() as held:
        t1, o1 = commit_in_thread(leader, "INSERT INTO t VALUES (1, 'a')")
        assert held.reached.wait(30)
        wait_until(lambda: not leader._database.write_lock.locked(), 10, "sent")
        other.execute("BEGIN IMMEDIATE")
        seen = other.execute("SELECT * FROM t").fetchall()
        other.commit()
        print("seen", seen, file_rows(leader._database.path))
        held.release()
        t1.join(30)
    assert seen == []
