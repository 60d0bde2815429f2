"""Records of the key-value store: every kind round-trips; malformed entries are refused."""

from __future__ import annotations

import pytest

from walkit.adapters.kv.records import (
    GET, NX, Delete, FlushDb, IncrBy, MSet, RecordError, Set, decode_entry, encode_entry, encode_record,
    entry_header,
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


def test_an_entry_round_trips_every_kind_of_record():
    data = encode_entry(1234, 99, [encode_record(r) for r in RECORDS])
    assert decode_entry(data) == (1234, 99, RECORDS)
    assert entry_header(data) == (1234, 99, len(RECORDS))


@pytest.mark.parametrize("record", RECORDS)
def test_each_record_round_trips_alone(record):
    assert decode_entry(encode_entry(0, 0, [encode_record(record)]))[2] == [record]


def test_truncated_and_padded_entries_are_refused():
    data = encode_entry(1, 0, [encode_record(r) for r in RECORDS])
    for cut in (0, 5, 21, len(data) - 1):
        with pytest.raises(RecordError):
            decode_entry(data[:cut])
    with pytest.raises(RecordError):
        decode_entry(data + b"x")


def test_unknown_format_and_op_are_refused():
    data = bytearray(encode_entry(1, 0, [encode_record(FlushDb())]))
    data[0] = 9
    with pytest.raises(RecordError, match="format"):
        decode_entry(bytes(data))
    data[0] = 1
    data[-1] = 77
    with pytest.raises(RecordError, match="op"):
        decode_entry(bytes(data))


def test_encode_record_refuses_other_objects():
    with pytest.raises(TypeError):
        encode_record(("SET", b"k"))
