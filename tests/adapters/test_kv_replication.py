"""The replicated store in one process: replication, read-your-writes, fencing, snapshots, truncation."""

from __future__ import annotations

import concurrent.futures
import io
import random
import socket
import threading

import pytest

from walkit import Position
from walkit.errors import LogTruncated, NotLeader
from walkit.replication.snapshots import read_pointer, write_snapshot

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)


def test_a_follower_replicates_serves_reads_and_refuses_writes_naming_the_leader(kv_nodes):
    a = kv_nodes()
    wait_until(lambda: a.is_leader, 10, message="the first node leads")
    b = kv_nodes()
    r = a.redis()
    r.mset({f"k{i}": i for i in range(100)})
    assert r.incrby("counter", 5) == 5
    follower = b.redis()
    wait_until(lambda: follower.get("counter") == b"5" and follower.dbsize() == 101, 10)
    assert follower.mget("k1", "k99", "nope") == [b"1", b"99", None]
    with pytest.raises(redis.ReadOnlyError, match=f"Leader: {a.address}"):
        follower.set("x", "1")
    assert follower.execute_command("ROLE")[:3] == [b"slave", b"127.0.0.1", a.port]
    info = follower.info("replication")
    assert info["role"] == "slave" and info["walkit_role"] == "follower" and info["leader"] == a.address
    wait_until(lambda: b.redis().info("replication")["lag_entries"] == 0, 10)
    assert a.redis().info("replication")["role"] == "master"


def test_pipelined_reads_see_exactly_the_writes_sent_before_them(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    rng = random.Random(5)
    model: dict[bytes, int] = {}
    pipe = node.redis().pipeline(transaction=False)
    expected = []
    for _ in range(2000):
        key = b"k%d" % rng.randrange(5)
        op = rng.randrange(3)
        if op == 0:
            value = rng.randrange(100)
            pipe.set(key, value)
            model[key] = value
            expected.append(True)
        elif op == 1:
            pipe.incr(key)
            model[key] = model.get(key, 0) + 1
            expected.append(model[key])
        else:
            pipe.get(key)
            expected.append(None if key not in model else b"%d" % model[key])
    assert pipe.execute() == expected


def test_concurrent_incr_results_are_computed_at_apply_time(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    results: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        r = node.redis()
        mine = [r.incr("shared") for _ in range(100)]
        with lock:
            results.extend(mine)
    threads = [threading.Thread(target=worker) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, 1001))
    assert node.redis().get("shared") == b"1000"


def test_expiry_replicates_and_keys_vanish_on_time(kv_nodes):
    a = kv_nodes()
    wait_until(lambda: a.is_leader, 10)
    b = kv_nodes()
    r = a.redis()
    assert r.set("short", "v", px=300) and r.set("long", "v", ex=100)
    assert 0 < r.pttl("short") <= 300 and 99 <= r.ttl("long") <= 100
    wait_until(lambda: b.redis().get("long") == b"v", 10)
    wait_until(lambda: r.get("short") is None and b.redis().get("short") is None, 10)
    assert r.exists("short", "long") == 1 and r.dbsize() == 1


def test_a_deposed_leader_gets_fenced_steps_down_and_follows(kv_nodes):
    a = kv_nodes()
    wait_until(lambda: a.is_leader, 10)
    b = kv_nodes()
    old = a.redis()
    for i in range(50):
        assert old.set(f"a{i}", i)
    # a loses the election without noticing (as if paused past its lease): b wins and opens the log.
    a.node.election.resign()
    wait_until(lambda: b.is_leader, 20, message="b takes over")
    new = b.redis()
    for i in range(50):
        assert new.set(f"b{i}", i)
    with pytest.raises(redis.ResponseError, match="LedgerFenced"):
        old.set("late", "write")                       # the fenced append is refused, a steps down
    wait_until(lambda: not a.node.is_leader and a.node.leader == b.address, 20)
    assert old.info("replication")["walkit_role"] == "follower"
    with pytest.raises(redis.ReadOnlyError, match=f"Leader: {b.address}"):
        old.set("later", "write")
    wait_until(lambda: old.dbsize() == new.dbsize() == 100, 10)
    assert old.mget([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)]) == \
        [b"%d" % i for i in range(50)] * 2
    assert new.get("late") is None


def snapshot_settled(node) -> bool:
    """snapshot_settled tells whether the last snapshot the node started was published (and the log truncated)."""
    taken = node.machine.snapshot_taken_at
    return taken is not None and node.node.snapshot_position == taken


