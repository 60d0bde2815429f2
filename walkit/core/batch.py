"""walkit.core.batch encodes the records a walkit.replicate leader submits together as one log entry.

    format 1 (no record names a session):
        entry  := 1:u8  count:u32  (length:u32 record)*
    format 2 (some record names a client session, for exactly-once submits):
        entry  := 2:u8  stamp_ms:u64  count:u32  (session record)*
        session := 0:u8 | 1:u8 client_length:u16 client seq:u64
        record  := length:u32 bytes                                      (big-endian)

Group commit across callers: every record submitted while the previous entry was being handed
to the log joins the next entry, so many submitters share one append and one acknowledgement.
`take` cuts the next entry from the queued records: at most `max_records` records, about
`max_bytes` of them, and never an entry above `max_entry` bytes (the client's max_entry_bytes):
an entry is cut before the record that would take it over. A record too large for an entry of
its own (`max_record(max_entry)`) is refused by the node before it is queued, never split.

Format 2 carries, per record, the client session that submitted it (walkit.core.sessions:
a client id and a sequence number), and the leader's wall clock when it cut the entry
(`stamp_ms`): every node expires idle sessions by these stamps, so all agree. Entries without
sessions stay in format 1, which readers from before sessions (and the adapters that read a
log's entries themselves, through `decode`) read as before.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

__all__ = ["FORMAT", "HEADER_BYTES", "RECORD_OVERHEAD", "MAX_CLIENT_ID", "BatchError", "Entry", "Session",
           "decode", "decode_entry", "encode", "entry_size", "max_record", "max_record_of", "session_bytes", "take"]

#: The entry format without sessions; decoders refuse formats other than 1 and 2.
FORMAT = 1
SESSIONS_FORMAT = 2

_HEADER = struct.Struct(">BI")
_HEADER2 = struct.Struct(">BQI")
_LENGTH = struct.Struct(">I")
_SESSION = struct.Struct(">H")
_SEQ = struct.Struct(">Q")
#: Bytes an entry spends besides its records: the header, then a length before each record. An
#: entry with sessions spends `_HEADER2.size - _HEADER.size` more, and each session its id and
#: sequence (`session_bytes`): the node counts those before it takes a record (max_record).
HEADER_BYTES = _HEADER.size
RECORD_OVERHEAD = _LENGTH.size
#: The longest client id a session may have (bytes, UTF-8).
MAX_CLIENT_ID = 256


@dataclass(frozen=True, slots=True)
class Session:
    """Session names who submitted a record: `client` (a client id) and its `seq`-th record (1, 2, ...)."""

    client: str
    seq: int


@dataclass(frozen=True, slots=True)
class Entry:
    """Entry is a decoded log entry: its records, the session of each (None: none), the leader's stamp."""

    records: list[bytes]
    sessions: list[Session | None]
    stamp_ms: int


def session_bytes(session: Session | None) -> int:
    """session_bytes is what `session` adds to a format-2 entry besides its record."""
    return 1 if session is None else 1 + _SESSION.size + len(session.client.encode()) + _SEQ.size


def entry_size(record_bytes: int, count: int) -> int:
    """entry_size is the length of the format-1 entry `encode` makes of `count` records of `record_bytes` bytes in all."""
    return HEADER_BYTES + count * RECORD_OVERHEAD + record_bytes


def max_record(max_entry: int) -> int:
    """max_record is the largest record an entry of at most `max_entry` bytes holds (alone, in format 1)."""
    return max_entry - HEADER_BYTES - RECORD_OVERHEAD


def max_record_of(session: Session | None, max_entry: int) -> int:
    """max_record_of is the largest record an entry of at most `max_entry` bytes holds alone, with `session`."""
    if session is None:
        return max_record(max_entry)
    return max_entry - _HEADER2.size - RECORD_OVERHEAD - session_bytes(session)


