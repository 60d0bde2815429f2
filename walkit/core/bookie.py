"""walkit.core.bookie decides how a bookie answers requests; it stores and sends nothing itself.

`BookieHandler.step(peer, request)` returns commands for the shell:

- `StoreEntries` and `StoreLedgerState` change storage (buffered `put`s);
- `Reply(durable=True)` may be sent only after the storage `sync()` that covers every store
  command returned before it: a bookie acknowledges an add only once it is durable, and a
  fence, master key or explicit LAC only once they are durable (docs/internals/protocol.md#sync-before-ack;
  BP-46: a bookie that forgets a fence lets a closed ledger take writes);
- `Reply(durable=False)` may be sent at once (errors, plain reads).

Rules applied here (docs/internals/protocol.md#bookie-statuses and #fencing):

- the first add (or fence) of a ledger records its master key; later adds and fences with a
  different key get UNAUTHORIZED;
- a fenced ledger refuses adds without the recovery flag (FENCED); fencing requests fence the
  ledger even if the bookie never saw it, so an add from the old writer arriving later is
  refused too;
- the bookie's LAC of a ledger is the highest LAC carried by its entries or sent explicitly;
  long-poll requests wait until it passes their `previous_lac` or their timeout expires (also
  for a ledger the bookie holds nothing of yet: then NO_SUCH_LEDGER at the timeout);
- unbounded ledgers fence by term instead of the flag
  (docs/internals/protocol.md#unbounded-ledgers): adds, fencing reads and LAC reads carry the
  writer's or recoverer's term; a request from a lower term than the ledger's gets INVALID_TERM, one
  from a higher term moves the ledger to it (durably, before the answer).
  An add with `truncate` drops every entry above its highest one, unless a truncation at a
  later (term, id) was applied already (so reordered or duplicated truncating adds are safe):
  the bookie overwrites them with tombstones, which reads treat as absent (no storage backend
  needs a delete for this). A truncating add with no entries and `truncate_from` (a writer
  cleaning a bookie it brings into a fragment) drops every entry from that id on, under the
  same (term, id) order;
- a deferred-sync add (BookKeeper's WriteFlag.DEFERRED_SYNC) is acknowledged with a
  non-durable Reply, its entries stored with StoreEntries(deferred=True); a ForceRequest is
  answered with a durable Reply, so the shell syncs before it goes out and every entry the
  bookie acknowledged before the force is durable when the writer learns of it. Add and force
  answers carry the handler's `instance` (random per bookie start), so a writer sees when a
  bookie restarted and may have lost acknowledged, unforced entries;
- a read-only bookie refuses ordinary adds with READ_ONLY and keeps serving reads;
- every request is checked against `BookieLimits` before it touches storage or state: ids the
  storage can hold, how many ids one read asks for, digest and master-key sizes, long-poll
  timeouts and how many long polls may wait. A request outside them gets BAD_REQUEST
  (TOO_MANY_REQUESTS for one long poll too many) naming what was wrong, and changes nothing;
- reads are bounded by bytes as well as by count (BookKeeper BP-62): an answer holds at most
  the request's `max_bytes` (and never more than `BookieLimits.max_read_bytes`) of entries,
  except that the first entry found is always returned, however large. The bookie looks at
  the ids in request order, stops before the entry that would pass the bound, and reports
  how many ids it did not look at (ReadResponse.unread): those are not absent, and a
  recovery must not count them as NO_SUCH_ENTRY. Duplicate ids cost bytes like any other.
  A request without `max_bytes` (a client that predates it, and would take the ids left out
  for absent ones) is answered whole, or refused with BAD_REQUEST if that passes the bound.

Reads go through `storage`, a read-only view of the bookie's EntryStorage (as etcd raft reads
its log through a Storage interface); every change goes out as a command.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass, replace
from typing import Protocol

from walkit.core.messages import (
    MAX_READ_IDS, NO_ENTRY, NO_LONG_POLL, AddRequest, AddResponse, Entry, ForceRequest, ForceResponse, ReadLacRequest,
    ReadLacResponse, ReadRequest, ReadResponse, Status, WriteLacRequest, WriteLacResponse,
)


@dataclass(frozen=True, slots=True)
class LedgerState:
    """LedgerState is what a bookie must remember about a ledger besides its entries.

    It is durable (part of `EntryStorage` and covered by `sync()`): the fenced flag, the master
    key recorded on the first add or fence, the highest explicit LAC, and the highest term seen
    (unbounded ledgers fence by term instead of the flag). `truncated` is the (term, entry id)
    of the last truncation applied: a truncating add applies only if its (term, first dropped
    id) is later, so a late or duplicated one never drops what was written after it.
    """

    fenced: bool = False
    master_key: bytes = b""
    explicit_lac: int = NO_ENTRY
    term: int = 0
    truncated: tuple[int, int] = (0, 0)


_STORED = struct.Struct(">qB")
#: What a bookie stores in place of an entry a truncating add dropped (no real entry has LAC -3).
TOMBSTONE = _STORED.pack(-3, 0)
#: The most entries one truncating add may drop (a writer never has this many in flight).
MAX_TRUNCATE_SPAN = 1 << 22

#: The highest ledger or entry id the wire can carry (Cap'n Proto Int64).
MAX_ID = 2**63 - 1
#: A stored entry keeps its digest length in one byte.
MAX_DIGEST_BYTES = 255
#: Master keys are 32-byte hashes of the password; anything much longer is not one.
MAX_MASTER_KEY_BYTES = 64
#: What an entry costs in a read answer on the wire besides its digest and payload, at most: its
#: id and LAC, two list pointers, the padding of digest and payload to 8 bytes. A read's bytes
#: (ReadRequest.max_bytes) count it, so an answer of many small entries fits its frame too.
ENTRY_WIRE_BYTES = 48
#: The most ids a read takes from storage at once while it builds an answer. Each storage read
#: asks for as many ids as the bytes left in the answer hold at the size of the largest entry
#: seen so far (one id first, so the first entry's size is known before any more is read), so
#: an answer reads little past its bound.
READ_CHUNK_IDS = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieLimits:
    """BookieLimits bounds what one request may ask of a bookie.

    `max_entry_id` is the highest entry id the storage can hold (an EntryStorage may declare
    its own `max_entry_id`); `max_long_poll_ms` caps how long a long poll is held (longer
    timeouts are shortened to it); `max_long_polls` caps how many long polls wait at once
    (one more gets TOO_MANY_REQUESTS). `max_read_ids` caps the ids of one read (more get
    BAD_REQUEST); `max_read_bytes` caps the bytes of entries in one read answer whatever the
    request's `max_bytes` (its first entry aside): the shell sets it below its frame limit, so
    one answer always fits one frame (walkit.bookie.service).
    """

    max_entry_id: int = MAX_ID
    max_long_poll_ms: int = 60_000
    max_long_polls: int = 10_000
    max_read_ids: int = MAX_READ_IDS
    max_read_bytes: int = 63 * 1024 * 1024


def pack_entry(lac: int, digest: bytes, payload: bytes) -> bytes:
    """pack_entry returns the bytes a bookie stores for an entry (its ids are the storage key)."""
    return b"".join((_STORED.pack(lac, len(digest)), digest, payload))


def is_tombstone(data: bytes | None) -> bool:
    """is_tombstone tells whether stored bytes are a dropped entry's tombstone (see TOMBSTONE)."""
    return data is not None and data[:_STORED.size] == TOMBSTONE


