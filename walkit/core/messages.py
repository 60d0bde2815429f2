"""walkit.core.messages defines the protocol data units exchanged by clients and bookies.

These are plain values with no encoding attached: `walkit.wire.codec` maps them to and from
Cap'n Proto, and the in-memory transport passes the encoded bytes too, so tests exercise the
same codec. Requests and responses carry a transaction id (`txn`) chosen by the client; a bookie
copies it into the response.

Batches are first-class: one `AddRequest` carries many entries of a ledger, one `ReadRequest`
asks for many entry ids, and the wire puts many requests in one message.

Every response names the disk that answered (`disk`: the identity of the bookie's storage,
walkit.bookie.identity; 0 when unknown). The wire carries it once per frame. A ledger's
metadata records which disk each bookie of a fragment had when the fragment was written, and a
client never counts an answer from another disk as that bookie's (a wiped disk answers
NO_SUCH_ENTRY for entries it once acknowledged; see walkit.core.metadata).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

#: The LAC of a ledger to which no entry was confirmed yet.
NO_ENTRY = -1
#: `previous_lac` value meaning "answer at once, do not long-poll".
NO_LONG_POLL = -2
#: The payload of the no-op entry that ends a new term's recovery of an unbounded ledger; readers
#: of unbounded ledgers skip it, and writers of unbounded ledgers refuse it as a payload.
NOOP_PAYLOAD = b"\x00walkit:no-op\x00"
#: The most entry ids one ReadRequest may ask for (BP-62 bounds reads by count and by size): a
#: bookie refuses more with BAD_REQUEST (walkit.core.bookie.BookieLimits.max_read_ids), and
#: clients split larger reads. Twice a RangeReader's default window, so that never splits.
MAX_READ_IDS = 8192
#: The bytes of entries a client asks one answer to hold at most, by default (ReadRequest.max_bytes;
#: walkit.Client's `max_read_bytes`). 8 MiB: eight answers fit a 64 MiB frame (DEFAULT_MAX_FRAME),
#: so one peer's answers of one bookie round rarely need a second frame; a bookie holds at most
#: that much (plus one entry) per read it answers, whatever the request asks; and at loopback or
#: LAN speed an 8 MiB answer takes several milliseconds to move, so one round trip per answer
#: costs a few per cent of a long read's throughput (auto-recovery copies in 8 MiB batches too).
DEFAULT_MAX_READ_BYTES = 8 * 1024 * 1024
#: The largest frame a bookie takes by default (walkit.wire.codec.DEFAULT_MAX_FRAME is this value).
MAX_FRAME_BYTES = 64 * 1024 * 1024
#: What the requests of one frame may add up to by `encoded_size` (an estimate that errs high),
#: leaving room below MAX_FRAME_BYTES: a bookie refuses a larger frame whole, every request in it.
FRAME_BUDGET = MAX_FRAME_BYTES - 2 * 1024 * 1024
#: Bytes an encoded request may take besides its entries' payloads and digests (an upper bound),
#: and an encoded entry besides its payload and digest (ids, LAC, list pointers, padding).
REQUEST_OVERHEAD = 512
ENTRY_OVERHEAD = 64


def entries_size(entries) -> int:
    """entries_size bounds from above what `entries` take in an encoded AddRequest or ReadResponse."""
    return sum(len(e.payload) + len(e.digest) + ENTRY_OVERHEAD for e in entries)


class Status(enum.IntEnum):
    """Status is the outcome of one request at a bookie (docs/internals/protocol.md#bookie-statuses)."""

    OK = 0
    NO_SUCH_ENTRY = 1
    NO_SUCH_LEDGER = 2
    FENCED = 3
    UNAUTHORIZED = 4
    BAD_REQUEST = 5
    READ_ONLY = 6
    TOO_MANY_REQUESTS = 7
    IO_ERROR = 8
    INVALID_TERM = 9
    #: Never sent by a bookie: the client's transport reports an unreachable bookie with it.
    UNREACHABLE = 100


class Entry(NamedTuple):
    """Entry is one ledger entry as written and read: the digest covers the other four fields."""

    ledger_id: int
    entry_id: int
    lac: int
    digest: bytes
    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class AddRequest:
    """AddRequest stores entries of one ledger; `recovery` adds pass a fenced ledger.

    `lafr` is the writer's Last Add Fully Replicated (every entry up to it is on Qw bookies),
    kept by the bookie for recovery of guaranteed-write-quorum ledgers; -1 when unknown.

    Unbounded ledgers: `term` is the writer's term (a bookie in a higher term refuses with
    INVALID_TERM, one in a lower term adopts it), and `truncate` makes the bookie drop every
    entry above the highest one in this request (the no-op that ends a new term's recovery).
    A truncating add with no entries and `truncate_from` (a cleaning) drops every entry from
    that id on: what a writer sends each bookie a new fragment brings in, before proposing it.

    With `deferred_sync` the bookie acknowledges the entries once stored, before they are
    durable; a later ForceRequest makes them durable (BookKeeper's WriteFlag.DEFERRED_SYNC).
    """

    txn: int
    ledger_id: int
    master_key: bytes
    entries: list[Entry]
    recovery: bool = False
    lafr: int = NO_ENTRY
    term: int = 0
    truncate: bool = False
    deferred_sync: bool = False
    truncate_from: int = NO_ENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRequest:
    """ReadRequest reads entries of one ledger by id (at most MAX_READ_IDS of them).

    With `fence` the bookie first makes the ledger fenced (durably) and checks `master_key`; with
    a `term` too (unbounded ledgers) it moves the ledger to that term instead (INVALID_TERM if it
    is in a higher one). With `previous_lac` >= -1 the bookie holds the request until its LAC
    for the ledger passes `previous_lac` or `timeout_ms` elapsed (long poll), then answers.

    `max_bytes` bounds the answer (BP-62): the bookie looks at the ids in order and stops before
    the entry that would take the answer past `max_bytes` bytes (it always returns the first
    entry it holds, however large), and says in ReadResponse.unread how many ids it did not
    look at. 0 is what a client that predates the field sends: the bookie then answers every id
    or, if that would pass its own bound, refuses the request (such a client would take the ids
    left out for absent ones).
    """

    txn: int
    ledger_id: int
    entry_ids: list[int]
    fence: bool = False
    master_key: bytes = b""
    previous_lac: int = NO_LONG_POLL
    timeout_ms: int = 0
    term: int = 0
    max_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacRequest:
    """ReadLacRequest asks a bookie for the highest LAC and last entry it holds for a ledger.

    `fence` makes it a fencing request (recovery; with `term`, a term change as in ReadRequest);
    `previous_lac` long-polls as in ReadRequest.
    """

    txn: int
    ledger_id: int
    fence: bool = False
    master_key: bytes = b""
    previous_lac: int = NO_LONG_POLL
    timeout_ms: int = 0
    term: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacRequest:
    """WriteLacRequest stores an explicit LAC sent by an idle writer."""

    txn: int
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceRequest:
    """ForceRequest asks a bookie to make durable every entry of a ledger it acknowledged before.

    The bookie answers after the sync that covers every request it received before this one.
    """

    txn: int
    ledger_id: int
    master_key: bytes


Request = AddRequest | ReadRequest | ReadLacRequest | WriteLacRequest | ForceRequest


def encoded_size(request) -> int:
    """encoded_size bounds from above the bytes `request` takes in a frame (walkit.wire.codec)."""
    if type(request) is AddRequest:
        return REQUEST_OVERHEAD + entries_size(request.entries)
    return REQUEST_OVERHEAD + 8 * len(getattr(request, "entry_ids", ()))


@dataclass(frozen=True, slots=True, kw_only=True)
class AddResponse:
    """AddResponse acknowledges (status OK) or refuses the entries of one AddRequest.

    `instance` names the bookie process that answered (random per start, 0 if unknown): a
    writer of a deferred-sync ledger sees from a new instance that the bookie restarted and
    may have lost entries it acknowledged but never made durable.
    """

    txn: int
    status: Status
    ledger_id: int
    entry_ids: list[int] = field(default_factory=list)
    message: str = ""
    instance: int = 0
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResponse:
    """ReadResponse returns the requested entries the bookie holds; absent ids are omitted.

    `unread` counts the ids at the end of the request that the bookie did not look at, because
    the answer reached the request's `max_bytes`: they are NOT absent, only not answered, and
    the client asks for them again. An id before them that is not in `entries` is absent. A
    bookie that predates the field always looks at every id, and its answers decode with 0.

    `lac` is the bookie's LAC for the ledger when it answered. A status other than OK applies to
    the whole request (for example FENCED, UNAUTHORIZED or NO_SUCH_LEDGER).
    """

    txn: int
    status: Status
    ledger_id: int
    entries: list[Entry] = field(default_factory=list)
    lac: int = NO_ENTRY
    message: str = ""
    disk: int = 0
    unread: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacResponse:
    """ReadLacResponse carries the bookie's LAC and LAFR and the highest entry id it stores."""

    txn: int
    status: Status
    ledger_id: int
    lac: int = NO_ENTRY
    last_entry_id: int = NO_ENTRY
    message: str = ""
    lafr: int = NO_ENTRY
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacResponse:
    """WriteLacResponse acknowledges an explicit LAC once it is durable."""

    txn: int
    status: Status
    ledger_id: int
    message: str = ""
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorResponse:
    """ErrorResponse answers a request that could not be decoded (status BAD_REQUEST).

    `txn` is the request's transaction id when it could be read, else 0.
    """

    txn: int
    status: Status
    message: str = ""
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceResponse:
    """ForceResponse answers a ForceRequest once the bookie synced; `instance` as in AddResponse."""

    txn: int
    status: Status
    ledger_id: int
    message: str = ""
    instance: int = 0
    disk: int = 0


Response = AddResponse | ReadResponse | ReadLacResponse | WriteLacResponse | ForceResponse | ErrorResponse


def split_answer(request: ReadRequest, response: ReadResponse) -> tuple[list[int], list[int]]:
    """split_answer returns (missing, unread): ids of `request` an OK `response` lacks, and ids it did not look at.

    Only `missing` ids are absent at that bookie; `unread` ones were not answered and must be
    asked again. An `unread` count larger than the request is read as "none looked at". Ids
    the response returns are in neither list, wherever they stand.
    """
    ids = request.entry_ids
    got = [e.entry_id for e in response.entries]
    if got == ids:                                 # the common case: every entry asked for, in order
        return [], []
    returned = set(got)
    looked = max(0, len(ids) - response.unread)
    return [i for i in ids[:looked] if i not in returned], [i for i in ids[looked:] if i not in returned]


def refusal(event, ledger_id: int) -> str:
    """refusal words a bookie's UNAUTHORIZED answer: a wrong password, or (secured) a key or right missing."""
    why = getattr(event, "message", "") or "wrong password"
    return f"bookie {event.bookie} refused ledger {ledger_id}: {why}"
