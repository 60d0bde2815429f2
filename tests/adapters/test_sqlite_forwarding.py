"""Writes from any node of walkit.adapters.sqlite: a follower's transaction runs on the leader (fast tier, issue 45 item 2).

Nodes are connections with their own files and clients on in-process bookies; the leader's
node serves forwarded writes on 127.0.0.1. A follower's transaction runs on the leader as the
leader's own (same checks, same record), reads its own writes before COMMIT, and COMMIT
returns once the follower's file has the write. A forward whose answer was lost is never sent
again: the caller gets CommitFailed and the write is in the log once.
"""

from __future__ import annotations

import threading
import types

import pytest

import walkit.adapters.sqlite as sq
import walkit.errors
from walkit.adapters.sqlite import channel, forwarding

from .sqlitehelpers import cluster, log_records, nodes, unique  # noqa: F401 - cluster and nodes are fixtures
from walkit.testing.processes import wait_until

FORWARD = {"forward_address": "127.0.0.1"}


def pair(nodes, **options):
    name = unique("fwd")
    first = nodes.connect(name, "n0", **FORWARD, **options)
    second = nodes.connect(name, "n1", **FORWARD, **options)
    leader, follower = (first, second) if first.is_leader else (second, first)
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT UNIQUE)")
    follower.read_barrier()
    return leader, follower


def test_a_follower_writes_and_reads_its_own_write_at_once(nodes):
    leader, follower = pair(nodes)
    before = len(log_records(leader))
    with follower:
        follower.execute("INSERT INTO t(v) VALUES (?)", ("from the follower",))
        follower.execute("INSERT INTO t(v) VALUES (?)", (b"\x00bytes",))
    assert not follower.is_leader
    # no read barrier: COMMIT returned once this node's file had the transaction
    assert follower.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "from the follower"),
                                                                             (2, b"\x00bytes")]
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (2,)
    assert len(log_records(leader)) == before + 1                          # one transaction, one record
    assert follower.position == leader.position


def test_a_forwarded_transaction_reads_its_writes_before_commit_and_rolls_back(nodes):
    leader, follower = pair(nodes)
    before = len(log_records(leader))
    follower.execute("INSERT INTO t(v) VALUES ('a')")
    assert follower.in_transaction
    cursor = follower.execute("SELECT v FROM t")
    assert cursor.fetchall() == [("a",)] and cursor.description[0][0] == "v"
    follower.execute("CREATE TABLE u(x)")                                  # a schema step in the same transaction
    follower.execute("INSERT INTO u VALUES (42)")                          # a table only the leader knows yet
    assert follower.execute("SELECT x FROM u").fetchone() == (42,)
    follower.rollback()
    assert not follower.in_transaction
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert leader.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'u'").fetchone() == (0,)
    assert len(log_records(leader)) == before


def test_forwarded_statements_report_rowcount_lastrowid_and_errors_of_their_class(nodes):
    leader, follower = pair(nodes)
    cursor = follower.cursor()
    cursor.executemany("INSERT INTO t(v) VALUES (?)", [("x",), ("y",), ("z",)])
    assert cursor.rowcount == 3
    cursor.execute("INSERT INTO t(v) VALUES (:v)", {"v": "w"})
    assert cursor.lastrowid == 4
    with pytest.raises(sq.IntegrityError, match="UNIQUE constraint failed: t.v"):
        follower.execute("INSERT INTO t(v) VALUES ('x')")
    assert follower.in_transaction                                         # a failed statement undoes itself only
    cursor.execute("UPDATE t SET v = upper(v) WHERE v IN ('x', 'y')")
    assert cursor.rowcount == 2
    follower.commit()
    assert follower.execute("SELECT v FROM t ORDER BY id").fetchall() == [("X",), ("Y",), ("z",), ("w",)]
    follower.executescript("BEGIN; CREATE TABLE s(a); INSERT INTO s VALUES (1), (2); COMMIT;")
    assert follower.execute("SELECT sum(a) FROM s").fetchone() == (3,)
    with pytest.raises(sq.OperationalError, match="no such function: nowhere"):
        follower.execute("CREATE INDEX t_nowhere ON t(v) WHERE nowhere(v)")   # the leader's checks, as its own
    follower.execute("INSERT INTO t(v) VALUES ('pending')")
    follower.isolation_level = None                                        # commits the pending transaction, as sqlite3
    assert not follower.in_transaction and leader.execute("SELECT count(*) FROM t").fetchone() == (5,)
    follower.execute("DELETE FROM t WHERE v IN ('w', 'pending')")          # autocommit: committed at once
    assert not follower.in_transaction and follower.execute("SELECT count(*) FROM t").fetchone() == (3,)