def test_snapshots_truncate_the_log_and_new_replicas_start_from_them(kv_nodes, memory_cluster):
    a = kv_nodes(snapshot_every=200, roll_entries=20)
    wait_until(lambda: a.is_leader, 10)
    r = a.redis()
    leaked = write_snapshot(a.new_client(), "kv-test", io.BytesIO(b""), Position(0, 0), ensemble=3,
                            write_quorum=2, ack_quorum=2)      # as if its writer died before publishing it
    for i in range(1000):
        r.set(f"key{i}", i, ex=3600 if i % 2 else None)
    r.set("gone", "soon", px=1)
    r.incr("key0")
    # 1002 records: a snapshot after every 200 or more, one at a time; wait until the last one is published.
    wait_until(lambda: r.info("persistence")["snapshots"] >= 4 and snapshot_settled(a), 20)
    client = a.new_client()
    pointer, _ = read_pointer(client.store, "kv-test")
    assert pointer.position == a.machine.snapshot_taken_at
    segments = client.log_metadata("replicated-kv-test").segments
    assert segments[0].ledger_id >= pointer.position.ledger_id > 0    # ledgers before the snapshot are gone
    snapshot_ledgers = [i for i in client.list_ledgers() if "snapshot" in client.ledger_metadata(i).custom]
    assert snapshot_ledgers == [pointer.ledger_id]                     # earlier and leaked ones collected
    assert leaked.ledger_id not in client.list_ledgers()
    b = kv_nodes(snapshot_every=200, roll_entries=20)
    wait_until(lambda: b.node.snapshot_position is not None, 10, message="b loads the snapshot")
    follower = b.redis()
    wait_until(lambda: follower.info("replication")["applied_records"] == 1002, 10)
    assert follower.dbsize() == 1000
    assert follower.get("key0") == b"1" and follower.get("key999") == b"999" and follower.get("gone") is None
    assert 3500 < follower.ttl("key1") <= 3600 and follower.ttl("key2") == -1


def test_a_node_that_starts_after_truncation_loads_the_snapshot_and_catches_up(kv_nodes):
    a = kv_nodes(snapshot_every=100, roll_entries=10)
    wait_until(lambda: a.is_leader, 10)
    r = a.redis()
    r.set("first", "1")
    client = a.new_client()
    early = client.log_metadata("replicated-kv-test").segments[0]
    for i in range(600):
        r.set(f"k{i}", i, px=3_600_000 if i % 3 == 0 else None)
    wait_until(lambda: r.info("persistence")["snapshots"] >= 2 and snapshot_settled(a), 20)
    with pytest.raises(LogTruncated):                  # walkit sees the reader's ledger is gone
        list(client.read_log("replicated-kv-test", start=Position(early.ledger_id, 1)))

    b = kv_nodes(snapshot_every=100, roll_entries=10)
    wait_until(lambda: b.machine.index == a.machine.index and b.node.snapshot_position is not None, 20)
    with a.machine.lock, b.machine.lock:
        assert dict(b.machine.state.data) == dict(a.machine.state.data)
        assert b.machine.state.expires == a.machine.state.expires
    assert b.redis().get("first") == b"1" and b.redis().pttl("k0") > 3_500_000


def test_bad_input_gets_errors_and_the_server_carries_on(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)

    def exchange(payload: bytes, replies: int) -> bytes:
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
            s.sendall(payload)
            data = b""
            while data.count(b"\r\n") < replies:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data
    out = exchange(b"NOSUCH a b\r\nGET\r\nSET k v EX 0\r\nSET k v NX XX\r\nINCRBY k x\r\nSELECT 1\r\n"
                   b"SET k v\r\nINCR k\r\nGET k\r\nPING\r\n", 10)
    lines = out.split(b"\r\n")
    assert lines[0].startswith(b"-ERR unknown command 'NOSUCH'")
    assert lines[1] == b"-ERR wrong number of arguments for 'get' command"
    assert lines[2] == b"-ERR invalid expire time in 'set' command"
    assert lines[3] == b"-ERR syntax error"
    assert lines[4] == b"-ERR value is not an integer or out of range"
    assert lines[5] == b"-ERR DB index is out of range"
    assert lines[6:11] == [b"+OK", b"-ERR value is not an integer or out of range", b"$1", b"v", b"+PONG"]
    assert exchange(b"*1\r\n$x\r\n", 1).startswith(b"-ERR Protocol error")    # then the server closes it
    assert node.redis().ping()


def test_a_write_that_may_be_in_the_log_is_never_answered_readonly(kv_nodes):
    """READONLY tells a Redis client its write did not happen. A write sent to the log before the leader
    stepped down may be in it (walkit.errors.NotLeader.maybe_in_log): its answer says the outcome is
    unknown; a write that was never appended is still answered as not led here (READONLY naming the leader,
    or LOADING on a leader still replaying)."""
    node = kv_nodes()
    wait_until(lambda: node.node.is_leader, 30)
    unknown, refused = concurrent.futures.Future(), concurrent.futures.Future()
    unknown.set_exception(NotLeader("node a stopped leading; the record may be in the log", "b", maybe_in_log=True))
    refused.set_exception(NotLeader("node a is not the leader", "b"))
    answer = node.server.write_reply(unknown)
    assert str(answer).startswith("ERR ") and "may or may not have taken effect" in str(answer)
    assert str(node.server.write_reply(refused)) == str(node.server.not_leader_error("b"))   # READONLY (LOADING here)
