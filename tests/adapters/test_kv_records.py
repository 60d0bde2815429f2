"""Records of the key-value store: every kind round-trips with its stamp; malformed records are refused."""

from __future__ import annotations

import pytest

from walkit.adapters.kv.records import (
    FORMAT, GET, NX, Delete, FlushDb, IncrBy, MSet, RecordError, Set, decode, encode, encode_record,
)

RECORDS = [
    Set(b"k", b"v"),
    Set(b"", b"", 0, 0),
    Set(b"key\r\n\x00", b"\xff" * 1000, 1_700_000_000_123, NX | GET),
    IncrBy(b"counter", -(1 << 63)),
    IncrBy(b"counter", (1 << 63) - 1),
    Delete((b"a", b"b", b"a")),
    MSet((b"a", b"1", b"b", b"2")),
    FlushDb(),
]


@pytest.mark.parametrize("record", RECORDS)
def test_each_record_round_trips_with_its_stamp(record):
    assert decode(encode(1_700_000_000_000, record)) == (1_700_000_000_000, record)


@pytest.mark.parametrize("record", RECORDS)
def test_truncated_and_padded_records_are_refused(record):
    data = encode(1, record)
    for cut in range(len(data)):
        with pytest.raises(RecordError):
            decode(data[:cut])
    with pytest.raises(RecordError):
        decode(data + b"x")


def test_unknown_format_and_op_are_refused():
    data = bytearray(encode(1, FlushDb()))
    data[0] = FORMAT + 1
    with pytest.raises(RecordError, match="format"):
        decode(bytes(data))
    data[0] = FORMAT
    data[-1] = 77
    with pytest.raises(RecordError, match="op"):
        decode(bytes(data))


def test_encode_record_refuses_other_objects():
    with pytest.raises(TypeError):
        encode_record(("SET", b"k"))
