"""walkit.core.dispatch turns machine commands into I/O, and I/O results into machine events.

Every shell (the threaded client loop, the simulator, the scripted cluster) drives machines the
same way, as etcd raft's applications drive `Ready`:

    outcomes = dispatcher.execute(owner, owner.machine.step(event), now_ms)
    for bookie, requests in dispatcher.take_requests().items(): send them (one frame per bookie)
    for call in dispatcher.take_calls(): run call.method(*call.args) on the metadata store,
        then dispatcher.store_result(call.call_id, value, error) -> [(owner, event), ...]
    for owner, event in dispatcher.on_response(bookie, response): feed the event to the owner

Commands for bookies (SendAdds, SendRead, SendReadLac, SendWriteLac, SendForce) become requests with a
transaction id, every field included; each request ends exactly once for its machine: with the
bookie's answer, or with status UNREACHABLE when the bookie is down, the send failed or no
answer came within `request_timeout_ms` (plus a long poll's own timeout).

Adds are bounded by bytes: a SendAdds whose entries would not fit one frame (ADD_BUDGET) goes
as several requests, each answered by an event of its own; the shell packs requests into frames
(walkit.client.loop.frames_of). Reads are bounded by count and by bytes (BP-62): a SendRead of
more than MAX_READ_IDS ids goes as several requests (each answered by an event of its own), and every ReadRequest carries
`max_read_bytes`. An answer that stopped there lists the ids it did not look at as
EntriesRead.unread, never as `missing`; one that looked at nothing it could answer (no entry,
no absent id) is a broken answer and ends as ReadFailed (IO_ERROR).

Metadata commands become calls on the metadata store (get, put, create, delete, next_id, and
`live_bookies`, which lists registered writable bookies in random order, or in placement order
when its arguments describe the ensemble to fill: ("create", E, Qw) or ("replace", ensemble,
replaced bookies, Qw); its answer may be a `Bookies` list that also names each bookie's disk,
which a new ledger's metadata records). A call whose outcome
is unknown (MetadataError: a timeout, a lost answer, a lost session) is never reported as a
failure: the key is read again and the machine is told what the store holds, a write that
took effect as MetadataWritten and one that did not as MetadataConflict
(docs/internals/protocol.md#unknown-outcomes). Reads that fail are retried every RETRY_MS until they succeed.

Commands the dispatcher does not know (CompleteAdds, DeliverEntries, ...) are returned to the
shell as the owner's outcomes.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace
from typing import Callable

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.loglist import LogMetadata, log_key
from walkit.core.messages import (
    DEFAULT_MAX_READ_BYTES, FRAME_BUDGET, MAX_READ_IDS, REQUEST_OVERHEAD, AddRequest, ErrorResponse, ForceRequest, ReadLacRequest,
    ReadRequest, Status, WriteLacRequest, entries_size, split_answer,
)
from walkit.core.metadata import LEDGER_ID_COUNTER, LedgerMetadata, deleted_key, deletion_marker, ledger_key
from walkit.errors import BadVersion, MetadataNotAuthorized, NodeExists, NoSuchKey, NoSuchLedger, NotEnoughBookies

#: The entries one AddRequest may carry (by entries_size): with the request's own fields it fits
#: one frame. A writer's adds to one bookie above it go as several requests.
ADD_BUDGET = FRAME_BUDGET - REQUEST_OVERHEAD
#: How long a failed metadata read waits before it is tried again.
RETRY_MS = 100


@dataclass(frozen=True, slots=True)
class StoreCall:
    """StoreCall asks the shell to run `method(*args)` on the metadata store.

    Methods: get(key), put(key, value, expected_version), create(key, value), delete(key),
    next_id(counter), live_bookies() -> writable bookie addresses in random order. The shell
    answers with Dispatcher.store_result(call_id, value) or (call_id, error=exception).
    """

    call_id: int
    method: str
    args: tuple = ()


class Bookies(list):
    """Bookies is a `live_bookies` answer: addresses in order, and `disks`, each one's registered disk.

    A shell may answer with a plain list of addresses instead (no disk known: 0 for each).
    """

    def __init__(self, addresses=(), disks: dict[str, int] | None = None) -> None:
        super().__init__(addresses)
        self.disks = disks or {}


def disks_of(bookies) -> dict[str, int]:
    """disks_of is the {address: disk} a `live_bookies` answer carries ({} for a plain list)."""
    return getattr(bookies, "disks", {})


_BOOKIE_COMMANDS = (ev.SendAdds, ev.SendRead, ev.SendReadLac, ev.SendWriteLac, ev.SendForce)


class Dispatcher:
    """Dispatcher tracks the requests and metadata calls of every machine a shell drives.

    `max_read_bytes` is the ReadRequest.max_bytes of every read it sends: the most bytes of
    entries one answer holds (a bookie returns at least one entry, however large).
    """

    def __init__(self, request_timeout_ms: int = 10_000, max_read_bytes: int = DEFAULT_MAX_READ_BYTES) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.max_read_bytes = max_read_bytes
        self._txns = itertools.count(1)
        self._calls = itertools.count(1)
        self._inflight: dict[int, tuple[object, str, object]] = {}    # txn -> (owner, bookie, request)
        self._by_bookie: dict[str, set[int]] = {}
        self._deadlines: list[tuple[int, int]] = []                    # heap of (deadline ms, txn)
        self._outgoing: dict[str, list] = {}
        self._pending_calls: list[StoreCall] = []
        self._continuations: dict[int, tuple[object, Callable]] = {}  # call id -> (owner, on_result)
        self._retries: list[tuple[int, int, Callable[[], None]]] = []   # heap of (due ms, seq, start)
        self._retry_seq = itertools.count()
        self.reconnect: set[str] = set()       # bookies registered again: the shell reconnects now
        self.now_ms = 0
        self.wall_ms = 0
        self._handlers = {
            ev.WriteMetadata: self._write_metadata, ev.ChooseBookies: self._choose_bookies,
            ev.ReadLedgerMetadata: self._read_ledger_metadata, ev.CreateLedger: self._create_ledger,
            ev.DeleteLedger: self._delete_ledger, lev.ReadLogMetadata: self._read_log_metadata,
            lev.CreateLogMetadata: self._create_log_metadata, lev.WriteLogMetadata: self._write_log_metadata,
        }

    # -- commands in ---------------------------------------------------------------------------
    def execute(self, owner, commands: list, now_ms: int | None = None) -> list:
        """execute queues the I/O of `owner`'s commands and returns the rest (its outcomes)."""
        if now_ms is not None:
            self.now_ms = now_ms
        outcomes: list = []
        for command in commands:
            kind = type(command)
            if kind in _BOOKIE_COMMANDS:
                self._send(owner, command)
            else:
                handler = self._handlers.get(kind)
                if handler is None:
                    outcomes.append(command)
                else:
                    handler(owner, command)
        return outcomes

    def take_requests(self) -> dict[str, list]:
        """take_requests returns the requests to send, per bookie, in order, and forgets them."""
        outgoing, self._outgoing = self._outgoing, {}
        return outgoing

    def take_calls(self) -> list[StoreCall]:
        """take_calls returns the metadata calls to run and forgets them."""
        calls, self._pending_calls = self._pending_calls, []
        return calls

    @property
    def idle(self) -> bool:
        """idle is True when nothing is in flight or waiting to be sent."""
        return not (self._inflight or self._outgoing or self._pending_calls or self._continuations or self._retries)

    # -- bookie requests -----------------------------------------------------------------------
    def _send(self, owner, command) -> None:
        kind = type(command)
        if kind is ev.SendRead and len(command.entry_ids) > MAX_READ_IDS:   # bookies refuse more per request
            ids = command.entry_ids
            for start in range(0, len(ids), MAX_READ_IDS):
                self._send(owner, replace(command, entry_ids=ids[start:start + MAX_READ_IDS]))
            return
        if kind is ev.SendAdds and len(command.entries) > 1 and entries_size(command.entries) > ADD_BUDGET:
            for entries in _split_by_bytes(command.entries, ADD_BUDGET):     # one request must fit a frame
                self._send(owner, replace(command, entries=entries))
            return
        txn = next(self._txns)
        if kind is ev.SendAdds:
            request = AddRequest(txn=txn, ledger_id=command.ledger_id, master_key=command.master_key,
                                 entries=command.entries, recovery=command.recovery, lafr=command.lafr,
                                 term=command.term, truncate=command.truncate, deferred_sync=command.deferred_sync,
                                 truncate_from=command.truncate_from)
            timeout = 0
        elif kind is ev.SendRead:
            request = ReadRequest(txn=txn, ledger_id=command.ledger_id, entry_ids=command.entry_ids,
                                  fence=command.fence, master_key=command.master_key, term=command.term,
                                  max_bytes=self.max_read_bytes, previous_lac=command.previous_lac,
                                  timeout_ms=command.timeout_ms)
            timeout = command.timeout_ms
        elif kind is ev.SendReadLac:
            request = ReadLacRequest(txn=txn, ledger_id=command.ledger_id, fence=command.fence,
                                     master_key=command.master_key, previous_lac=command.previous_lac,
                                     timeout_ms=command.timeout_ms, term=command.term)
            timeout = command.timeout_ms
        elif kind is ev.SendForce:
            request = ForceRequest(txn=txn, ledger_id=command.ledger_id, master_key=command.master_key)
            timeout = 0
        else:
            request = WriteLacRequest(txn=txn, ledger_id=command.ledger_id, master_key=command.master_key,
                                      lac=command.lac)
            timeout = 0
        bookie = command.bookie
        self._inflight[txn] = (owner, bookie, request)
        by_bookie = self._by_bookie.get(bookie)
        if by_bookie is None:
            self._by_bookie[bookie] = {txn}
        else:
            by_bookie.add(txn)
        heapq.heappush(self._deadlines, (self.now_ms + self.request_timeout_ms + timeout, txn))
        outgoing = self._outgoing.get(bookie)
        if outgoing is None:
            self._outgoing[bookie] = [request]
        else:
            outgoing.append(request)

    def on_response(self, bookie: str, response) -> list[tuple[object, object]]:
        """on_response turns a bookie's answer into an event for the machine that asked."""
        found = self._inflight.pop(response.txn, None)
        if found is None or found[1] != bookie:
            if found is not None:               # a txn answered by the wrong bookie: keep waiting
                self._inflight[response.txn] = found
            return []                           # late answer to a request that already ended
        owner, _, request = found
        self._by_bookie[bookie].discard(response.txn)
        event = response_event(bookie, request, response)
        return [] if event is None else [(owner, event)]

    def unreachable(self, bookie: str, requests: list, why: str,
                    status: Status = Status.UNREACHABLE) -> list[tuple[object, object]]:
        """unreachable ends `requests` (that could not be sent to `bookie`) with `status`."""
        out: list = []
        for request in requests:
            out += self._end(request.txn, why, status)
        return out

    def bookie_down(self, bookie: str, why: str, status: Status = Status.UNREACHABLE) -> list[tuple[object, object]]:
        """bookie_down ends every request in flight to `bookie` with UNREACHABLE (or `status`)."""
        out: list = []
        for txn in list(self._by_bookie.get(bookie, ())):
            out += self._end(txn, why, status)
        return out

    def _end(self, txn: int, why: str, status: Status = Status.UNREACHABLE) -> list[tuple[object, object]]:
        found = self._inflight.pop(txn, None)
        if found is None:
            return []
        owner, bookie, request = found
        self._by_bookie[bookie].discard(txn)
        event = failure_event(bookie, request, status, why)
        return [] if event is None else [(owner, event)]

    # -- time ----------------------------------------------------------------------------------
    def tick(self, now_ms: int, wall_ms: int = 0) -> list[tuple[object, object]]:
        """tick ends requests past their deadline and retries metadata reads that are due."""
        self.now_ms, self.wall_ms = now_ms, wall_ms
        out: list = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            _, txn = heapq.heappop(deadlines)
            if txn in self._inflight:
                out += self._end(txn, "no answer in time")
        retries = self._retries
        while retries and retries[0][0] <= now_ms:
            heapq.heappop(retries)[2]()
        return out

    def _retry(self, start: Callable[[], None]) -> None:
        heapq.heappush(self._retries, (self.now_ms + RETRY_MS, next(self._retry_seq), start))

    # -- metadata calls ------------------------------------------------------------------------
    def _call(self, owner, method: str, args: tuple, on_result: Callable) -> None:
        """_call queues a store call; `on_result(value, error)` returns the events it produces."""
        call = StoreCall(next(self._calls), method, args)
        self._continuations[call.call_id] = (owner, on_result)
        self._pending_calls.append(call)

    def store_result(self, call_id: int, value=None, error: Exception | None = None) -> list[tuple[object, object]]:
        """store_result hands the outcome of a StoreCall back; it returns events for machines."""
        found = self._continuations.pop(call_id, None)
        if found is None:
            return []
        owner, on_result = found
        events = on_result(value, error)
        return [(owner, event) for event in events or ()]

    def _reread(self, owner, key: str, on_value: Callable) -> None:
        """_reread reads `key` until it succeeds; `on_value(value, version)` ((None, -1) if absent)."""
        def on_result(result, error):
            if isinstance(error, NoSuchKey):
                return on_value(None, -1)
            if error is not None:
                self._retry(lambda: self._reread(owner, key, on_value))
                return []
            return on_value(*result)
        self._call(owner, "get", (key,), on_result)

    def _cas(self, owner, key: str, data: bytes, expected: int, written: Callable, conflict: Callable,
             refused: Callable | None = None) -> None:
        """_cas puts `data` at `key` if its version is `expected`; an unknown outcome is re-read.

        `written(version)` and `conflict(value, version)` (value None: the key is gone) return events;
        `refused(error)` those of a store that refused the caller (MetadataNotAuthorized), if given.
        """
        def settle(value, version):
            return written(version) if value == data else conflict(value, version)

        def on_result(version, error):
            if error is None:
                return written(version)
            if isinstance(error, NoSuchKey):
                return conflict(None, -1)
            if refused is not None and isinstance(error, MetadataNotAuthorized):
                return refused(error)
            if isinstance(error, BadVersion):
                self._reread(owner, key, conflict)
            else:                                   # outcome unknown: see what the store holds
                self._reread(owner, key, settle)
            return []
        self._call(owner, "put", (key, data, expected), on_result)

    def _create(self, owner, key: str, data: bytes, created: Callable, exists: Callable,
                refused: Callable | None = None) -> None:
        """_create makes `key`; NodeExists or an unknown outcome is settled by reading it (`refused` as in _cas)."""
        def settle(value, version):
            if value is None:
                self._create(owner, key, data, created, exists, refused)     # not made: try again
                return []
            return created(version) if value == data else exists(value, version)

        def on_result(version, error):
            if error is None:
                return created(version)
            if isinstance(error, NodeExists):
                self._reread(owner, key, exists)
            elif refused is not None and isinstance(error, MetadataNotAuthorized):
                return refused(error)
            else:
                self._reread(owner, key, settle)
            return []
        self._call(owner, "create", (key, data), on_result)

    # -- ledger metadata -------------------------------------------------------------------------
    def _write_metadata(self, owner, command: ev.WriteMetadata) -> None:
        metadata = command.metadata
        ledger_id = metadata.ledger_id

        def conflict(value, version):
            if value is None:
                return [ev.MetadataFailed(ledger_id=ledger_id, error=NoSuchLedger(f"ledger {ledger_id} was deleted"))]
            return [ev.MetadataConflict(metadata=LedgerMetadata.from_bytes(value), version=version)]
        self._cas(owner, ledger_key(ledger_id), metadata.to_bytes(), command.expected_version,
                  lambda version: [ev.MetadataWritten(metadata=metadata, version=version)], conflict)

    def _read_ledger_metadata(self, owner, command: ev.ReadLedgerMetadata) -> None:
        def on_value(value, version):
            metadata = None if value is None else LedgerMetadata.from_bytes(value)
            return [ev.LedgerMetadataRead(ledger_id=command.ledger_id, metadata=metadata, version=version)]
        self._reread(owner, ledger_key(command.ledger_id), on_value)

    def _choose_bookies(self, owner, command: ev.ChooseBookies) -> None:
        def on_result(writable, error):
            disks = {} if error is not None else disks_of(writable)
            writable = [] if error is not None else list(writable)
            back = frozenset(b for b in command.recheck if b in writable)
            self.reconnect |= back
            candidates = [b for b in writable if b not in command.exclude]
            return [ev.BookiesChosen(ledger_id=command.ledger_id, bookies=candidates, back=back, disks=disks)]
        self._call(owner, "live_bookies", ("replace", command.ensemble, command.replacing, command.write_quorum),
                   on_result)

    def _create_ledger(self, owner, command: ev.CreateLedger) -> None:
        """_create_ledger picks bookies, draws an id and creates the metadata (one flow)."""
        def failed(error):
            return [ev.LedgerCreateFailed(token=command.token, error=error)]

        def with_bookies(writable, error):
            if error is not None:
                return failed(error)
            if len(writable) < command.ensemble:
                return failed(NotEnoughBookies(f"need {command.ensemble} writable bookies, "
                                               f"{len(writable)} available"))
            self._call(owner, "next_id", (LEDGER_ID_COUNTER,), lambda i, e: with_id(writable, i, e))
            return []
        placement = ("create", command.ensemble, command.write_quorum)

        def with_id(writable, ledger_id, error):
            if error is not None:       # no id: a counter value lost to an unknown outcome is only a gap
                self._retry(lambda: self._call(owner, "next_id", (LEDGER_ID_COUNTER,),
                                               lambda i, e: with_id(writable, i, e)))
                return []
            ensemble = tuple(writable[:command.ensemble])
            disks = disks_of(writable)
            metadata = LedgerMetadata(
                ledger_id=ledger_id, ensemble_size=command.ensemble, write_quorum=command.write_quorum,
                ack_quorum=command.ack_quorum, ensembles={0: ensemble},
                digest_type=command.digest, password_check=command.password_check, created_ms=self.wall_ms,
                custom=dict(command.custom), owner=command.owner).with_fragment(
                    0, ensemble, tuple(disks.get(b, 0) for b in ensemble))

            def exists(value, version):   # ids are unique, so this is a broken counter: draw again
                self._create_ledger(owner, command)
                return []
            self._create(owner, ledger_key(ledger_id), metadata.to_bytes(),
                         lambda version: [ev.LedgerCreated(token=command.token, metadata=metadata, version=version)],
                         exists)
            return []
        self._call(owner, "live_bookies", placement, with_bookies)

    def _delete_ledger(self, owner, command: ev.DeleteLedger) -> None:
        """_delete_ledger marks the ledger deleted, then deletes its metadata (walkit.deletions).

        Without the marker (an error other than "exists already") the metadata stays: bookies
        keep the data of a ledger whose deletion they cannot see, so nothing is lost either way.
        """
        ledger_id = command.ledger_id

        def marked(value, error):
            if error is None or isinstance(error, NodeExists):
                self._call(owner, "delete", (ledger_key(ledger_id),), lambda value, error: [])
            return []
        self._call(owner, "create", (deleted_key(ledger_id), deletion_marker(self.wall_ms)), marked)

    # -- log metadata ------------------------------------------------------------------------------
    def _read_log_metadata(self, owner, command: lev.ReadLogMetadata) -> None:
        self._reread(owner, log_key(command.name), lambda value, version: [lev.LogMetadataRead(
            name=command.name, metadata=None if value is None else LogMetadata.from_bytes(value), version=version)])

    def _log_conflict(self, name: str):
        return lambda value, version: [lev.LogMetadataConflict(
            name=name, metadata=None if value is None else LogMetadata.from_bytes(value), version=version)]

    def _log_refused(self, name: str):
        return lambda error: [lev.LogMetadataConflict(name=name, metadata=None, refused=error)]

    def _create_log_metadata(self, owner, command: lev.CreateLogMetadata) -> None:
        metadata = command.metadata
        self._create(owner, log_key(command.name), metadata.to_bytes(),
                     lambda version: [lev.LogMetadataWritten(name=command.name, metadata=metadata, version=version)],
                     self._log_conflict(command.name), self._log_refused(command.name))

    def _write_log_metadata(self, owner, command: lev.WriteLogMetadata) -> None:
        metadata = command.metadata
        self._cas(owner, log_key(command.name), metadata.to_bytes(), command.expected_version,
                  lambda version: [lev.LogMetadataWritten(name=command.name, metadata=metadata, version=version)],
                  self._log_conflict(command.name), self._log_refused(command.name))


