"""walkit.adapters.kv.records defines the changes the key-value store writes to its log, and their encoding.

Each write command becomes one record, submitted through walkit.replicate (which groups the
records of concurrent writers into shared log entries):

    record := FORMAT:u8  stamp_ms:u64  op:u8 fields
    SET    := flags:u8 expire_at_ms:i64 key value        (expire_at_ms 0: no expiry)
    INCRBY := delta:i64 key
    DEL    := count:u32 key*
    MSET   := count:u32 (key value)*
    FLUSH  := (nothing)
    key, value := length:u32 bytes

Integers are big-endian. Every field a node needs to apply a record is in it: the leader
stamps each record with its clock (never earlier than any stamp it applied or handed out, so
stamps never go back, also across leaders) and turns relative expiry times into absolute
ones, so applying a record is deterministic and the leader and its followers compute the same
state and the same results (machine.py).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

#: The record format version; decoders refuse others (1 was the entry format before walkit.replicate).
FORMAT = 2

OP_SET, OP_INCRBY, OP_DEL, OP_MSET, OP_FLUSH = 1, 2, 3, 4, 5

#: Flags of a Set record.
NX, XX, KEEPTTL, GET = 1, 2, 4, 8

_HEADER = struct.Struct(">BQ")
_SET = struct.Struct(">BBq")
_INCRBY = struct.Struct(">Bq")
_COUNT = struct.Struct(">BI")
_LEN = struct.Struct(">I")


class Set(NamedTuple):
    """Set stores `value` at `key`, expiring at `expire_at` (ms since the epoch; 0: never), under `flags`."""

    key: bytes
    value: bytes
    expire_at: int = 0
    flags: int = 0


class IncrBy(NamedTuple):
    """IncrBy adds `delta` to the integer stored at `key` (absent counts as 0)."""

    key: bytes
    delta: int


class Delete(NamedTuple):
    """Delete removes `keys`."""

    keys: tuple[bytes, ...]


class MSet(NamedTuple):
    """MSet stores several pairs at once; `pairs` alternates keys and values."""

    pairs: tuple[bytes, ...]


class FlushDb(NamedTuple):
    """FlushDb removes every key."""


class RecordError(ValueError):
    """RecordError is raised for bytes that are not a valid record."""


def _field(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def encode_record(record) -> bytes:
    """encode_record returns the bytes of one record (without the stamp header)."""
    kind = type(record)
    if kind is Set:
        return b"".join((_SET.pack(OP_SET, record.flags, record.expire_at), _field(record.key),
                         _field(record.value)))
    if kind is IncrBy:
        return _INCRBY.pack(OP_INCRBY, record.delta) + _field(record.key)
    if kind is Delete:
        return b"".join((_COUNT.pack(OP_DEL, len(record.keys)), *map(_field, record.keys)))
    if kind is MSet:
        return b"".join((_COUNT.pack(OP_MSET, len(record.pairs) // 2), *map(_field, record.pairs)))
    if kind is FlushDb:
        return bytes((OP_FLUSH,))
    raise TypeError(f"not a record: {record!r}")


def encode(stamp_ms: int, record) -> bytes:
    """encode returns the bytes of `record` stamped with the leader's clock `stamp_ms`."""
    return _HEADER.pack(FORMAT, stamp_ms) + encode_record(record)


def decode(data: bytes) -> tuple[int, object]:
    """decode returns (stamp_ms, record) of bytes written by `encode`; RecordError if they are malformed."""
    try:
        version, stamp = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise RecordError("truncated record header") from None
    if version != FORMAT:
        raise RecordError(f"unknown record format {version}")
    try:
        record, at = _decode_record(data, _HEADER.size)
    except (struct.error, IndexError) as exc:
        raise RecordError(f"truncated record: {exc}") from None
    if at != len(data):
        raise RecordError(f"{len(data) - at} stray bytes after a record")
    return stamp, record


def _take(data: bytes, at: int) -> tuple[bytes, int]:
    (length,) = _LEN.unpack_from(data, at)
    at += 4
    end = at + length
    if end > len(data):
        raise RecordError("a field runs past the end of the record")
    return data[at:end], end


def _take_many(data: bytes, at: int, count: int) -> tuple[tuple[bytes, ...], int]:
    fields = []
    for _ in range(count):
        field, at = _take(data, at)
        fields.append(field)
    return tuple(fields), at


def _decode_record(data: bytes, at: int):
    op = data[at]
    if op == OP_SET:
        _, flags, expire_at = _SET.unpack_from(data, at)
        key, at = _take(data, at + _SET.size)
        value, at = _take(data, at)
        return Set(key, value, expire_at, flags), at
    if op == OP_INCRBY:
        _, delta = _INCRBY.unpack_from(data, at)
        key, at = _take(data, at + _INCRBY.size)
        return IncrBy(key, delta), at
    if op in (OP_DEL, OP_MSET):
        _, count = _COUNT.unpack_from(data, at)
        fields, at = _take_many(data, at + _COUNT.size, count if op == OP_DEL else 2 * count)
        return (Delete(fields) if op == OP_DEL else MSet(fields)), at
    if op == OP_FLUSH:
        return FlushDb(), at + 1
    raise RecordError(f"unknown record op {op}")