def test_a_follower_transaction_that_read_an_old_copy_fails_as_sqlite_does(nodes):
    leader, follower = pair(nodes)
    follower.execute("BEGIN")
    assert follower.execute("SELECT count(*) FROM t").fetchone() == (0,)  # read this node's copy
    leader.execute("INSERT INTO t(v) VALUES ('meanwhile')")
    leader.commit()
    with pytest.raises(sq.OperationalError, match="database is locked") as caught:
        follower.execute("INSERT INTO t(v) VALUES ('late')")
    assert caught.value.sqlite_errorname == "SQLITE_BUSY_SNAPSHOT"
    follower.rollback()
    follower.read_barrier()
    with follower:                                                         # again, on the current state
        follower.execute("BEGIN")
        (count,) = follower.execute("SELECT count(*) FROM t").fetchone()
        follower.execute("INSERT INTO t(v) VALUES (?)", (f"after {count}",))
    assert leader.execute("SELECT v FROM t ORDER BY id").fetchall() == [("meanwhile",), ("after 1",)]


def test_begin_immediate_on_a_follower_holds_the_leaders_write_lock(nodes):
    leader, follower = pair(nodes)
    follower.execute("BEGIN IMMEDIATE")
    assert follower.in_transaction
    other = sq.connect(leader._database.path, name=leader._database.name, timeout=0.2, check_same_thread=False)
    try:
        with pytest.raises(sq.OperationalError, match="database is locked"):
            other.execute("INSERT INTO t(v) VALUES ('blocked')")
        follower.execute("INSERT INTO t(v) VALUES ('held')")
        follower.commit()
        other.rollback()
        other.execute("INSERT INTO t(v) VALUES ('after')")
        other.commit()
    finally:
        other.close()
    assert follower.execute("SELECT v FROM t ORDER BY id").fetchall()[0] == ("held",)


def test_a_forward_whose_answer_is_lost_raises_commit_failed_and_is_not_sent_again(nodes, monkeypatch):
    leader, follower = pair(nodes)
    handle = forwarding._Session.handle

    def lose_the_commit_answer(self, request):
        reply = handle(self, request)
        if request.get("op") == "commit":
            raise ConnectionError("the answer was lost")                  # the server closes the channel unanswered
        return reply
    monkeypatch.setattr(forwarding._Session, "handle", lose_the_commit_answer)
    follower.execute("INSERT INTO t(v) VALUES ('once')")
    with pytest.raises(sq.CommitFailed, match="may or may not be in the log"):
        follower.commit()
    monkeypatch.setattr(forwarding._Session, "handle", handle)
    assert not follower.in_transaction
    follower.read_barrier()
    assert follower.execute("SELECT v FROM t").fetchall() == [("once",)]   # it happened, once
    with follower:                                                         # a new channel to the same leader
        follower.execute("INSERT INTO t(v) VALUES ('next')")
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (2,)


def test_a_leader_change_mid_transaction_ends_it_and_the_next_goes_to_the_new_leader(nodes):
    name = unique("fwd")
    conns = [nodes.connect(name, f"n{i}", **FORWARD) for i in range(3)]
    leader = wait_until(lambda: next((c for c in conns if c.is_leader), None), 30, "no leader")
    leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    follower = next(c for c in conns if c is not leader)
    follower.read_barrier()
    follower.execute("INSERT INTO t(v) VALUES ('lost with the leader')")
    leader.close()                                                         # steps down: its sessions roll back
    survivors = [c for c in conns if c is not leader]
    new = wait_until(lambda: next((c for c in survivors if c.is_leader), None), 30, "no new leader")
    with pytest.raises(sq.OperationalError):
        follower.execute("INSERT INTO t(v) VALUES ('second')")
        follower.commit()
    follower.rollback()
    assert not follower.in_transaction
    with follower:
        follower.execute("INSERT INTO t(v) VALUES ('after the change')")
    new.read_barrier()
    assert new.execute("SELECT v FROM t").fetchall() == [("after the change",)]


def test_concurrent_forwarded_transactions_serialize(nodes):
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, n INTEGER)")
    leader.execute("INSERT INTO c VALUES (1, 0)")
    leader.commit()
    follower.read_barrier()
    path, name = follower._database.path, follower._database.name
    failures: list[BaseException] = []

    def work() -> None:
        conn = sq.connect(path, name=name, check_same_thread=False, timeout=30)
        try:
            for _ in range(10):
                with conn:
                    conn.execute("UPDATE c SET n = n + 1 WHERE id = 1")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            conn.close()
    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert follower.execute("SELECT n FROM c").fetchone() == (30,)


