"""RESP parsing and encoding: pipelines, partial reads, inline commands, protocol errors."""

from __future__ import annotations

import pytest

from walkit.adapters.kv.resp import MAX_BULK, OK, ProtocolError, ReplyError, RespParser, Simple, encode


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def drain(parser: RespParser) -> list:
    out = []
    while (cmd := parser.next()) is not None:
        out.append(cmd)
    return out


def test_pipelined_commands_come_out_in_order():
    parser = RespParser()
    parser.feed(command(b"SET", b"k", b"v") + command(b"GET", b"k") + command(b"PING"))
    assert drain(parser) == [[b"SET", b"k", b"v"], [b"GET", b"k"], [b"PING"]]


def test_commands_split_at_every_byte_are_reassembled():
    stream = command(b"SET", b"key", b"va\r\nlue") + b"PING\r\n" + command(b"GET", b"")
    parser = RespParser()
    out = []
    for i in range(len(stream)):
        parser.feed(stream[i:i + 1])
        out += drain(parser)
    assert out == [[b"SET", b"key", b"va\r\nlue"], [b"PING"], [b"GET", b""]]


def test_a_large_value_in_small_chunks_waits_without_reparsing():
    value = b"x" * 1_000_000
    stream = command(b"SET", b"k", value)
    parser = RespParser()
    for i in range(0, len(stream), 4096):
        parser.feed(stream[i:i + 4096])
        if i + 4096 < len(stream):
            assert parser.next() is None
    assert parser.next() == [b"SET", b"k", value]


def test_inline_commands_and_empty_lines():
    parser = RespParser()
    parser.feed(b"PING\r\n\r\nSET  a   b\nGET a\r\n")
    assert drain(parser) == [[b"PING"], [b"SET", b"a", b"b"], [b"GET", b"a"]]


@pytest.mark.parametrize("stream", [
    b"*2\r\n$3\r\nGET\r\n:1\r\n",                  # not a bulk string
    b"*x\r\n",                                     # bad count
    b"*1\r\n$-5\r\n",                              # negative length
    b"*1\r\n$%d\r\n" % (MAX_BULK + 1),             # too long
    b"*1\r\n$3\r\nGETxx",                          # missing CRLF after the bulk
    b"x" * 70_000,                                 # inline line too long
])
def test_malformed_input_raises_protocol_error(stream):
    parser = RespParser()
    parser.feed(stream)
    with pytest.raises(ProtocolError):
        drain(parser)


def test_encoding_of_every_reply_type():
    assert encode(b"v") == b"$1\r\nv\r\n"
    assert encode(None) == b"$-1\r\n" and encode(None, resp3=True) == b"_\r\n"
    assert encode(-3) == b":-3\r\n"
    assert encode(OK) == b"+OK\r\n" and encode(Simple("string")) == b"+string\r\n"
    assert encode(ReplyError("ERR bad\r\nthing")) == b"-ERR bad  thing\r\n"
    assert encode([b"a", None, [1]]) == b"*3\r\n$1\r\na\r\n$-1\r\n*1\r\n:1\r\n"
    assert encode({"proto": 2}) == b"*2\r\n$5\r\nproto\r\n:2\r\n"
    assert encode({"proto": 3}, resp3=True) == b"%1\r\n$5\r\nproto\r\n:3\r\n"
    assert encode("text") == b"$4\r\ntext\r\n"
    with pytest.raises(TypeError):
        encode(1.5)
