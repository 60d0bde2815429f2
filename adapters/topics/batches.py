"""walkit.adapters.topics.batches checks, numbers and reads Kafka record batches (magic v2).

A partition's log holds one record batch per entry, byte for byte as the producer sent it,
except the base offset and the partitionLeaderEpoch, which the leader assigns (epochs.py).
Kafka's CRC (CRC-32C) covers the batch from its attributes on, so both keep it valid, and a consumer gets
exactly what the producer's CRC protects. Compressed batches stay compressed.

The codec is the low 3 bits of the attributes: none, gzip, snappy, lz4 or zstd. The broker
opens a batch only to find a timestamp inside it (`first_offset_at`) and the Spark reader to
read its records (`records`); both decompress through kafka-python (kafka.codec), which
imports python-snappy, lz4 and zstandard, the libraries the `topics` extra installs. A batch
whose codec's library is missing raises MissingCodec, naming the package to install, rather
than being answered by a guess.

    header := baseOffset:i64 batchLength:i32 partitionLeaderEpoch:i32 magic:i8 crc:u32
              attributes:i16 lastOffsetDelta:i32 firstTimestamp:i64 maxTimestamp:i64
              producerId:i64 producerEpoch:i16 baseSequence:i32 records:i32
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka import codec
from kafka.record.default_records import DefaultRecordBatch

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size            # 61
LOG_OVERHEAD = 12                    # baseOffset + batchLength
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
TRANSACTIONAL = 0x10
CONTROL = 0x20
COMPRESSION = 0x07
#: codec id (the attributes' low 3 bits) -> (name, the package kafka-python decompresses it with).
CODECS = {0: ("none", None), 1: ("gzip", None), 2: ("snappy", "python-snappy"), 3: ("lz4", "lz4"),
          4: ("zstd", "zstandard")}
_AVAILABLE = {0: lambda: True, 1: codec.has_gzip, 2: codec.has_snappy, 3: codec.has_lz4, 4: codec.has_zstd}


class MissingCodec(KafkaError):
    """MissingCodec is a batch compressed with a codec whose library this process lacks (or an unknown codec)."""

    def __init__(self, code: int) -> None:
        name, package = CODECS.get(code, (f"codec {code}", None))
        hint = f": pip install {package} (or walkit[topics])" if package else ""
        super().__init__(errors.UNKNOWN_SERVER_ERROR, f"cannot read a {name} record batch{hint}")


class CorruptBatch(KafkaError):
    """CorruptBatch is a stored batch whose records cannot be read: its CRC held, so a client sent them that way.

    Kafka answers such a batch with CORRUPT_MESSAGE; the broker answers the request, not the connection's end.
    """

    def __init__(self, reason: BaseException) -> None:
        super().__init__(errors.CORRUPT_MESSAGE, f"{type(reason).__name__}: {reason}")


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """BatchInfo is what the broker needs from a batch header (offsets are as stored)."""

    base_offset: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: int
    size: int
    attributes: int

    @property
    def last_offset(self) -> int:
        """last_offset is the offset of the batch's last record."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """next_offset is the offset right after the batch."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        """last_sequence is the sequence number of the batch's last record (wrapping at 2^31)."""
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)

    @property
    def idempotent(self) -> bool:
        """idempotent tells whether an idempotent producer wrote the batch (it carries a producer id)."""
        return self.producer_id >= 0


def info(batch) -> BatchInfo:
    """info reads the header of one batch (bytes or memoryview holding exactly that batch)."""
    (base, length, _epoch, magic, _crc, attributes, last_delta, _first_ts, max_ts, pid, pepoch, seq,
     count) = HEADER.unpack_from(batch)
    return BatchInfo(base, last_delta, max_ts, pid, pepoch, seq, count, length + LOG_OVERHEAD, attributes)


def split(records: bytes | None, max_batch_bytes: int) -> list[bytes]:
    """split checks the record batches of a produce request and returns them one by one.

    Every batch must be magic v2, whole, at most `max_batch_bytes`, with a matching CRC, one of
    Kafka's codecs, not a control batch (markers are the broker's, transactions.py), transactional only
    with a producer id, with lastOffsetDelta + 1 == records > 0. Raises KafkaError: CORRUPT_MESSAGE (bad
    size, CRC, codec or counts), UNSUPPORTED_FOR_MESSAGE_FORMAT (magic 0 or 1), MESSAGE_TOO_LARGE,
    INVALID_RECORD (control batches, transactional ones without a producer id).
    """
    if not records:
        raise KafkaError(errors.CORRUPT_MESSAGE, "a produce request without records")
    view = memoryview(records)
    batches = []
    position = 0
    while position < len(view):
        if len(view) - position < HEADER_SIZE:
            raise KafkaError(errors.CORRUPT_MESSAGE, "a truncated record batch header")
        length = struct.unpack_from(">i", view, position + 8)[0]
        magic = view[position + 16]
        if magic != 2:
            raise KafkaError(errors.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                             f"record batches of magic {magic} are not supported; use magic 2 (Kafka 0.11+)")
        size = length + LOG_OVERHEAD
        if length < HEADER_SIZE - LOG_OVERHEAD or position + size > len(view):
            raise KafkaError(errors.CORRUPT_MESSAGE, f"a record batch claims {length} bytes")
        if size > max_batch_bytes:
            raise KafkaError(errors.MESSAGE_TOO_LARGE, f"a record batch of {size} bytes (limit {max_batch_bytes})")
        batch = bytes(view[position:position + size])
        head = info(batch)
        if head.attributes & CONTROL:
            raise KafkaError(errors.INVALID_RECORD, "control batches are written by the broker only")
        if head.attributes & TRANSACTIONAL and not head.idempotent:
            raise KafkaError(errors.INVALID_RECORD, "a transactional batch without a producer id")
        if (head.attributes & COMPRESSION) not in CODECS:
            raise KafkaError(errors.CORRUPT_MESSAGE, f"a record batch of unknown codec {head.attributes & COMPRESSION}")
        if head.records <= 0 or head.last_offset_delta != head.records - 1:
            raise KafkaError(errors.CORRUPT_MESSAGE, f"a batch of {head.records} records with "
                                                     f"lastOffsetDelta {head.last_offset_delta}")
        if not DefaultRecordBatch(batch).validate_crc():
            raise KafkaError(errors.CORRUPT_MESSAGE, "a record batch failed its CRC check")
        batches.append(batch)
        position += size
    return batches


def with_base_offset(batch: bytes, base_offset: int, leader_epoch: int | None = None) -> bytes:
    """with_base_offset is `batch` renumbered to start at `base_offset`, and stamped with the partition's
    `leader_epoch` if given (both lie before the CRC's range, so it stays valid)."""
    if leader_epoch is None:
        return _OFFSET.pack(base_offset) + batch[8:]
    return _OFFSET.pack(base_offset) + batch[8:12] + _EPOCH.pack(leader_epoch) + batch[16:]


def batches_before(data: bytes, offset: int) -> bytes:
    """batches_before is the leading whole batches of `data` (stored batches, by offset) that end before `offset`."""
    position = 0
    while position < len(data) and info(data[position:position + HEADER_SIZE]).next_offset <= offset:
        position += struct.unpack_from(">i", data, position + 8)[0] + LOG_OVERHEAD
    return data[:position]


def last_offset(data: bytes) -> int:
    """last_offset is the offset of the last record of `data` (stored batches, in offset order; not empty)."""
    position = last = 0
    while position < len(data):
        last = info(data[position:position + HEADER_SIZE]).last_offset
        position += struct.unpack_from(">i", data, position + 8)[0] + LOG_OVERHEAD
    return last


def records(batch: bytes):
    """records yields the records of one batch (kafka-python's, with offset and timestamp), decompressed.

    Raises MissingCodec if the batch's codec cannot be decompressed in this process.
    """
    code = info(batch).attributes & COMPRESSION
    if code not in _AVAILABLE or not _AVAILABLE[code]():
        raise MissingCodec(code)
    return iter(DefaultRecordBatch(batch))


def first_offset_at(batch: bytes, timestamp: int) -> tuple[int, int] | None:
    """first_offset_at returns (offset, timestamp) of the batch's first record stamped at or after `timestamp`.

    None if it has none. Compressed batches are opened (records); MissingCodec if they cannot be,
    CorruptBatch if the records (or their compressed bytes) do not decode.
    """
    try:
        for record in records(batch):
            if record.timestamp >= timestamp:
                return record.offset, record.timestamp
    except MissingCodec:
        raise
    except Exception as exc:    # kafka-python's CorruptRecordError or the codec's own (gzip: BadGzipFile, lz4: RuntimeError)
        raise CorruptBatch(exc) from exc
    return None