def test_writes_are_not_forwarded_when_turned_off(nodes):
    leader, follower = pair(nodes, forward_writes=False)
    with pytest.raises(sq.NotLeader) as caught:
        follower.execute("INSERT INTO t(v) VALUES ('no')")
    assert caught.value.leader == leader._database.node_id


def test_a_secured_cluster_serves_no_forwarding_and_says_why(nodes):
    secured = types.SimpleNamespace(client=types.SimpleNamespace(principal="ab" * 32, metadata_url="sqlite:///x"))
    why = forwarding.serve(secured, None)
    assert isinstance(why, str) and "secured" in why
    leader, follower = pair(nodes)
    follower._database.client.principal = "ab" * 32                        # as a client with CurveZMQ keys
    try:
        with pytest.raises(sq.NotLeader, match="secured cluster"):
            follower.execute("INSERT INTO t(v) VALUES ('no')")
    finally:
        follower._database.client.principal = ""
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_wrong_key_is_refused_before_anything_runs(nodes):
    import json
    import socket
    leader, follower = pair(nodes)
    server = leader._database.forwarding
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        nonce = channel.receive(sock)["nonce"]
        channel.send(sock, {"proof": channel.proof(b"not the key", nonce)})
        assert "wrong key" in channel.receive(sock)["error"]["message"]
    value, _ = leader._database.client.store.get(channel.endpoint_key(leader._database.name,
                                                                         leader._database.node_id))
    assert json.loads(value)["address"] == server.address


def test_a_silent_follower_transaction_lets_the_leaders_write_lock_go(nodes, monkeypatch):
    monkeypatch.setattr(forwarding, "IDLE_S", 0.5)
    leader, follower = pair(nodes)
    follower.execute("INSERT INTO t(v) VALUES ('abandoned')")            # the leader's write lock is held for it

    def lock_free() -> bool:
        lock = leader._database.write_lock
        if lock.acquire(blocking=False):
            lock.release()
            return True
        return False
    wait_until(lock_free, 10, "the idle forwarded transaction kept the leader's write lock")
    with pytest.raises(sq.OperationalError, match="rolled back"):
        follower.execute("INSERT INTO t(v) VALUES ('too late')")
    assert not follower.in_transaction
    assert leader.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_node_guesses_no_forwarding_address(nodes):
    remote = types.SimpleNamespace(client=types.SimpleNamespace(principal="", metadata_url="zk://10.0.0.2:2181/walkit"))
    why = forwarding.serve(remote, None)
    assert isinstance(why, str) and "forward_address" in why               # not an address others could not dial
    assert "forward_address=False" in forwarding.serve(remote, False)
    with pytest.raises(walkit.errors.ConfigError, match="wildcard"):
        forwarding.serve(remote, "0.0.0.0:7000")


def test_status_says_which_nodes_take_no_forwarded_writes_and_why(nodes):
    from walkit.adapters.sqlite import status
    name = unique("fwd")
    served = nodes.connect(name, "served", **FORWARD)
    unserved = nodes.connect(name, "unserved", forward_address=False)

    def lines() -> list[str]:
        found = status.gather(served._database.client, name)
        return found.lines() if len(found.nodes) == 2 else []
    text = "\n".join(wait_until(lines, 10, "the nodes did not publish their status"))
    assert "unserved takes no writes forwarded from other nodes: it was started with forward_address=False" in text
    assert "served takes no" not in text.replace("unserved takes no", "")
    assert unserved._database.forwarding == "it was started with forward_address=False"


def test_a_transaction_that_wrote_while_its_node_led_is_not_moved_to_the_new_leader(nodes):
    leader, follower = pair(nodes)
    leader.execute("INSERT INTO t(v) VALUES ('first')")                   # written here, while this node leads
    leader._database.node.step_down()
    wait_until(lambda: follower.is_leader, 30, "the other node was not elected")
    leader.execute("INSERT INTO t(v) VALUES ('second')")                  # stays here: forwarding it would drop 'first'
    with pytest.raises(sq.OperationalError):                               # NotLeader: rolled back
        leader.commit()
    assert not leader.in_transaction
    assert follower.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with leader:                                                           # the next one goes to the new leader
        leader.execute("INSERT INTO t(v) VALUES ('third')")
    assert follower.execute("SELECT v FROM t").fetchall() == [("third",)]