def unpack_entry(ledger_id: int, entry_id: int, data: bytes) -> Entry:
    """unpack_entry turns stored bytes back into the Entry that was added."""
    lac, digest_len = _STORED.unpack_from(data)
    start = _STORED.size
    return Entry(ledger_id, entry_id, lac, data[start:start + digest_len], data[start + digest_len:])


class StorageView(Protocol):
    """StorageView is the read side of EntryStorage that the handler needs."""

    def get(self, ledger_id: int, entry_id: int) -> bytes | None: ...

    # Optional: get_many(ledger_id, entry_ids) -> list[bytes | None], used for reads when present.

    def last_entry(self, ledger_id: int) -> int: ...

    def ledger_state(self, ledger_id: int) -> LedgerState | None: ...


@dataclass(frozen=True, slots=True)
class StoreEntries:
    """StoreEntries asks the shell to `put` packed entries of one ledger.

    `deferred` entries (a deferred-sync add) need no sync until a durable Reply follows.
    """

    ledger_id: int
    entries: list[tuple[int, bytes]]
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class StoreLedgerState:
    """StoreLedgerState asks the shell to store a ledger's new state."""

    ledger_id: int
    state: LedgerState


@dataclass(frozen=True, slots=True)
class Reply:
    """Reply asks the shell to send `response` to `peer`; see the module doc for `durable`."""

    peer: bytes
    response: object
    durable: bool