def _split_by_bytes(entries: list, budget: int) -> list[list]:
    """_split_by_bytes cuts entries, in order, into runs of at most `budget` bytes by entries_size (at least one each)."""
    runs: list[list] = [[]]
    size = 0
    for entry in entries:
        cost = entries_size((entry,))
        if runs[-1] and size + cost > budget:
            runs.append([])
            size = 0
        runs[-1].append(entry)
        size += cost
    return runs


def response_event(bookie: str, request, response):
    """response_event turns a bookie's answer to `request` into a machine event (with the disk that answered)."""
    status = response.status
    if isinstance(response, ErrorResponse) or status != Status.OK:
        return failure_event(bookie, request, status, response.message, response.disk)
    kind = type(request)
    if kind is AddRequest:
        return ev.AddsAcked(bookie=bookie, ledger_id=request.ledger_id, entry_ids=response.entry_ids,
                            instance=response.instance, disk=response.disk)
    if kind is ReadRequest:
        missing, unread = split_answer(request, response)
        if unread and not missing and not response.entries:
            return failure_event(bookie, request, Status.IO_ERROR,
                                 f"bookie answered none of {len(request.entry_ids)} ids and looked at none "
                                 f"(it reported {response.unread} unread)", response.disk)
        return ev.EntriesRead(bookie=bookie, ledger_id=request.ledger_id, entries=response.entries,
                              missing=missing, lac=response.lac, disk=response.disk, unread=unread)
    if kind is ReadLacRequest:
        return ev.LacRead(bookie=bookie, ledger_id=request.ledger_id, status=status, lac=response.lac,
                          last_entry_id=response.last_entry_id, lafr=response.lafr, disk=response.disk)
    if kind is ForceRequest:
        return ev.ForceAcked(bookie=bookie, ledger_id=request.ledger_id, instance=response.instance)
    return ev.LacWritten(bookie=bookie, ledger_id=request.ledger_id, lac=request.lac)


def failure_event(bookie: str, request, status: Status, message: str, disk: int = 0):
    """failure_event is the event for a request that failed as a whole at `bookie` (`disk`: who answered, 0 if none)."""
    kind = type(request)
    if kind is AddRequest:
        return ev.AddsRejected(bookie=bookie, ledger_id=request.ledger_id,
                               entry_ids=[e.entry_id for e in request.entries], status=status, message=message,
                               disk=disk)
    if kind is ForceRequest:        # the writer treats it as the bookie failing
        return ev.AddsRejected(bookie=bookie, ledger_id=request.ledger_id, entry_ids=[], status=status,
                               message=message, disk=disk)
    if kind is ReadRequest:
        return ev.ReadFailed(bookie=bookie, ledger_id=request.ledger_id, entry_ids=request.entry_ids,
                             status=status, message=message, disk=disk)
    if kind is ReadLacRequest:
        return ev.LacRead(bookie=bookie, ledger_id=request.ledger_id, status=status, message=message, disk=disk)
    return None       # WriteLac: nothing waits for it
