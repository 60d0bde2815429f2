"""A read answered on its own (Connection._plain_read) gets the reply the general path gives it.

A client that waits for each reply sends one command per read; a read command that is all the
connection holds is answered at once, without the reply slots. These tests send the same seeded
sequence of commands, one at a time, to one server twice: once as it runs, once with that shortcut
turned off, on keys of their own, and compare every reply.
"""

from __future__ import annotations

import random

import pytest
import redis

from walkit.adapters.kv.connection import Connection

from .conftest import serving


def commands(seed: int, count: int) -> list[tuple[str, ...]]:
    """commands is a seeded mix of reads, writes and transactions on keys k0..k4 (K: is the prefix); each is answered."""
    rng = random.Random(seed)
    key = lambda: f"K:k{rng.randrange(5)}"                                   # noqa: E731
    makers = [
        lambda: ("SET", key(), str(rng.randrange(100))), lambda: ("INCR", key()), lambda: ("DEL", key()),
        lambda: ("GET", key()), lambda: ("get", key()), lambda: ("MGET", key(), key()), lambda: ("EXISTS", key()),
        lambda: ("STRLEN", key()), lambda: ("TYPE", key()), lambda: ("GETRANGE", key(), "0", "1"),
        lambda: ("HSET", "K:h", f"f{rng.randrange(3)}", "v"), lambda: ("HGETALL", "K:h"), lambda: ("HGET", "K:h", "f1"),
        lambda: ("LPUSH", "K:l", "x"), lambda: ("LRANGE", "K:l", "0", "-1"), lambda: ("LLEN", "K:l"),
        lambda: ("GET",), lambda: ("GET", key(), key()), lambda: ("NOSUCHCOMMAND", key()),
        lambda: ("WATCH", key()), lambda: ("UNWATCH",), lambda: ("MULTI",), lambda: ("EXEC",), lambda: ("DISCARD",),
        lambda: ("PING",), lambda: ("ECHO", "e"),
    ]
    return [rng.choice(makers)() for _ in range(count)]


def replies(client: redis.Redis, prefix: str, sequence) -> list:
    """replies sends each command of `sequence` (K: replaced by `prefix`) on one connection and reads its reply."""
    connection = client.connection_pool.get_connection()
    try:
        out = []
        for command in sequence:
            connection.send_command(*[a.replace("K:", prefix) for a in command])
            try:
                reply = connection.read_response()
            except redis.ResponseError as exc:
                reply = ("error", str(exc).replace(prefix, "K:"))
            out.append(reply)
        return out
    finally:
        connection.disconnect()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reads_answered_on_their_own_match_the_general_path(kv_nodes, monkeypatch, seed):
    node = kv_nodes()
    client = serving(node)
    answered, plain_read = [], Connection._plain_read

    def counted(self, parser) -> bool:
        done = plain_read(self, parser)
        answered.append(done)
        return done
    monkeypatch.setattr(Connection, "_plain_read", counted)
    sequence = commands(seed, 800)
    fast = replies(client, "a:", sequence)
    assert sum(answered) > 30, "the shortcut was hardly taken: the test does not test it"
    monkeypatch.setattr(Connection, "_plain_read", lambda self, parser: False)
    assert replies(client, "b:", sequence) == fast


def test_a_read_after_client_reply_skip_or_off_is_not_answered(kv_nodes):
    node = kv_nodes()
    client = serving(node)
    client.set("x", "1")
    connection = client.connection_pool.get_connection()
    try:
        for mode in ("SKIP", "OFF"):
            connection.send_command("CLIENT", "REPLY", mode)
            connection.send_command("GET", "x")          # most often a read of its own
            connection.send_command("GET", "x")
            if mode == "OFF":
                connection.send_command("CLIENT", "REPLY", "ON")
                assert connection.read_response() == b"OK"   # ON answers itself
            connection.send_command("ECHO", "after")
            assert connection.read_response() == (b"1" if mode == "SKIP" else b"after")
            if mode == "SKIP":
                assert connection.read_response() == b"after"
    finally:
        connection.disconnect()


def test_a_read_waits_for_the_connections_write_before_it_and_inside_multi_is_queued(kv_nodes):
    node = kv_nodes()
    client = serving(node)
    connection = client.connection_pool.get_connection()
    try:
        connection.send_packed_command(connection.pack_command("SET", "x", "1") + connection.pack_command("GET", "x"))
        assert (connection.read_response(), connection.read_response()) == (b"OK", b"1")
        for command, reply in ((("MULTI",), b"OK"), (("GET", "x"), b"QUEUED"), (("EXEC",), [b"1"])):
            connection.send_command(*command)
            assert connection.read_response() == reply
    finally:
        connection.disconnect()


class HeldNode:
    """HeldNode stands for a leading walkit.replicate node whose submits stay pending until `answer()`."""

    ready = is_leader = lease_valid = True
    leader = None

    class election:                             # noqa: N801 - stands for the node's LeaderElection
        is_leader, epoch = True, 1

    def __init__(self) -> None:
        self.pending = []

    def hold_submits(self) -> None:
        pass

    def release_submits(self) -> None:
        pass

    def submit_async(self, record, submitter=None, *, client=None, seq=None):
        from walkit.futures import LightFuture
        future = LightFuture()
        self.pending.append(future)
        return future

    def answer(self, value) -> None:
        for future in self.pending:
            future.set_result(value)
        self.pending.clear()


class Written:
    """Written is a transport that keeps what the connection wrote."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_a_read_that_arrives_while_a_write_is_pending_is_answered_after_it():
    import asyncio
    from walkit.adapters.kv.machine import KVMachine
    from walkit.adapters.kv.resp import OK
    from walkit.adapters.kv.server import KVServer
    loop = asyncio.new_event_loop()
    try:
        server = KVServer(KVMachine(), loop)
        node = server.node = HeldNode()
        connection, transport = Connection(server), Written()
        connection.connection_made(transport)
        connection.data_received(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\n1\r\n")
        connection.data_received(b"*2\r\n$4\r\nECHO\r\n$1\r\na\r\n")     # each in a read of its own
        connection.data_received(b"*2\r\n$3\r\nGET\r\n$1\r\ny\r\n")
        assert transport.data == b"" and len(node.pending) == 1      # both wait for the SET's answer
        node.answer(OK)
        loop.call_soon(loop.stop)
        loop.run_forever()                                           # the Inbox hands the answer over
        loop.call_soon(loop.stop)
        loop.run_forever()                                           # the flush it scheduled
        assert transport.data == b"+OK\r\n$1\r\na\r\n$-1\r\n"
    finally:
        loop.close()
