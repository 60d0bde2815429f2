"""walkit.adapters.spark.records decodes the records of a topic partition's log entries, and staged rows.

A partition's log entry is a group of records (walkit.replication.batch), each a Kafka record
batch (magic 2) or a control record (first byte 0xFF; walkit.adapters.topics.partition).
`batches` yields the record batches of one entry; `decode_batch` turns one batch into the
columns of the data source (offset, timestamp, timestamp type, key, value, headers). An
uncompressed batch is decoded here (varints in pure Python, about twice as fast as
kafka-python's general reader); a compressed one (gzip, snappy, lz4 or zstd) goes through
walkit.adapters.topics.batches.records, kafka-python's codecs, whose libraries the `spark`
extra installs; a batch of a codec whose library is missing fails the read, naming the package.

Staged rows (writer.py) are what a write task saved for its commit to publish:

    row := partition:i32 (-1: none) key:bytes? value:bytes? count:u16 (name:bytes value:bytes?)*
    bytes? := length:i32 (-1: null) data
"""

from __future__ import annotations

import struct

from walkit.adapters.topics.batches import COMPRESSION, HEADER, HEADER_SIZE, info, records
from walkit.adapters.topics.partition import is_control
from walkit.replication import batch as entries

_LOG_APPEND_TIME = 0x08
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")


def batches(entry: bytes):
    """batches yields the Kafka record batches of one partition log entry (control records left out)."""
    for record in entries.decode(entry):
        if not is_control(record):
            yield record


def entry_span(entry: bytes) -> tuple[int, int] | None:
    """entry_span is (first base offset, next offset) of the batches of one entry; None if it holds none."""
    first = end = None
    for batch in batches(entry):
        head = info(batch)
        if first is None:
            first = head.base_offset
        end = head.next_offset
    return None if first is None else (first, end)


def _varint(buf, pos: int) -> tuple[int, int]:
    """_varint reads one zigzag varint (Kafka's varint and varlong) at `pos`; it returns (value, next pos)."""
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _field(buf, pos: int) -> tuple[bytes | None, int]:
    """_field reads a varint length (-1: null) and that many bytes at `pos`; it returns (bytes, next pos)."""
    length, pos = _varint(buf, pos)
    if length < 0:
        return None, pos
    return buf[pos:pos + length], pos + length


def decode_batch(batch: bytes, lo: int, hi: int, out) -> None:
    """decode_batch appends the records of `batch` with lo <= offset < hi to the column lists of `out`.

    `out` has lists offsets, timestamps (ms), types (0 CreateTime, 1 LogAppendTime), keys,
    values and headers ([(name, value)]).
    """
    (base, _length, _epoch, _magic, _crc, attributes, _last_delta, first_ts, max_ts, _pid, _pepoch, _seq,
     count) = HEADER.unpack_from(batch)
    append_time = bool(attributes & _LOG_APPEND_TIME)
    kind = 1 if append_time else 0
    if attributes & COMPRESSION:
        for record in records(bytes(batch)):
            if lo <= record.offset < hi:
                out.offsets.append(record.offset)
                out.timestamps.append(max_ts if append_time else record.timestamp)
                out.types.append(kind)
                out.keys.append(record.key)
                out.values.append(record.value)
                out.headers.append([(name, value) for name, value in record.headers])
        return
    offsets, timestamps, types, keys, values, headers = (out.offsets, out.timestamps, out.types, out.keys,
                                                         out.values, out.headers)
    buf = bytes(batch)
    pos = HEADER_SIZE
    varint, field = _varint, _field
    for _ in range(count):
        length, pos = varint(buf, pos)
        end = pos + length
        pos += 1                                   # record attributes: unused
        ts_delta, pos = varint(buf, pos)
        offset_delta, pos = varint(buf, pos)
        offset = base + offset_delta
        if not lo <= offset < hi:
            pos = end
            continue
        key, pos = field(buf, pos)
        value, pos = field(buf, pos)
        header_count, pos = varint(buf, pos)
        pairs = []
        for _h in range(header_count):
            name, pos = field(buf, pos)
            header, pos = field(buf, pos)
            pairs.append((name.decode("utf-8", "replace"), header))
        offsets.append(offset)
        timestamps.append(max_ts if append_time else first_ts + ts_delta)
        types.append(kind)
        keys.append(key)
        values.append(value)
        headers.append(pairs)
        pos = end


class Columns:
    """Columns collects decoded topic records column by column (see decode_batch)."""

    __slots__ = ("offsets", "timestamps", "types", "keys", "values", "headers")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.keys: list = []
        self.values: list = []
        self.headers: list = []

    def __len__(self) -> int:
        return len(self.offsets)


# -- staged rows --------------------------------------------------------------------------------
def _put_bytes(parts: list, data) -> None:
    if data is None:
        parts.append(_I32.pack(-1))
    else:
        data = bytes(data)
        parts.append(_I32.pack(len(data)))
        parts.append(data)


def encode_row(partition: int | None, key, value, headers) -> bytes:
    """encode_row encodes one row to publish (see the module doc); headers are (name, value) pairs."""
    parts = [_I32.pack(-1 if partition is None else partition)]
    _put_bytes(parts, key)
    _put_bytes(parts, value)
    headers = headers or []
    parts.append(_U16.pack(len(headers)))
    for name, data in headers:
        _put_bytes(parts, name.encode() if isinstance(name, str) else name)
        _put_bytes(parts, data)
    return b"".join(parts)


def _take_bytes(buf, pos: int):
    (length,) = _I32.unpack_from(buf, pos)
    pos += 4
    if length < 0:
        return None, pos
    return buf[pos:pos + length], pos + length


def decode_row(data: bytes) -> tuple[int | None, bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """decode_row is (partition or None, key, value, headers) of a row written by encode_row."""
    (partition,) = _I32.unpack_from(data, 0)
    key, pos = _take_bytes(data, 4)
    value, pos = _take_bytes(data, pos)
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    headers = []
    for _ in range(count):
        name, pos = _take_bytes(data, pos)
        header, pos = _take_bytes(data, pos)
        headers.append((name.decode("utf-8", "replace"), header))
    return (None if partition < 0 else partition), key, value, headers
