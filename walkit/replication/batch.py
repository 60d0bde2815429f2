"""walkit.replication.batch encodes the records a leader submits together as one log entry.

    entry  := FORMAT:u8  count:u32  (length:u32 record)*          (big-endian)

Group commit across callers: every record submitted while the previous entry was being handed
to the log joins the next entry, so many submitters share one append and one acknowledgement.
"""

from __future__ import annotations

import struct

#: The entry format version; decoders refuse others.
FORMAT = 1

_HEADER = struct.Struct(">BI")
_LENGTH = struct.Struct(">I")


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
