"""walkit.plugins.storage.files.journal is the bookie's write-ahead journal format: checksummed records.

The journal is the sequence of entry logs (entrylog.py), each a sequence of records::

    length u32 | crc32c u32 | type u8 | payload[length]          (little-endian)

The crc covers the length, the type and the payload, so a torn write, a bad length or flipped
bits are all caught. Payloads:

    PUT     ledger i64 | entry i64 | data
    STATE   ledger i64 | flags u8 | explicit_lac i64 | [term i64] | [truncated i64 i64] | master_key
            (flags: 1 fenced, 2 a term follows, 4 the last truncation's term and id follow)
    DELETE  ledger i64
    TRIM    ledger i64 | before i64      (drop the ledger's entries below `before`; storage version 3)

`encode_*` append records to the in-memory group-commit buffer; `EntryLogs.commit` writes the
buffer and calls ``os.fdatasync`` once (the group commit). `verify` checks a buffer of records
and stops at the first that is short or does not verify (its `problem` says why); `records`
walks a verified buffer; `RecordFile` reads a file's good records in chunks.

Version 1 of the storage kept the same records in separate journal files,
``journal/<seq as 16 hex digits>.journal``, and copied them into the entry logs after each sync;
`journal_files` lists such files, so a storage written by it can be replayed and carried over.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from crc32c import crc32c

from walkit.core.bookie import LedgerState
from walkit.plugins.storage.files.disk import numbered_files

PUT, STATE, DELETE, TRIM = 1, 2, 3, 4
KINDS = frozenset((PUT, STATE, DELETE, TRIM))

HEADER = struct.Struct("<IIB")         # length, crc32c, type
_CHECKED = struct.Struct("<IB")        # what the crc covers before the payload: length, type
PUT_IDS = struct.Struct("<qq")          # ledger, entry
_STATE = struct.Struct("<qBq")          # ledger, flags, explicit_lac (then the term if flagged, the master key)
_TERM = struct.Struct("<q")
_TRUNCATED = struct.Struct("<qq")
_FENCED, _HAS_TERM, _HAS_TRUNCATED = 1, 2, 4
_LEDGER = struct.Struct("<q")
_TRIM = struct.Struct("<qq")            # ledger, before
_PUT_HEAD = struct.Struct("<IIBqq")     # HEADER and PUT_IDS in one
_PUT_CHECKED = struct.Struct("<IBqq")   # _CHECKED and PUT_IDS in one

#: A longer record is taken as a corrupt length (the bookie's frames are far smaller).
MAX_RECORD = 1 << 30
_CHUNK = 8 << 20                        # read_records reads files in chunks of about this size


def _record(buffer: bytearray, kind: int, head: bytes, tail: bytes = b"") -> None:
    """_record appends one record (header, `head` and `tail` as its payload) to `buffer`."""
    length = len(head) + len(tail)
    if length > MAX_RECORD:
        raise ValueError(f"journal record of {length} bytes exceeds the {MAX_RECORD}-byte limit")
    crc = crc32c(tail, crc32c(_CHECKED.pack(length, kind) + head))
    buffer += HEADER.pack(length, crc, kind)
    buffer += head
    buffer += tail


def encode_put(buffer: bytearray, ledger_id: int, entry_id: int, data: bytes) -> None:
    """encode_put appends a PUT record (an entry's bytes) to `buffer` (the hot path: one call per add)."""
    length = PUT_IDS.size + len(data)
    if length > MAX_RECORD:
        raise ValueError(f"journal record of {length} bytes exceeds the {MAX_RECORD}-byte limit")
    crc = crc32c(data, crc32c(_PUT_CHECKED.pack(length, PUT, ledger_id, entry_id)))
    buffer += _PUT_HEAD.pack(length, crc, PUT, ledger_id, entry_id)
    buffer += data


def put_data(view: memoryview, pos: int, length: int, ledger_id: int, entry_id: int) -> bytes | None:
    """put_data returns the data of the PUT record of (ledger, entry) at view[pos:], or None if it is not intact.

    `length` is the record's payload length the index holds. This is `verify` for one known
    record on the read path: header, ids and crc are checked without scanning.
    """
    data_at, end = pos + _PUT_HEAD.size, pos + HEADER.size + length
    if end > len(view) or data_at > end:
        return None
    stored_length, crc, kind, stored_ledger, stored_entry = _PUT_HEAD.unpack_from(view, pos)
    if stored_length != length or kind != PUT or stored_ledger != ledger_id or stored_entry != entry_id:
        return None
    data = view[data_at:end]
    if crc32c(data, crc32c(_PUT_CHECKED.pack(length, PUT, ledger_id, entry_id))) != crc:
        return None
    return bytes(data)


def encode_puts(buffer: bytearray, ledger_id: int, entries) -> None:
    """encode_puts appends one PUT record per (entry_id, data) of a ledger: encode_put for a whole add batch."""
    head_pack, checked_pack, put, size = _PUT_HEAD.pack, _PUT_CHECKED.pack, PUT, PUT_IDS.size
    for entry_id, data in entries:
        length = size + len(data)
        if length > MAX_RECORD:
            raise ValueError(f"journal record of {length} bytes exceeds the {MAX_RECORD}-byte limit")
        crc = crc32c(data, crc32c(checked_pack(length, put, ledger_id, entry_id)))
        buffer += head_pack(length, crc, put, ledger_id, entry_id)
        buffer += data


def encode_state(buffer: bytearray, ledger_id: int, state: LedgerState) -> None:
    """encode_state appends a STATE record (fenced flag, explicit LAC, term, master key) to `buffer`."""
    truncated = state.truncated != (0, 0)
    flags = (_FENCED if state.fenced else 0) | (_HAS_TERM if state.term else 0) | (_HAS_TRUNCATED if truncated else 0)
    head = _STATE.pack(ledger_id, flags, state.explicit_lac)
    if state.term:
        head += _TERM.pack(state.term)
    if truncated:
        head += _TRUNCATED.pack(*state.truncated)
    _record(buffer, STATE, head, bytes(state.master_key))


def encode_delete(buffer: bytearray, ledger_id: int) -> None:
    """encode_delete appends a DELETE record (drop the ledger's entries and state) to `buffer`."""
    _record(buffer, DELETE, _LEDGER.pack(ledger_id))


def encode_trim(buffer: bytearray, ledger_id: int, before: int) -> None:
    """encode_trim appends a TRIM record (drop the ledger's entries below `before`) to `buffer`."""
    _record(buffer, TRIM, _TRIM.pack(ledger_id, before))


def decode_trim(payload: bytes) -> tuple[int, int]:
    """decode_trim returns (ledger, before) of a TRIM payload."""
    return _TRIM.unpack_from(payload)


def decode_state(payload: bytes) -> tuple[int, LedgerState]:
    """decode_state returns (ledger, state) of a STATE payload."""
    ledger_id, flags, lac = _STATE.unpack_from(payload)
    start, term, truncated = _STATE.size, 0, (0, 0)
    if flags & _HAS_TERM:
        (term,) = _TERM.unpack_from(payload, start)
        start += _TERM.size
    if flags & _HAS_TRUNCATED:
        truncated = _TRUNCATED.unpack_from(payload, start)
        start += _TRUNCATED.size
    return ledger_id, LedgerState(fenced=bool(flags & _FENCED), master_key=bytes(payload[start:]), explicit_lac=lac,
                                  term=term, truncated=tuple(truncated))


def decode_delete(payload: bytes) -> int:
    """decode_delete returns the ledger of a DELETE payload."""
    return _LEDGER.unpack_from(payload)[0]


class Scan(NamedTuple):
    """Scan is what `verify` found: where the good records end and why the next one is not good.

    `problem` is None when the records end exactly at the end of the buffer. `incomplete` means
    the next record is cut short by the buffer's end (more data may complete it: `needed` bytes
    from `end`); otherwise the problem is a bad header or checksum.
    """

    end: int
    problem: str | None = None
    incomplete: bool = False
    needed: int = 0


def verify(view: memoryview) -> Scan:
    """verify checks the records of `view` from its start, stopping at the first that is not good."""
    pos, size = 0, len(view)
    unpack, checked = HEADER.unpack_from, _CHECKED.pack
    while pos < size:
        if size - pos < HEADER.size:
            return Scan(pos, f"torn record header ({size - pos} of {HEADER.size} bytes)", True, HEADER.size)
        length, crc, kind = unpack(view, pos)
        if length > MAX_RECORD or kind not in KINDS:
            return Scan(pos, f"bad record header (length {length}, type {kind})")
        end = pos + HEADER.size + length
        if end > size:
            return Scan(pos, f"torn record ({size - pos - HEADER.size} of {length} payload bytes)", True,
                        HEADER.size + length)
        if crc32c(view[pos + HEADER.size:end], crc32c(checked(length, kind))) != crc:
            return Scan(pos, "record checksum mismatch")
        pos = end
    return Scan(pos)


def records(view: memoryview) -> Iterator[tuple[int, int, int]]:
    """records yields (offset, type, payload length) of each record in an already verified buffer."""
    pos, size, unpack = 0, len(view), HEADER.unpack_from
    while pos < size:
        length, _, kind = unpack(view, pos)
        yield pos, kind, length
        pos += HEADER.size + length


class RecordFile:
    """RecordFile reads the good records of an entry log (or version 1 journal file), from `start`, in chunks.

    `chunks()` yields (view, file offset) for runs of whole, verified records; a view is valid
    until the next one is asked for. Afterwards `end` is the end of the last good record and
    `problem` is None at a clean end of file, or says why the next record is not good.
    """

    def __init__(self, path: str, start: int = 0) -> None:
        """__init__ prepares to read `path` from offset `start`."""
        self.path = path
        self.end = start
        self.problem: str | None = None

    def chunks(self) -> Iterator[tuple[memoryview, int]]:
        """chunks yields the file's good records as (view, offset) runs; see the class doc."""
        carry, needed = b"", _CHUNK
        with open(self.path, "rb") as stream:
            stream.seek(self.end)
            while True:
                more = stream.read(max(_CHUNK, needed - len(carry)))
                if not more:
                    self.problem = verify(memoryview(carry)).problem if carry else None
                    return
                chunk = carry + more if carry else more
                view = memoryview(chunk)
                scan = verify(view)
                if scan.end:
                    yield view[:scan.end], self.end
                self.end += scan.end
                if scan.problem is not None and not scan.incomplete:
                    self.problem = scan.problem
                    return
                carry, needed = chunk[scan.end:], scan.needed


def journal_files(folder: str) -> list[tuple[int, str]]:
    """journal_files lists (sequence number, path) of version 1's journal files in `folder`, oldest first."""
    return numbered_files(folder, "journal", 16)
