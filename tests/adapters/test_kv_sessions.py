"""SESSION <client> <seq> <write>: a write retried by a client that names itself applies once (in one process)."""

from __future__ import annotations

import socket

import pytest

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)


def session(r: redis.Redis, client: str, seq, *command):
    return r.execute_command("SESSION", client, seq, *command)


def raw(port: int, *args: bytes) -> bytes:
    """raw sends one command and returns the reply's bytes as sent (to tell +OK from $2 OK)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += s.recv(4096)
        return reply


def test_a_retried_session_write_gets_its_first_reply_and_is_applied_once(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    r = node.redis()
    assert session(r, "app-1", 1, "INCR", "hits") == 1
    assert session(r, "app-1", 1, "INCR", "hits") == 1           # the retry: the first reply, not applied again
    assert r.get("hits") == b"1"
    assert session(r, "app-1", 2, "INCRBY", "hits", 5) == 6
    assert session(r, "app-2", 1, "INCR", "hits") == 7           # another client's seq 1 is its own
    assert session(r, "app-1", 2, "INCRBY", "hits", 5) == 6
    assert r.get("hits") == b"7"
    # a status reply and its retry are both a status (+OK), an error reply and its retry the same error
    assert raw(node.port, b"SESSION", b"app-1", b"3", b"SET", b"word", b"x") == b"+OK\r\n"
    assert raw(node.port, b"SESSION", b"app-1", b"3", b"SET", b"word", b"x") == b"+OK\r\n"
    with pytest.raises(redis.ResponseError, match="not an integer") as first:
        session(r, "app-1", 4, "INCR", "word")
    with pytest.raises(redis.ResponseError) as again:
        session(r, "app-1", 4, "INCR", "word")
    assert str(again.value) == str(first.value)
    assert r.get("word") == b"x"
    # a seq below the client's last: refused, not applied
    with pytest.raises(redis.ResponseError, match="older than submit 4, applied already"):
        session(r, "app-1", 1, "INCR", "hits")
    assert r.get("hits") == b"7"
    # plain writes in between are untouched by sessions
    assert r.incr("hits") == 8


def test_session_arguments_that_make_no_sense_are_refused_and_the_connection_goes_on(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    r = node.redis()
    cases = {
        ("c", 0, "INCR", "k"): "seq",
        ("c", -3, "INCR", "k"): "seq",
        ("c", "x", "INCR", "k"): "seq",
        ("c", 1, "GET", "k"): "write command",
        ("c", 1, "NOPE", "k"): "write command",
        ("c", 1, "SESSION", "d", 1, "INCR", "k"): "write command",
        ("c" * 257, 1, "INCR", "k"): "client name",
        ("c", 1, "INCR"): "wrong number of arguments",
    }
    for args, message in cases.items():
        with pytest.raises(redis.ResponseError, match=message):
            session(r, *args)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SESSION", "c", 1)
    assert raw(node.port, b"SESSION", b"\xff", b"1", b"INCR", b"k").startswith(b"-ERR SESSION's client name")
    assert r.get("k") is None
    assert session(r, "c", 1, "INCR", "k") == 1


def test_the_new_leader_answers_a_retry_with_the_first_reply(kv_nodes):
    a = kv_nodes()
    wait_until(lambda: a.is_leader, 10)
    b = kv_nodes()
    ra = a.redis()
    assert session(ra, "app", 1, "INCR", "n") == 1
    assert session(ra, "app", 2, "INCR", "n") == 2
    a.stop()                                        # the answer to seq 2 "was lost": the client retries elsewhere
    wait_until(lambda: b.is_leader, 20, message="b leads")
    rb = b.redis()
    assert session(rb, "app", 2, "INCR", "n") == 2
    assert rb.get("n") == b"2"
    assert session(rb, "app", 3, "INCR", "n") == 3


def test_sessions_survive_a_snapshot_a_truncated_log_and_a_node_that_starts_from_the_snapshot(kv_nodes):
    a = kv_nodes(snapshot_every=1_000_000, roll_entries=5)
    wait_until(lambda: a.is_leader, 10)
    r = a.redis()
    for seq in range(1, 31):
        assert session(r, "app", seq, "INCR", "n") == seq
    pointer = a.node.snapshot_now(timeout=30)
    assert pointer is not None
    for i in range(20):                             # later entries roll the log on past the truncation point
        r.set(f"filler{i}", i)
    b = kv_nodes(snapshot_every=1_000_000, roll_entries=5)   # starts from the snapshot: the log before it is gone
    wait_until(lambda: b.node.ready and b.node.snapshot_position is not None, 20)
    a.stop()
    wait_until(lambda: b.is_leader, 20, message="b leads")
    rb = b.redis()
    assert session(rb, "app", 30, "INCR", "n") == 30       # kept in the snapshot, not applied again
    with pytest.raises(redis.ResponseError, match="older than"):
        session(rb, "app", 12, "INCR", "n")
    assert rb.get("n") == b"30"
    assert session(rb, "app", 31, "INCR", "n") == 31
