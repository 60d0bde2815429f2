"""Records of the key-value store: commands and transactions round-trip with their stamp; format 2
records replay as the commands they were; malformed records are refused."""

from __future__ import annotations

import struct

import pytest

from walkit.adapters.kv.records import FORMAT, Record, RecordError, Watch, command_record, decode, encode

T = 1_700_000_000_000

RECORDS = [
    Record(T, ((b"SET", b"k", b"v"),)),
    Record(T, ((b"SET", b"", b""),)),
    Record(0, ((b"SET", b"key\r\n\x00", b"\xff" * 1000, b"PXAT", b"1700000000123", b"NX", b"GET"),)),
    Record(T, ((b"EVAL", b"return 1", b"0"),)),
    Record(T, ((b"SET", b"a", b"1"), (b"INCR", b"a"), (b"GET", b"a")), True),
    Record(T, ((b"INCR", b"a"),), True, (Watch(b"a", 7, True), Watch(b"", (1 << 64) - 1, False))),
    Record(T, (), True),
]


@pytest.mark.parametrize("record", RECORDS)
def test_each_record_round_trips_with_its_stamp(record):
    assert decode(encode(record)) == record


def test_command_record_is_the_encoding_of_a_one_command_record():
    assert command_record(T, [b"DEL", b"a", b"b"]) == encode(Record(T, ((b"DEL", b"a", b"b"),)))


@pytest.mark.parametrize("record", RECORDS)
def test_truncated_and_padded_records_are_refused(record):
    data = encode(record)
    for cut in range(len(data)):
        with pytest.raises(RecordError):
            decode(data[:cut])
    with pytest.raises(RecordError):
        decode(data + b"x")


def test_unknown_format_and_kind_are_refused():
    data = bytearray(encode(RECORDS[0]))
    data[0] = FORMAT + 1
    with pytest.raises(RecordError, match="format"):
        decode(bytes(data))
    data[0] = FORMAT
    data[9] = 77
    with pytest.raises(RecordError, match="kind"):
        decode(bytes(data))


def test_a_record_that_is_not_a_transaction_holds_one_command():
    with pytest.raises(ValueError):
        encode(Record(T, ((b"GET", b"a"), (b"GET", b"b"))))
    with pytest.raises(ValueError):
        encode(Record(T, ((b"GET", b"a"),), False, (Watch(b"a", 1, True),)))


def _v2(op: int, body: bytes, stamp: int = T) -> bytes:
    return struct.pack(">BQB", 2, stamp, op) + body


def _f(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize("data, command", [
    (_v2(1, struct.pack(">Bq", 0, 0) + _f(b"k") + _f(b"v")), (b"SET", b"k", b"v")),
    (_v2(1, struct.pack(">Bq", 1 | 8, T + 5) + _f(b"k") + _f(b"v")), (b"SET", b"k", b"v", b"NX", b"GET", b"PXAT",
                                                                      b"%d" % (T + 5))),
    (_v2(1, struct.pack(">Bq", 2 | 4, 0) + _f(b"k") + _f(b"v")), (b"SET", b"k", b"v", b"XX", b"KEEPTTL")),
    (_v2(2, struct.pack(">q", -(1 << 63)) + _f(b"c")), (b"INCRBY", b"c", b"-9223372036854775808")),
    (_v2(3, struct.pack(">I", 2) + _f(b"a") + _f(b"b")), (b"DEL", b"a", b"b")),
    (_v2(4, struct.pack(">I", 1) + _f(b"a") + _f(b"1")), (b"MSET", b"a", b"1")),
    (_v2(5, b""), (b"FLUSHALL",)),
])
def test_format_2_records_replay_as_the_commands_they_were(data, command):
    assert decode(data) == Record(T, (command,))
    with pytest.raises(RecordError):
        decode(data[:-1] if len(data) > 10 else data + b"x")
