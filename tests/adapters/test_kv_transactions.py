"""MULTI/EXEC/DISCARD/WATCH through redis-py on an in-process server: a transaction is one record."""

from __future__ import annotations

import socket
import threading

import pytest

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)


@pytest.fixture
def client(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    return node.redis()


def test_redis_py_s_default_pipeline_is_a_transaction_answered_as_one(client):
    with client.pipeline() as pipe:                        # transaction=True: MULTI ... EXEC
        pipe.set("a", 1).incr("a").incrby("a", 10).get("a")
        assert pipe.execute() == [True, 2, 12, b"12"]
    assert client.get("a") == b"12"


def test_an_error_inside_exec_does_not_stop_the_other_commands(client):
    client.set("text", "abc")
    with client.pipeline() as pipe:
        pipe.set("x", 1).incr("text").incr("x")
        replies = pipe.execute(raise_on_error=False)
    assert replies[0] is True and replies[2] == 2
    assert isinstance(replies[1], redis.ResponseError) and "not an integer" in str(replies[1])


def test_a_command_refused_while_queued_discards_the_transaction(client):
    raw = client.connection_pool.get_connection("_")
    try:
        raw.send_command("MULTI")
        assert raw.read_response() == b"OK"
        raw.send_command("SET", "k", "v")
        assert raw.read_response() == b"QUEUED"
        raw.send_command("NOSUCHCOMMAND", "k")
        with pytest.raises(redis.ResponseError, match="unknown command"):
            raw.read_response()
        raw.send_command("EXEC")
        with pytest.raises(redis.exceptions.ExecAbortError, match="discarded because of previous errors"):
            raw.read_response()
    finally:
        client.connection_pool.release(raw)
    assert client.get("k") is None


def test_watch_aborts_exec_when_another_client_changed_the_key_and_not_for_its_own_writes(client, kv_nodes):
    other = redis.Redis(port=client.connection_pool.connection_kwargs["port"], socket_timeout=20)
    client.set("balance", 100)
    with client.pipeline() as pipe:
        pipe.watch("balance")
        assert int(pipe.get("balance")) == 100             # immediate mode after WATCH
        other.incrby("balance", 5)                          # another client changes the watched key
        pipe.multi()
        pipe.set("balance", 0)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert client.get("balance") == b"105"
    with client.pipeline() as pipe:                        # unchanged since WATCH: EXEC runs
        pipe.watch("balance")
        value = int(pipe.get("balance"))
        pipe.multi()
        pipe.set("balance", value - 5)
        assert pipe.execute() == [True]
    assert client.get("balance") == b"100"
    # the connection's own write just before WATCH, still in flight, does not break its watch
    port = client.connection_pool.connection_kwargs["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"SET mine 1\r\nWATCH mine\r\nMULTI\r\nINCR mine\r\nEXEC\r\n")     # pipelined
        expected = b"+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:2\r\n"
        assert receive(sock, len(expected)) == expected
        # pipelined behind its own pending write, a WATCH still counts: a write of its own after it
        # breaks it, EXEC then forgets it, and the next transaction runs
        sock.sendall(b"SET mine 5\r\nWATCH mine\r\nSET mine 6\r\nMULTI\r\nINCR mine\r\nEXEC\r\n"
                     b"MULTI\r\nINCR mine\r\nEXEC\r\nGET mine\r\n")
        expected = (b"+OK\r\n+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*-1\r\n"
                    b"+OK\r\n+QUEUED\r\n*1\r\n:7\r\n$1\r\n7\r\n")
        assert receive(sock, len(expected)) == expected


def receive(sock, size: int) -> bytes:
    got = b""
    while len(got) < size:
        data = sock.recv(4096)
        assert data, got
        got += data
    return got


def test_redis_py_transaction_helper_retries_until_its_watch_holds(client):
    client.set("counter", 0)
    stop = threading.Event()
    other = redis.Redis(port=client.connection_pool.connection_kwargs["port"], socket_timeout=20)

    def meddle() -> None:
        while not stop.is_set():
            other.incr("noise")
            other.incr("counter")

    thread = threading.Thread(target=meddle)
    thread.start()
    try:
        for _ in range(20):
            def double(pipe) -> None:
                value = int(pipe.get("counter"))
                pipe.multi()
                pipe.set("counter", value * 2)
                pipe.set("last", value * 2)
            client.transaction(double, "counter")
            # the doubled value was written from the value read under the watch: never lost
            assert int(client.get("counter")) >= int(client.get("last"))
    finally:
        stop.set()
        thread.join(10)


def test_discard_and_nested_multi_and_exec_without_multi_answer_as_redis_does(client):
    conn = client.connection_pool.get_connection("_")
    try:
        def call(*args):
            conn.send_command(*args)
            try:
                return conn.read_response()
            except redis.ResponseError as exc:
                return f"error: {exc}"
        assert call("EXEC") == "error: EXEC without MULTI"
        assert call("DISCARD") == "error: DISCARD without MULTI"
        assert call("MULTI") == b"OK"
        assert call("MULTI") == "error: MULTI calls can not be nested"
        assert call("WATCH", "x") == "error: WATCH inside MULTI is not allowed"
        assert call("SET", "x", "1") == b"QUEUED"
        assert call("DISCARD") == b"OK"
        assert call("GET", "x") is None
        assert call("MULTI") == b"OK"
        assert call("GET", "x") == b"QUEUED"
        assert call("EXEC") == [None]                      # reads only: one read, no record
    finally:
        client.connection_pool.release(conn)
