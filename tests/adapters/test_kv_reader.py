"""CommandReader (hiredis for multibulk commands, RespParser for the rest) reads every stream as RespParser does."""

from __future__ import annotations

import random

import pytest

from walkit.adapters.kv import reader as reader_module
from walkit.adapters.kv.reader import FAST_LIMIT, CommandReader, one_command
from walkit.adapters.kv.resp import MAX_BULK, ProtocolError, RespParser


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def outcome(parser, reads: list[bytes], unauthenticated: bool = False) -> list:
    """outcome is what `parser` makes of `reads` fed one at a time: commands, then an error if one."""
    parser.unauthenticated = unauthenticated
    out = []
    try:
        for data in reads:
            parser.feed(data)
            while (cmd := parser.next()) is not None:
                out.append(cmd)
    except ProtocolError as exc:
        out.append(("error", str(exc)))
    return out


def same(reads: list[bytes], unauthenticated: bool = False) -> list:
    """same asserts CommandReader and RespParser agree on `reads` and returns what they made of them."""
    expected = outcome(RespParser(), reads, unauthenticated)
    assert outcome(CommandReader(), reads, unauthenticated) == expected
    return expected


def test_a_single_command_is_split_at_its_crlfs_a_pipeline_goes_to_hiredis():
    parser = CommandReader()
    parser.feed(command(b"GET", b"k"))
    assert list(parser._ready) == [[b"GET", b"k"]] and parser.buffered == len(command(b"GET", b"k"))
    assert parser.next() == [b"GET", b"k"] and parser.buffered == 0 and parser.next() is None


@pytest.mark.parametrize("frame", [
    b"*2\r\n$03\r\nGET\r\n$1\r\nk\r\n",               # a length with a leading zero
    b"*02\r\n$3\r\nGET\r\n$1\r\nk\r\n",
    b"*2\r\n$+3\r\nGET\r\n$1\r\nk\r\n",
    b"*2\r\n$ 3\r\nGET\r\n$1\r\nk\r\n",
    b"*2\r\n$3\r\nGET\r\n$-1\r\n",                     # a null where an argument goes
    b"*1\r\n$5\r\na\r\nb\r\n",                          # a length that does not fit the CRLFs
    b"*1\r\n$4\r\na\r\nb\r\n",                          # a CRLF inside an argument: RespParser reads it
    b"*2\r\n$3\r\nGET\r\n",                             # fewer arguments than announced
    b"*1\r\n$3\r\nGET\r\n$1\r\nk\r\n",                   # more
    b"*1\r\n$3\r\nGET\r\nx",                            # bytes after the frame
    b"*1\r\n$3\r\nGET",                                 # cut before its last CRLF
    b"*0\r\n", b"*-1\r\n", b"*\r\n", b"*1\r\n:3\r\n", b"*1\r\n+GET\r\n",
])
def test_a_single_read_that_is_not_exactly_a_clients_frame_goes_to_respparser(frame):
    assert frame == b"*1\r\n$4\r\na\r\nb\r\n" or one_command(frame) is None
    same([frame])
    same([frame, command(b"PING")])


def test_single_reads_of_random_arguments_read_as_respparser_reads_them():
    rng = random.Random(4848)
    alphabet = b"ab$*+:-0123456789\r\n "
    taken = 0
    for _ in range(4000):
        args = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(1, 4))]
        frame = bytearray(command(*args))
        if rng.random() < 0.5:                  # one byte changed, dropped or added
            at, kind = rng.randrange(len(frame)), rng.randrange(3)
            if kind == 0:
                frame[at] = rng.choice(alphabet)
            elif kind == 1:
                del frame[at]
            else:
                frame.insert(at, rng.choice(alphabet))
        frame = bytes(frame)
        taken += one_command(frame) is not None
        same([frame])
    assert taken > 1000                         # the fast path was taken often enough to be tested


def test_pipelined_multibulk_commands_are_read_by_hiredis():
    parser = CommandReader()
    parser.feed(command(b"SET", b"k", b"v") + command(b"GET", b"k") + b"*0\r\n" + command(b"PING"))
    assert len(parser._ready) == 3
    assert [parser.next(), parser.next(), parser.next(), parser.next()] == [
        [b"SET", b"k", b"v"], [b"GET", b"k"], [b"PING"], None]
    assert parser.buffered == 0


def test_frames_split_at_every_byte_mixed_with_inline_commands():
    stream = command(b"SET", b"key", b"va\r\nlue") + b"PING\r\n" + command(b"GET", b"") + command(b"ECHO", b"+x")
    assert same([stream[i:i + 1] for i in range(len(stream))]) == [
        [b"SET", b"key", b"va\r\nlue"], [b"PING"], [b"GET", b""], [b"ECHO", b"+x"]]
    for cut in range(1, len(stream)):
        same([stream[:cut], stream[cut:]])


