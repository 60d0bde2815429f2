"""walkit.replication.batch encodes the records a leader submits together as one log entry.

    entry  := FORMAT:u8  count:u32  (length:u32 record)*          (big-endian)

Group commit across callers: every record submitted while the previous entry was being handed
to the log joins the next entry, so many submitters share one append and one acknowledgement.
`take` cuts the next entry from the queued records: at most `max_records` records, about
`max_bytes` of them, and never an entry above `max_entry` bytes (the client's max_entry_bytes):
an entry is cut before the record that would take it over. A record too large for an entry of
its own (`max_record(max_entry)`) is refused by the node before it is queued, never split.
"""

from __future__ import annotations

import struct
from collections import deque

#: The entry format version; decoders refuse others.
FORMAT = 1

_HEADER = struct.Struct(">BI")
_LENGTH = struct.Struct(">I")
#: Bytes an entry spends besides its records: the header, then a length before each record.
HEADER_BYTES = _HEADER.size
RECORD_OVERHEAD = _LENGTH.size


def entry_size(record_bytes: int, count: int) -> int:
    """entry_size is the length of the entry `encode` makes of `count` records of `record_bytes` bytes in all."""
    return HEADER_BYTES + count * RECORD_OVERHEAD + record_bytes


def max_record(max_entry: int) -> int:
    """max_record is the largest record an entry of at most `max_entry` bytes holds (alone)."""
    return max_entry - HEADER_BYTES - RECORD_OVERHEAD


def take(queued: deque, max_records: int, max_bytes: int, max_entry: int) -> tuple[list, int]:
    """take pops the records of the next entry off the front of `queued`; it returns them and their bytes.

    `queued` holds tuples whose first item is the record. The entry takes records in order while
    it has fewer than `max_records`, their bytes stay within `max_bytes` (the first record goes
    whatever its size) and the entry stays within `max_entry` bytes. The first record must fit
    an entry of its own (at most `max_record(max_entry)`): the node refused larger ones.
    """
    taken: list = []
    size = 0
    room = max_entry - HEADER_BYTES                 # what the records and their lengths may take
    while queued and len(taken) < max_records:
        length = len(queued[0][0])
        if taken and size + length > max_bytes:
            break
        room -= RECORD_OVERHEAD + length
        if room < 0:
            assert taken, f"a record of {length} bytes does not fit an entry of {max_entry} bytes"
            break
        taken.append(queued.popleft())
        size += length
    return taken, size


class BatchError(ValueError):
    """BatchError is raised for a log entry that is not a batch of records this version writes."""


def encode(records: list[bytes]) -> bytes:
    """encode returns one log entry holding `records` in order."""
    pack = _LENGTH.pack
    parts = [_HEADER.pack(FORMAT, len(records))]
    for record in records:
        parts.append(pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def decode(entry: bytes) -> list[bytes]:
    """decode returns the records of an entry written by `encode`."""
    if len(entry) < _HEADER.size:
        raise BatchError(f"an entry of {len(entry)} bytes is too short for a batch header")
    version, count = _HEADER.unpack_from(entry)
    if version != FORMAT:
        raise BatchError(f"batch format {version} is not {FORMAT}: the entry was not written by walkit.replicate")
    records, at, end, unpack = [], _HEADER.size, len(entry), _LENGTH.unpack_from
    for _ in range(count):
        if at + 4 > end:
            raise BatchError("a batch entry is truncated")
        (length,) = unpack(entry, at)
        at += 4
        if at + length > end:
            raise BatchError("a batch entry is truncated")
        records.append(entry[at:at + length])
        at += length
    if at != end:
        raise BatchError(f"a batch entry has {end - at} bytes after its {count} records")
    return records