def take(queued: deque, max_records: int, max_bytes: int, max_entry: int) -> tuple[list, int]:
    """take pops the records of the next entry off the front of `queued`; it returns them and their bytes.

    `queued` holds tuples whose first item is the record (and whose fourth, if any, its Session).
    The entry takes records in order while it has fewer than `max_records`, their bytes stay
    within `max_bytes` (the first record goes whatever its size) and the entry, in the format
    `encode` will choose, stays within `max_entry` bytes. The first record must fit an entry of
    its own (`max_record_of`): the node refused larger ones.
    """
    taken: list = []
    size = 0
    used = HEADER_BYTES                            # the entry's bytes so far, in format 1
    sessions = False                               # format 2 once a record names a session
    while queued and len(taken) < max_records:
        head = queued[0]
        length = len(head[0])
        if taken and size + length > max_bytes:
            break
        session = head[3] if len(head) > 3 else None
        cost = RECORD_OVERHEAD + length
        if sessions:
            cost += session_bytes(session)
        elif session is not None:                  # switch to format 2: its header, a flag for each record
            cost += session_bytes(session) + (_HEADER2.size - HEADER_BYTES) + len(taken)
        if used + cost > max_entry:
            assert taken, f"a record of {length} bytes does not fit an entry of {max_entry} bytes"
            break
        used += cost
        sessions = sessions or session is not None
        taken.append(queued.popleft())
        size += length
    return taken, size


class BatchError(ValueError):
    """BatchError is raised for a log entry that is not a batch of records this version writes."""


def encode(records: list[bytes], sessions: list[Session | None] | None = None, stamp_ms: int = 0) -> bytes:
    """encode returns one log entry holding `records` in order (format 2 if any has a session)."""
    pack = _LENGTH.pack
    if not sessions or not any(sessions):
        parts = [_HEADER.pack(FORMAT, len(records))]
        for record in records:
            parts.append(pack(len(record)))
            parts.append(record)
        return b"".join(parts)
    parts = [_HEADER2.pack(SESSIONS_FORMAT, stamp_ms, len(records))]
    for record, session in zip(records, sessions, strict=True):
        if session is None:
            parts.append(b"\x00")
        else:
            client = session.client.encode()
            parts += [b"\x01", _SESSION.pack(len(client)), client, _SEQ.pack(session.seq)]
        parts.append(pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def decode(entry: bytes) -> list[bytes]:
    """decode returns the records of an entry written by `encode` (their sessions dropped)."""
    return decode_entry(entry).records


def decode_entry(entry: bytes) -> Entry:
    """decode_entry returns the records of an entry with their sessions and the leader's stamp."""
    if len(entry) < _HEADER.size:
        raise BatchError(f"an entry of {len(entry)} bytes is too short for a batch header")
    version = entry[0]
    if version == FORMAT:
        _, count = _HEADER.unpack_from(entry)
        at, stamp = _HEADER.size, 0
    elif version == SESSIONS_FORMAT:
        if len(entry) < _HEADER2.size:
            raise BatchError("a batch entry is truncated")
        _, stamp, count = _HEADER2.unpack_from(entry)
        at = _HEADER2.size
    else:
        raise BatchError(f"batch format {version} is not {FORMAT} or {SESSIONS_FORMAT}: the entry was not written "
                         f"by walkit.replicate")
    records: list[bytes] = []
    sessions: list[Session | None] = []
    end, unpack = len(entry), _LENGTH.unpack_from
    for _ in range(count):
        session = None
        if version == SESSIONS_FORMAT:
            if at + 1 > end:
                raise BatchError("a batch entry is truncated")
            flag = entry[at]
            at += 1
            if flag == 1:
                if at + _SESSION.size > end:
                    raise BatchError("a batch entry is truncated")
                (length,) = _SESSION.unpack_from(entry, at)
                at += _SESSION.size
                if at + length + _SEQ.size > end:
                    raise BatchError("a batch entry is truncated")
                try:
                    client = entry[at:at + length].decode()
                except UnicodeDecodeError:
                    raise BatchError("a batch entry names a client that is not UTF-8") from None
                at += length
                (seq,) = _SEQ.unpack_from(entry, at)
                at += _SEQ.size
                session = Session(client, seq)
            elif flag != 0:
                raise BatchError(f"a batch entry has session flag {flag}")
        if at + 4 > end:
            raise BatchError("a batch entry is truncated")
        (length,) = unpack(entry, at)
        at += 4
        if at + length > end:
            raise BatchError("a batch entry is truncated")
        records.append(entry[at:at + length])
        sessions.append(session)
        at += length
    if at != end:
        raise BatchError(f"a batch entry has {end - at} bytes after its {count} records")
    return Entry(records, sessions, stamp)