def test_an_inline_command_after_multibulk_ones_in_one_read():
    assert same([command(b"GET", b"a") + b"PING\r\n" + command(b"GET", b"b")]) == [
        [b"GET", b"a"], [b"PING"], [b"GET", b"b"]]


@pytest.mark.parametrize("frame", [
    b"*2\r\n$3\r\nGET\r\n:1\r\n",                   # not a bulk string
    b"*2\r\n$4\r\nECHO\r\n+hi\r\n",                  # a simple string, which hiredis would take
    b"*2\r\n$4\r\nECHO\r\n=7\r\ntxt:abc\r\n",       # a verbatim string, which hiredis would take
    b"*2\r\n$4\r\nECHO\r\n*1\r\n$1\r\na\r\n",       # a nested array
    b"*2\r\n$4\r\nECHO\r\n$-1\r\n",                 # a null bulk string
    b"*2\r\n$4\r\nECHO\r\n$03\r\nabc\r\n",          # a length hiredis refuses and RespParser takes
    b"*2\r\n$4\r\nECHO\r\n$2\r\nabXY",              # no CRLF after the bulk string (hiredis skips it)
    b"*2\r\n$4\r\nECHO\r\n$2\r\na\r\nZ",             # ... where an argument ending in CR hides it
    b"*x\r\n",
    b"*-1\r\n",
    b"*1\r\n$-5\r\n",
    b"*1\r\n$%d\r\n" % (MAX_BULK + 1),
    b"*1\r\n$3\r\nGETxx",
    b"*2000000000\r\n$1\r\na\r\n",                  # hiredis would allocate the list at once
    b"*2\r\n$4\r\nECHO\r\n*3000000000\r\n",
    b"*1\r\n" + b"*1\r\n" * 20 + b"$1\r\na\r\n",
    b"*1\r\n%1\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n",        # a map hiredis cannot build (a list as a key)
])
def test_malformed_frames_get_respparsers_answer(frame):
    before = command(b"SET", b"a", b"1")
    for reads in ([before + frame + command(b"PING")], [before, frame, command(b"PING")],
                  [before + frame[:5], frame[5:] + command(b"PING")]):
        result = same(reads)
        assert result[0] == [b"SET", b"a", b"1"]


def test_unauthenticated_limits_apply_as_the_frame_arrives():
    for frame in (b"*11\r\n", b"*1\r\n$16385\r\n"):
        result = same([frame], unauthenticated=True)
        assert result and result[-1][0] == "error"
    parser = CommandReader()
    parser.unauthenticated = True
    parser.feed(command(b"AUTH", b"pw"))
    assert not parser._ready and parser.next() == [b"AUTH", b"pw"]
    parser.unauthenticated = False
    parser.feed(command(b"GET", b"k") + command(b"GET", b"l"))
    assert parser._ready and parser.next() == [b"GET", b"k"] and parser.next() == [b"GET", b"l"]


def test_a_frame_over_the_fast_limit_goes_to_respparser():
    value = b"x" * (FAST_LIMIT * 3)
    stream = command(b"SET", b"k", value) + command(b"GET", b"k")
    reads = [stream[i:i + 65536] for i in range(0, len(stream), 65536)]
    assert same(reads) == [[b"SET", b"k", value], [b"GET", b"k"]]
    too_big = b"*1\r\n$%d\r\n" % (MAX_BULK + 1) + b"x" * 100
    assert same([command(b"PING"), too_big])[-1] == ("error", "invalid bulk length")


def test_without_hiredis_respparser_reads_everything(monkeypatch):
    monkeypatch.setattr(reader_module, "hiredis", None)
    parser = CommandReader()
    parser.feed(command(b"GET", b"k") + command(b"GET", b"l"))
    assert not parser._ready and parser.next() == [b"GET", b"k"]


def test_random_streams_read_as_respparser_reads_them():
    rng = random.Random(48)
    pieces = [command(b"SET", b"k", b"v"), command(b"GET", b"k"), b"PING\r\n", b"*0\r\n", b"\r\n",
              command(b"ECHO", b"a\r\n+b"), b"+x\r\n", b":3\r\n", b"$1\r\na\r\n", b"*1\r\n", b"$2\r\n",
              b"*-1\r\n", b"*3\r\n$1\r\n", b"x\r\n", b"'a\r\n", b"\"b c\"\r\n", b"*1000000\r\n",
              command(b"SET", b"*1234567", b"\n+")]
    for _ in range(3000):
        stream = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 4))))
        reads = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
        same(reads, unauthenticated=rng.random() < 0.1)
