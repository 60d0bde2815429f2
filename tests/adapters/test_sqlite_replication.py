"""Replication of walkit.adapters.sqlite between nodes on in-process bookies (fast tier).

Followers apply every transaction in log order, schema changes in order with the data, with
the leader's values for RANDOM() and datetime('now'); a file that lost its last local commits
(a crash between the log's acknowledgement and the local COMMIT) is repaired from the log with
nothing applied twice; a changeset that does not apply stops that replica naming the position
and table; a deposed leader's next COMMIT fails and is rolled back locally.
"""

from __future__ import annotations

import shutil
import threading

import apsw
import pytest

import walkit.adapters.sqlite as sq

from .sqlitehelpers import Nodes, log_records, memory_cluster, unique
from walkit.testing.processes import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sqlite-replication")
    with memory_cluster(directory) as made:
        yield made


@pytest.fixture
def nodes(cluster, tmp_path):
    made = Nodes(cluster, tmp_path)
    yield made
    made.close()


def rows(conn, sql: str = "SELECT * FROM t ORDER BY 1") -> list:
    return conn.execute(sql).fetchall()


def pair(nodes, **options):
    name = unique("repl")
    first = nodes.connect(name, "n0", **options)
    second = nodes.connect(name, "n1", **options)
    return (first, second) if first.is_leader else (second, first)


def test_followers_apply_data_schema_and_leader_values(nodes):
    leader, follower = pair(nodes)
    leader.executescript("""
        CREATE TABLE t(id INTEGER PRIMARY KEY, r, at, note);
        CREATE TABLE nopk(a, b);
        CREATE TABLE audit(what);
        CREATE TRIGGER t_audit AFTER INSERT ON t BEGIN INSERT INTO audit VALUES ('insert ' || new.id); END;
        CREATE VIEW big AS SELECT id FROM t WHERE r > 0;
        PRAGMA user_version = 7;
    """)
    with leader:
        leader.execute("INSERT INTO t(r, at) VALUES (random(), datetime('now'))")
        leader.execute("INSERT INTO t(r, at) VALUES (randomblob(8), strftime('%f', 'now'))")
        leader.execute("INSERT INTO nopk VALUES (1, 'one'), (2, 'two')")
        leader.execute("ALTER TABLE t ADD COLUMN extra DEFAULT 'x'")          # schema between two changesets
        leader.execute("UPDATE t SET extra = 'y' WHERE id = 1")
        leader.execute("DELETE FROM nopk WHERE a = 1")
    leader.execute("CREATE TABLE copy AS SELECT id, r, random() AS noise FROM t")   # rows travel as values
    leader.execute("CREATE INDEX t_at ON t(at)")
    follower.read_barrier()
    for sql in ("SELECT * FROM t ORDER BY id", "SELECT rowid, * FROM nopk", "SELECT * FROM audit",
                "SELECT * FROM big", "SELECT rowid, * FROM copy", "PRAGMA user_version",
                "SELECT type, name, sql FROM sqlite_schema ORDER BY name"):
        assert rows(follower, sql) == rows(leader, sql), sql
    assert rows(follower, "SELECT count(*) FROM audit") == [(2,)]            # the trigger fired once, on the leader
    assert follower.position == leader.position


def test_write_on_a_follower_raises_not_leader_naming_the_leader(nodes):
    leader, follower = pair(nodes, forward_writes=False)
    leader.execute("CREATE TABLE t(x)")
    follower.read_barrier()
    before = len(log_records(leader))
    with pytest.raises(sq.NotLeader) as caught:
        follower.execute("INSERT INTO t VALUES (1)")
    assert caught.value.leader == leader._database.node_id and "leader" in str(caught.value)
    follower.rollback()
    with pytest.raises(sq.NotLeader):
        follower.execute("CREATE TABLE u(x)")
    assert follower.execute("SELECT count(*) FROM t").fetchone() == (0,)      # reads work
    assert len(log_records(leader)) == before


def test_concurrent_transactions_serialize_without_conflicts(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER)")
    with leader:
        leader.executemany("INSERT INTO t VALUES (?, 0)", [(i,) for i in range(4)])

    def work(k: int) -> None:
        conn = sq.connect(leader._database.path, name=leader._database.name)
        try:
            for _ in range(25):
                with conn:
                    (n,) = conn.execute("SELECT n FROM t WHERE id = ?", (k,)).fetchone()
                    conn.execute("UPDATE t SET n = ? WHERE id = ?", (n + 1, k))
                    conn.execute("UPDATE t SET n = n + 1 WHERE id = 0")
        finally:
            conn.close()
    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    follower.read_barrier()
    assert rows(leader) == rows(follower) == [(0, 75), (1, 25), (2, 25), (3, 25)]


def test_a_file_that_lost_its_last_commits_is_repaired_from_the_log(nodes, tmp_path):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n)")
    with leader:
        leader.execute("INSERT INTO t VALUES (1, 1)")
    follower.read_barrier()
    path, name = follower._database.path, follower._database.name
    follower.close()
    saved = str(tmp_path / "saved.db")
    source = apsw.Connection(path)
    with apsw.Connection(saved).backup("main", source, "main") as backup:       # the file as of now
        backup.step(-1)
    source.close()
    for i in range(2, 12):
        with leader:
            leader.execute("INSERT INTO t VALUES (?, ?)", (i, i))
            leader.execute("UPDATE t SET n = n + 1 WHERE id = 1")
    follower = nodes.connect(name, "n-late")                                  # caught up, then rolled back
    follower.read_barrier()
    follower.close()
    for suffix in ("", "-wal", "-shm"):
        shutil.os.remove(path + suffix) if shutil.os.path.exists(path + suffix) else None
    shutil.copy(saved, path)                                                  # the local commits are lost
    reopened = sq.connect(path, name=name, client=nodes.cluster.client(own_store=True), node_id="n-back",
                          check_same_thread=False)
    nodes.opened.append(reopened)
    reopened.read_barrier()
    assert rows(reopened) == rows(leader) and rows(leader)[0] == (1, 11)       # each update applied once


def test_a_changeset_that_does_not_apply_stops_the_replica_naming_position_and_table(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n)")
    with leader:
        leader.execute("INSERT INTO t VALUES (1, 1)")
    follower.read_barrier()
    tamper = apsw.Connection(follower._database.path)                          # someone edits the replica's file
    tamper.execute("UPDATE t SET n = 99 WHERE id = 1")
    tamper.close()
    with leader:
        leader.execute("UPDATE t SET n = 2 WHERE id = 1")
    failed = wait_until(lambda: follower._database.machine.failed, 30, "the replica did not stop")
    assert failed.table == "t" and failed.position == leader.position
    assert str(leader.position) in str(failed) and "'t'" in str(failed)
    with pytest.raises(sq.ReplicaStopped):
        follower.execute("SELECT * FROM t")
    assert rows(leader) == [(1, 2)]


def test_a_deposed_leader_fails_its_commit_and_rolls_back(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n)")
    leader.execute("INSERT INTO t VALUES (1, 1)")                              # open, not committed
    leader._database.node.step_down()
    wait_until(lambda: follower.is_leader, 30, "the follower was not promoted")
    with pytest.raises((sq.NotLeader, sq.CommitFailed)) as caught:
        leader.commit()
    assert caught.value.leader in (None, follower._database.node_id)
    assert not leader.in_transaction
    with follower:
        follower.execute("INSERT INTO t VALUES (2, 2)")
    leader.read_barrier()
    assert rows(leader) == rows(follower) == [(2, 2)]