@dataclass(slots=True)
class _Ledger:
    """_Ledger is the handler's in-memory view of one ledger: durable state plus LAC and tail."""

    state: LedgerState
    lac: int
    last_entry_id: int
    lafr: int = NO_ENTRY        # highest LAFR writers sent (not durable: -1 after a restart is safe)


@dataclass(slots=True)
class _Poll:
    peer: bytes
    request: ReadRequest | ReadLacRequest
    deadline_ms: int


class BookieHandler:
    """BookieHandler turns decoded requests into storage commands and replies.

    `storage` is read through (see StorageView); `read_only` can be switched by the shell.
    Time comes from `tick(now_ms)`, which also expires long polls. `instance` names this run
    of the bookie in add and force answers: the shell draws a new random one at every start.
    """

    def __init__(self, storage: StorageView, *, read_only: bool = False,
                 limits: BookieLimits = BookieLimits(), instance: int = 0) -> None:
        self.storage = storage
        self.instance = instance
        self.read_only = read_only
        self.limits = limits
        self._ledgers: dict[int, _Ledger] = {}
        self._polls: dict[int, list[_Poll]] = {}
        self._poll_count = 0
        self._now = 0
        self._handlers = {AddRequest: self._on_add, ReadRequest: self._on_read,
                          ReadLacRequest: self._on_read_lac, WriteLacRequest: self._on_write_lac,
                          ForceRequest: self._on_force}

    # -- public ---------------------------------------------------------------------------
    def step(self, peer: bytes, request) -> list:
        """step handles one request from `peer` and returns the commands to carry out in order."""
        problem = self._invalid(request)
        if problem is not None:
            return [Reply(peer, error_response(request, Status.BAD_REQUEST, problem), False)]
        return self._handlers[type(request)](peer, request)

    def peer_gone(self, peer: bytes) -> list:
        """peer_gone answers, at once, the long polls of a client whose connection closed.

        The answers are sent in case the connection comes back; if it does not, the shell's
        socket drops them. Either way the polls stop taking room.
        """
        commands: list = []
        for ledger_id in list(self._polls):
            polls = self._polls[ledger_id]
            gone = [p for p in polls if p.peer == peer]
            if gone:
                commands += self._take_polls(ledger_id, [p for p in polls if p.peer != peer], gone)
        return commands

    def tick(self, now_ms: int) -> list:
        """tick advances time and answers the long polls whose timeout expired."""
        self._now = now_ms
        commands: list = []
        for ledger_id in list(self._polls):
            polls = self._polls[ledger_id]
            expired = [p for p in polls if p.deadline_ms <= now_ms]
            if expired:
                commands += self._take_polls(ledger_id, [p for p in polls if p.deadline_ms > now_ms], expired)
        return commands

    def forget(self, ledger_id: int) -> None:
        """forget drops the cached state of a ledger whose data the shell deleted or failed to store.

        The next request re-reads the ledger from storage; long polls on it are answered from
        there (NO_SUCH_LEDGER if it is gone).
        """
        self._ledgers.pop(ledger_id, None)
        polls = self._polls.get(ledger_id)
        return self._take_polls(ledger_id, [], polls) if polls else []

    def lac(self, ledger_id: int) -> int:
        """lac returns the bookie's LAC for a ledger (-1 if unknown)."""
        ledger = self._ledger(ledger_id)
        return NO_ENTRY if ledger is None else ledger.lac

    @property
    def poll_count(self) -> int:
        """poll_count is the number of long polls waiting."""
        return self._poll_count

    # -- validation -----------------------------------------------------------------------
    def _invalid(self, request) -> str | None:
        """_invalid says what is wrong with a request that must not reach storage, or None."""
        ledger_id = request.ledger_id
        if not 0 <= ledger_id <= MAX_ID:
            return f"ledger id {ledger_id} is out of range (0..{MAX_ID})"
        if len(request.master_key) > MAX_MASTER_KEY_BYTES:
            return f"master key of {len(request.master_key)} bytes exceeds {MAX_MASTER_KEY_BYTES}"
        max_entry = self.limits.max_entry_id
        kind = type(request)
        if getattr(request, "term", 0) < 0:
            return f"term {request.term} is negative"
        if kind is AddRequest:
            if not NO_ENTRY <= request.lafr <= max_entry:
                return f"LAFR {request.lafr} is out of range (-1..{max_entry})"
            if request.truncate_from != NO_ENTRY:
                if not (request.truncate and request.term and not request.entries):
                    return "truncate_from goes with a truncating add of an unbounded ledger that carries no entries"
                if not 0 <= request.truncate_from <= max_entry:
                    return f"truncate_from {request.truncate_from} is out of range (0..{max_entry})"
            elif request.truncate and (not request.term or not request.entries):
                return "a truncating add needs a term and at least one entry"
            if request.deferred_sync and (request.recovery or request.term):
                return "recovery adds and adds of unbounded ledgers cannot defer their sync"
            entries = request.entries
            if entries:                         # the whole batch checked in C; the loop below names a culprit
                ledger_ids, ids, lacs, digests, _ = zip(*entries)
                if (ledger_ids.count(ledger_id) == len(ledger_ids) and min(ids) >= 0 and max(ids) <= max_entry
                        and min(lacs) >= NO_ENTRY and not any(map(operator.ge, lacs, ids))
                        and max(map(len, digests)) <= MAX_DIGEST_BYTES):
                    entries = ()
            for entry in entries:
                if entry.ledger_id != ledger_id:
                    return f"entry ({entry.ledger_id}, {entry.entry_id}) does not belong to ledger {ledger_id}"
                if not 0 <= entry.entry_id <= max_entry:
                    return f"entry id {entry.entry_id} is out of range (0..{max_entry} on this bookie)"
                if not NO_ENTRY <= entry.lac < entry.entry_id:
                    return f"entry {entry.entry_id} carries LAC {entry.lac}, not in -1..{entry.entry_id - 1}"
                if len(entry.digest) > MAX_DIGEST_BYTES:
                    return f"digest of {len(entry.digest)} bytes exceeds {MAX_DIGEST_BYTES} (entry {entry.entry_id})"
        elif kind is ReadRequest:
            if len(request.entry_ids) > self.limits.max_read_ids:
                return (f"read of {len(request.entry_ids)} entry ids exceeds the limit of {self.limits.max_read_ids} "
                        f"ids per request")
            if request.max_bytes < 0:
                return f"max_bytes {request.max_bytes} is negative"
            for entry_id in request.entry_ids:
                if not 0 <= entry_id <= max_entry:
                    return f"entry id {entry_id} is out of range (0..{max_entry} on this bookie)"
        elif kind is WriteLacRequest:
            if not NO_ENTRY <= request.lac <= max_entry:
                return f"LAC {request.lac} is out of range (-1..{max_entry})"
        if kind is ReadRequest or kind is ReadLacRequest:
            if request.previous_lac < NO_LONG_POLL:
                return f"previous LAC {request.previous_lac} is below {NO_LONG_POLL}"
            if request.timeout_ms < 0:
                return f"long-poll timeout {request.timeout_ms} ms is negative"
        return None

    # -- ledger state ---------------------------------------------------------------------
    def _ledger(self, ledger_id: int) -> _Ledger | None:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            state = self.storage.ledger_state(ledger_id)
            if state is None:
                return None
            last = self.storage.last_entry(ledger_id)
            lac = state.explicit_lac
            data = self.storage.get(ledger_id, last) if last >= 0 else None
            if is_tombstone(data):             # a truncated tail: the last entry is below its tombstones
                while last >= 0 and (data is None or is_tombstone(data)):
                    last -= 1
                    data = self.storage.get(ledger_id, last) if last >= 0 else None
            if data is not None:
                lac = max(lac, _STORED.unpack_from(data)[0])
            ledger = self._ledgers[ledger_id] = _Ledger(state, lac, last)
        return ledger

    def _claim(self, ledger_id: int, master_key: bytes) -> tuple[_Ledger, list]:
        """_claim returns the ledger, creating it with `master_key` if new, plus store commands."""
        ledger = self._ledger(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger(LedgerState(master_key=master_key), NO_ENTRY, NO_ENTRY)
            return ledger, [StoreLedgerState(ledger_id, ledger.state)]
        if not ledger.state.master_key:
            ledger.state = replace(ledger.state, master_key=master_key)
            return ledger, [StoreLedgerState(ledger_id, ledger.state)]
        return ledger, []

    # -- requests -------------------------------------------------------------------------
    def _on_add(self, peer: bytes, request: AddRequest) -> list:
        ledger_id = request.ledger_id

        def refuse(status: Status, message: str) -> list:
            return [Reply(peer, AddResponse(txn=request.txn, status=status, ledger_id=ledger_id,
                                            entry_ids=[e.entry_id for e in request.entries],
                                            message=message), False)]

        if self.read_only and not request.recovery:
            return refuse(Status.READ_ONLY, "bookie is read-only")
        if not request.master_key:
            return refuse(Status.BAD_REQUEST, "add without a master key")
        existing = self._ledger(ledger_id)
        if existing is not None and existing.state.master_key and existing.state.master_key != request.master_key:
            return refuse(Status.UNAUTHORIZED, f"wrong master key for ledger {ledger_id}")
        stale = _stale_term(ledger_id, existing, request.term)
        if stale is not None:
            return refuse(Status.INVALID_TERM, stale)
        if existing is not None and existing.state.fenced and not request.recovery and not request.term:
            return refuse(Status.FENCED, f"ledger {ledger_id} is fenced")
        entry_ids = [e.entry_id for e in request.entries]
        # A cleaning (no entries, truncate_from) truncates as an add whose highest entry is just below.
        cleaning = request.truncate_from != NO_ENTRY
        highest = max(entry_ids, default=request.truncate_from - 1 if cleaning else NO_ENTRY)
        if request.truncate and existing is not None and existing.last_entry_id - highest > MAX_TRUNCATE_SPAN:
            return refuse(Status.BAD_REQUEST, f"truncating above entry {highest} would drop more than "
                                              f"{MAX_TRUNCATE_SPAN} entries")
        ledger, commands = self._claim(ledger_id, request.master_key)
        commands += self._adopt_term(ledger_id, ledger, request.term)
        if request.entries:
            _, _, lacs, digests, payloads = zip(*request.entries)
            commands.append(StoreEntries(ledger_id, list(zip(entry_ids, map(pack_entry, lacs, digests, payloads))),
                                         request.deferred_sync))
            ledger.lac = max(ledger.lac, max(lacs))
        mark = (request.term, highest + 1)
        if request.truncate and mark > ledger.state.truncated:
            if ledger.last_entry_id > highest:
                commands.append(StoreEntries(ledger_id, [(entry_id, TOMBSTONE) for entry_id
                                                         in range(highest + 1, ledger.last_entry_id + 1)]))
            ledger.last_entry_id = highest if request.entries else min(ledger.last_entry_id, highest)
            ledger.state = replace(ledger.state, truncated=mark)
            commands.append(StoreLedgerState(ledger_id, ledger.state))
        elif request.entries:
            ledger.last_entry_id = max(ledger.last_entry_id, highest)
        if request.lafr > ledger.lafr:       # never past the LAC: a fully replicated entry is confirmed
            ledger.lafr = min(request.lafr, ledger.lac)
        commands.append(Reply(peer, AddResponse(txn=request.txn, status=Status.OK, ledger_id=ledger_id,
                                                entry_ids=entry_ids, instance=self.instance),
                              not request.deferred_sync))
        # The shell stores these entries only after this step returns: woken reads take them from here.
        return commands + self._wake(ledger_id, ledger, request.entries)

    def _fence_or_find(self, peer: bytes, request: ReadRequest | ReadLacRequest, make_error) -> tuple:
        """_fence_or_find applies a read's fence flag; it returns (ledger, commands, error reply)."""
        ledger_id = request.ledger_id
        if not request.fence:
            ledger = self._ledger(ledger_id)
            if ledger is None:
                return None, [], make_error(Status.NO_SUCH_LEDGER, f"no ledger {ledger_id} on this bookie")
            return ledger, [], None
        if not request.master_key:
            return None, [], make_error(Status.BAD_REQUEST, "fencing request without a master key")
        existing = self._ledger(ledger_id)
        if existing is not None and existing.state.master_key and existing.state.master_key != request.master_key:
            return None, [], make_error(Status.UNAUTHORIZED, f"wrong master key for ledger {ledger_id}")
        stale = _stale_term(ledger_id, existing, request.term)
        if stale is not None:
            return None, [], make_error(Status.INVALID_TERM, stale)
        ledger, commands = self._claim(ledger_id, request.master_key)
        if request.term:                       # unbounded ledgers: the term is the fence
            return ledger, commands + self._adopt_term(ledger_id, ledger, request.term), None
        if not ledger.state.fenced:
            ledger.state = replace(ledger.state, fenced=True)
            commands = [StoreLedgerState(ledger_id, ledger.state)]
        return ledger, commands, None

    @staticmethod
    def _adopt_term(ledger_id: int, ledger: _Ledger, term: int) -> list:
        """_adopt_term moves the ledger to a higher `term` (durably); it returns the store command."""
        if term <= ledger.state.term:
            return []
        ledger.state = replace(ledger.state, term=term)
        return [StoreLedgerState(ledger_id, ledger.state)]

    def _on_read(self, peer: bytes, request: ReadRequest) -> list:
        def error(status: Status, message: str) -> list:
            return [Reply(peer, ReadResponse(txn=request.txn, status=status, ledger_id=request.ledger_id,
                                             message=message), False)]

        if self._polls_unknown_ledger(request):
            return self._park(peer, request)
        ledger, commands, failure = self._fence_or_find(peer, request, error)
        if failure is not None:
            return failure
        if self._should_wait(request, ledger):
            return commands + self._park(peer, request)
        # A fencing answer waits for the sync even if this request found the ledger fenced
        # already: the fence that an earlier request set may not be durable yet.
        return commands + [self._read_reply(peer, request, ledger, durable=request.fence)]

    def _on_read_lac(self, peer: bytes, request: ReadLacRequest) -> list:
        def error(status: Status, message: str) -> list:
            return [Reply(peer, ReadLacResponse(txn=request.txn, status=status, ledger_id=request.ledger_id,
                                                message=message), False)]

        if self._polls_unknown_ledger(request):
            return self._park(peer, request)
        ledger, commands, failure = self._fence_or_find(peer, request, error)
        if failure is not None:
            return failure
        if self._should_wait(request, ledger):
            return commands + self._park(peer, request)
        return commands + [self._lac_reply(peer, request, ledger, durable=request.fence)]

    def _on_write_lac(self, peer: bytes, request: WriteLacRequest) -> list:
        ledger_id = request.ledger_id
        ledger = self._ledger(ledger_id)
        status, message = Status.OK, ""
        if ledger is None:
            status, message = Status.NO_SUCH_LEDGER, f"no ledger {ledger_id} on this bookie"
        elif ledger.state.master_key != request.master_key:
            status, message = Status.UNAUTHORIZED, f"wrong master key for ledger {ledger_id}"
        if status != Status.OK:
            return [Reply(peer, WriteLacResponse(txn=request.txn, status=status, ledger_id=ledger_id,
                                                 message=message), False)]
        commands: list = []
        if request.lac > ledger.state.explicit_lac:
            ledger.state = replace(ledger.state, explicit_lac=request.lac)
            ledger.lac = max(ledger.lac, request.lac)
            commands.append(StoreLedgerState(ledger_id, ledger.state))
        commands.append(Reply(peer, WriteLacResponse(txn=request.txn, status=Status.OK, ledger_id=ledger_id), True))
        return commands + self._wake(ledger_id, ledger)

    def _on_force(self, peer: bytes, request: ForceRequest) -> list:
        """_on_force answers after the next sync: everything acknowledged before it is durable then.

        A ledger the bookie never saw is answered too (it holds nothing to sync); the instance
        tells the writer whether this is the bookie run that acknowledged its entries.
        """
        ledger_id = request.ledger_id
        ledger = self._ledger(ledger_id)
        if ledger is not None and ledger.state.master_key and ledger.state.master_key != request.master_key:
            return [Reply(peer, ForceResponse(txn=request.txn, status=Status.UNAUTHORIZED, ledger_id=ledger_id,
                                              message=f"wrong master key for ledger {ledger_id}"), False)]
        return [Reply(peer, ForceResponse(txn=request.txn, status=Status.OK, ledger_id=ledger_id,
                                          instance=self.instance), True)]

    # -- replies and long polls -------------------------------------------------------------
    def _read_reply(self, peer: bytes, request: ReadRequest, ledger: _Ledger, durable: bool,
                    fresh: dict[int, Entry] | None = None) -> Reply:
        """_read_reply reads the requested entries up to the answer's bound (see the module doc).

        `fresh` holds entries added in this step, not stored yet.
        """
        ledger_id, ids, asked = request.ledger_id, request.entry_ids, request.max_bytes
        bound = self.limits.max_read_bytes
        entries, looked = self._read_entries(ledger_id, ids, min(asked, bound) if asked else bound, fresh)
        unread = len(ids) - looked
        if unread and not asked:
            return Reply(peer, ReadResponse(
                txn=request.txn, status=Status.BAD_REQUEST, ledger_id=ledger_id,
                message=f"the answer to this read of {len(ids)} entries would pass {bound} bytes, and the request "
                        f"sets no max_bytes to say where it may stop: ask for fewer entries"), False)
        return Reply(peer, ReadResponse(txn=request.txn, status=Status.OK, ledger_id=ledger_id, entries=entries,
                                        lac=ledger.lac, unread=unread), durable)

    def _read_entries(self, ledger_id: int, ids: list[int], bound: int,
                      fresh: dict[int, Entry] | None) -> tuple[list[Entry], int]:
        """_read_entries returns (the entries of `ids` held here, up to `bound` bytes; how many ids it looked at).

        It stops before the entry that would take the answer past `bound` (the first entry
        found is always taken). An entry counts its digest, payload and ENTRY_WIRE_BYTES, so a
        repeated id costs its bytes each time. Storage is read in chunks (READ_CHUNK_IDS).
        """
        get_many = getattr(self.storage, "get_many", None)
        get = self.storage.get
        entries: list[Entry] = []
        append, unpack, header, new = entries.append, _STORED.unpack_from, _STORED.size, tuple.__new__
        total = largest = 0
        start, count, chunk = 0, len(ids), 1
        extra = ENTRY_WIRE_BYTES - header
        while start < count:
            part = ids[start:start + chunk]
            datas = get_many(ledger_id, part) if get_many is not None else [get(ledger_id, e) for e in part]
            looked = start
            for entry_id, data in zip(part, datas):
                if fresh and entry_id in fresh:
                    entry = fresh[entry_id]
                    size = ENTRY_WIRE_BYTES + len(entry.digest) + len(entry.payload)
                elif data is None or data[:header] == TOMBSTONE:
                    looked += 1
                    continue
                else:
                    size = extra + len(data)
                    lac, digest_len = unpack(data)
                    entry = new(Entry, (ledger_id, entry_id, lac, data[header:header + digest_len],
                                        data[header + digest_len:]))
                total += size
                if total > bound and entries:
                    return entries, looked
                append(entry)
                looked += 1
                if size > largest:
                    largest = size
            start += len(part)
            chunk = (max(1, min(READ_CHUNK_IDS, (bound - total) // largest)) if largest
                     else min(READ_CHUNK_IDS, 2 * chunk))
        return entries, count

    @staticmethod
    def _lac_reply(peer: bytes, request: ReadLacRequest, ledger: _Ledger, durable: bool) -> Reply:
        return Reply(peer, ReadLacResponse(txn=request.txn, status=Status.OK, ledger_id=request.ledger_id,
                                           lac=ledger.lac, last_entry_id=ledger.last_entry_id,
                                           lafr=ledger.lafr), durable)

    def _polls_unknown_ledger(self, request: ReadRequest | ReadLacRequest) -> bool:
        """_polls_unknown_ledger: a long poll of a ledger this bookie holds nothing of yet (a new writer's,
        with no entry here so far) waits like any other: answered by its first confirmed entries, or at its
        timeout with NO_SUCH_LEDGER. Answering at once would make a follower poll in a loop."""
        return (not request.fence and request.previous_lac != NO_LONG_POLL and request.timeout_ms > 0
                and self._ledger(request.ledger_id) is None)

    @staticmethod
    def _should_wait(request: ReadRequest | ReadLacRequest, ledger: _Ledger) -> bool:
        return (request.previous_lac != NO_LONG_POLL and request.timeout_ms > 0
                and ledger.lac <= request.previous_lac)

    def _park(self, peer: bytes, request: ReadRequest | ReadLacRequest) -> list:
        """_park holds a long poll until the LAC passes its previous_lac or its (capped) timeout."""
        limits = self.limits
        if self._poll_count >= limits.max_long_polls:
            return [Reply(peer, error_response(request, Status.TOO_MANY_REQUESTS,
                                               f"{self._poll_count} long polls are waiting already "
                                               f"(limit {limits.max_long_polls})"), False)]
        timeout = min(request.timeout_ms, limits.max_long_poll_ms)
        self._polls.setdefault(request.ledger_id, []).append(_Poll(peer, request, self._now + timeout))
        self._poll_count += 1
        return []

    def _take_polls(self, ledger_id: int, keep: list[_Poll], answer: list[_Poll],
                    fresh: dict[int, Entry] | None = None) -> list:
        """_take_polls keeps `keep` waiting on a ledger and answers `answer` now."""
        if keep:
            self._polls[ledger_id] = keep
        else:
            self._polls.pop(ledger_id, None)
        self._poll_count -= len(answer)
        return [self._answer_poll(p, fresh) for p in answer]

    def _answer_poll(self, poll: _Poll, fresh: dict[int, Entry] | None = None) -> Reply:
        ledger = self._ledger(poll.request.ledger_id)
        if ledger is None:       # deleted while waiting
            kind = ReadResponse if isinstance(poll.request, ReadRequest) else ReadLacResponse
            return Reply(poll.peer, kind(txn=poll.request.txn, status=Status.NO_SUCH_LEDGER,
                                         ledger_id=poll.request.ledger_id), False)
        if isinstance(poll.request, ReadRequest):
            return self._read_reply(poll.peer, poll.request, ledger, durable=True, fresh=fresh)
        return self._lac_reply(poll.peer, poll.request, ledger, durable=True)

    def _wake(self, ledger_id: int, ledger: _Ledger, fresh: list[Entry] | None = None) -> list:
        polls = self._polls.get(ledger_id)
        if not polls:
            return []
        ready = [p for p in polls if ledger.lac > p.request.previous_lac]
        if not ready:
            return []
        rest = [p for p in polls if ledger.lac <= p.request.previous_lac]
        return self._take_polls(ledger_id, rest, ready, {e.entry_id: e for e in fresh} if fresh else None)


def _stale_term(ledger_id: int, ledger: _Ledger | None, term: int) -> str | None:
    """_stale_term says why a request from `term` is refused with INVALID_TERM, or None.

    A term-less request (0) is stale on a ledger that has a term, so a client that does not
    know the ledger is unbounded cannot write or fence it.
    """
    held = ledger.state.term if ledger is not None else 0
    if term >= held:
        return None
    return f"ledger {ledger_id} is in term {held} on this bookie; this request is from term {term}"


_RESPONSE_OF = {AddRequest: AddResponse, ReadRequest: ReadResponse, ReadLacRequest: ReadLacResponse,
                WriteLacRequest: WriteLacResponse, ForceRequest: ForceResponse}


def error_response(request, status: Status, message: str):
    """error_response is the response of the request's own kind that refuses it with `status`."""
    kind = _RESPONSE_OF[type(request)]
    if kind is AddResponse:
        return AddResponse(txn=request.txn, status=status, ledger_id=request.ledger_id,
                           entry_ids=[e.entry_id for e in request.entries], message=message)
    return kind(txn=request.txn, status=status, ledger_id=request.ledger_id, message=message)
