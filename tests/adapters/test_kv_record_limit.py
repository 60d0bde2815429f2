"""A write whose log record is over the store's limit gets an error reply; the connection and server go on.

walkit refuses a record over walkit.replicate's `max_record_bytes` (RecordTooLarge) before
anything is sent. The KV server used to let that error out of the connection's handler, which
dropped the connection without a reply. These tests set a small limit (a keyword of the node)
and send a SET, a MULTI/EXEC and a SESSION write over it, with writes before and after in the
same pipeline: each oversized one is answered with an error naming the limit, nothing of it is
applied, and the writes around it are.
"""

from __future__ import annotations

import pytest

from tests.adapters.conftest import serving

LIMIT = 4096


@pytest.fixture
def small(kv_nodes):
    node = kv_nodes(max_record_bytes=LIMIT)
    return serving(node)


def test_a_set_over_the_record_limit_is_answered_with_an_error_and_the_connection_serves_on(small):
    import redis
    big = b"v" * (LIMIT + 1)
    pipe = small.pipeline(transaction=False)
    pipe.set("before", "1")
    pipe.set("big", big)
    pipe.set("after", "2")
    before, refused, after = pipe.execute(raise_on_error=False)
    assert before is True and after is True
    assert isinstance(refused, redis.ResponseError)
    assert "max_record_bytes" in str(refused) and str(LIMIT) in str(refused)
    assert small.get("big") is None and small.mget("before", "after") == [b"1", b"2"]
    assert small.set("again", "3") and small.get("again") == b"3"


def test_an_exec_over_the_record_limit_runs_nothing_and_answers_an_error(small):
    import redis
    with pytest.raises(redis.ResponseError, match="max_record_bytes"):
        with small.pipeline(transaction=True) as pipe:
            pipe.set("a", b"x" * (LIMIT // 2))
            pipe.set("b", b"y" * (LIMIT // 2))     # together over the limit
            pipe.execute()
    assert small.mget("a", "b") == [None, None]
    with small.pipeline(transaction=True) as pipe:  # the connection pool's connection serves on
        pipe.set("a", "1").incr("n")
        assert pipe.execute() == [True, 1]


def test_a_session_write_over_the_record_limit_is_refused_and_the_seq_stays_unused(small):
    import redis
    with pytest.raises(redis.ResponseError, match="max_record_bytes"):
        small.execute_command("SESSION", "c1", 1, "SET", "k", b"z" * (LIMIT + 1))
    assert small.execute_command("SESSION", "c1", 1, "SET", "k", "small") == b"OK"
    assert small.get("k") == b"small"


def test_a_raw_connection_gets_every_reply_in_order_around_a_refused_write(small, kv_nodes):
    """The same over a plain socket: the replies of a pipeline arrive, one per command, in order."""
    import socket
    port = small.connection_pool.connection_kwargs["port"]
    big = b"w" * (LIMIT + 10)
    request = (b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\n1\r\n"
               + b"*3\r\n$3\r\nSET\r\n$1\r\ny\r\n$%d\r\n%s\r\n" % (len(big), big)
               + b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        data = b""
        while data.count(b"\r\n") < 4:           # +OK, -ERR ..., $1, 1
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {data!r}"
            data += chunk
    lines = data.split(b"\r\n")
    assert lines[0] == b"+OK" and lines[1].startswith(b"-ERR ") and lines[2:4] == [b"$1", b"1"], data


def test_with_the_default_limit_a_transaction_of_two_large_values_is_refused_not_dropped(kv_nodes):
    """Each value fits RESP's 32 MB bulk limit, so redis-server would take it; together they are
    over the default record limit (the client's 60 MiB entries): refused with an error reply."""
    import redis
    client = serving(kv_nodes())
    value = b"q" * (31 * 1024 * 1024)
    with pytest.raises(redis.ResponseError, match="max_record_bytes"):
        with client.pipeline(transaction=True) as pipe:
            pipe.set("one", value).set("two", value)
            pipe.execute()
    assert client.exists("one", "two") == 0
    assert client.set("one", value) and client.strlen("one") == len(value)     # one alone fits
