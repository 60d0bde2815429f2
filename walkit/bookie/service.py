"""walkit.bookie.service runs the bookie protocol over an EntryStorage, without any sockets.

`BookieService` is fed frames with `receive(peer, frame)`; it decodes them, lets the sans-IO
`BookieHandler` decide, applies the handler's store commands to storage, and queues replies.
`flush()` then calls `storage.sync()` once if anything changed -- the group commit: one sync
covers every request received since the previous flush -- and returns the encoded replies, one
frame per peer, or several when one would pass the frame limit a client takes (BP-62: no frame
a bookie sends is over `reply_frame_bytes`, so no client drops one for its size; each read
answer fits one frame on its own, see BookieLimits.max_read_bytes). Once the read answers of a
round hold `read_bytes_per_round` bytes, the requests after them wait, in order, for the next
rounds, so a frame of many large reads costs a bounded amount of memory at a time. A reply is
never returned before the sync that covers it (docs/internals/protocol.md#sync-before-ack); if the
sync fails, the replies that needed it become IO_ERROR instead. Entries of deferred-sync adds
alone do not make a flush sync: their replies go out at once, and they become durable with the
next sync another request needs (a force, say), or after DEFERRED_SYNC_MS at the latest.

Nothing a peer sends can stop the service: a frame above `max_frame` bytes or holding more than
`max_requests` requests is refused whole; a request the handler refuses gets its error; and an
exception while storing one request's changes fails that request alone (IO_ERROR), after which
the handler re-reads the ledger from storage. A storage that reports `LedgerStorageError` from
`sync()` failed some ledgers only: their replies become IO_ERROR and every other reply goes out.

Secured bookies pass an `access` (walkit.bookie.access.LedgerAccess) and the principal of each
frame: a request the principal may not make gets UNAUTHORIZED, one for a ledger nobody created
NO_SUCH_LEDGER; a request for a ledger not looked up yet waits (in order, per ledger) until
`resume()` finds the lookup done.

Both the ZeroMQ server (`walkit.bookie.server`) and the in-memory transport use this class.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import replace
from operator import itemgetter

from walkit.core.bookie import (
    ENTRY_WIRE_BYTES, MAX_ID, BookieHandler, BookieLimits, Reply, StoreEntries, StoreLedgerState, error_response,
)
from walkit.core.messages import (
    AddRequest, AddResponse, ErrorResponse, ForceRequest, ReadLacResponse, ReadResponse, Status, WriteLacRequest,
)
from walkit.errors import LedgerStorageError, StorageError
from walkit.wire.codec import (
    DEFAULT_MAX_FRAME, DEFAULT_MAX_REQUESTS, FrameTooBusy, WireError, decode_requests, encode_responses,
)

log = logging.getLogger("walkit.bookie")

#: Requests a secured bookie holds while it looks ledgers up; one more gets TOO_MANY_REQUESTS.
MAX_PARKED = 10_000
#: Requests held for a later round once a round's read answers are full; one more gets TOO_MANY_REQUESTS.
MAX_HELD = 10_000
#: The longest entries of deferred-sync adds stay unsynced when no other request needs a sync.
DEFERRED_SYNC_MS = 1000
#: Room a reply frame keeps besides what its responses are estimated to take (_encoded_bytes).
FRAME_ROOM = 64 * 1024
#: What an encoded response costs besides its entries and its message, at most.
_RESPONSE_BYTES = 256
_DIGEST, _PAYLOAD = itemgetter(3), itemgetter(4)        # fields of walkit.core.messages.Entry


def _merged(first: LedgerStorageError | None, second: LedgerStorageError) -> LedgerStorageError:
    """_merged is one LedgerStorageError naming the ledgers of both (`first` may be None)."""
    if first is None:
        return second
    return LedgerStorageError(f"{first}; {second}", set(first.ledgers) | set(second.ledgers))


def _needed(request) -> str:
    """_needed is the permission a request needs: read, or write for anything that changes a ledger."""
    kind = type(request)
    if kind is AddRequest or kind is WriteLacRequest or kind is ForceRequest or request.fence:
        return "write"
    return "read"


class BookieService:
    """BookieService is one bookie's request processing and group commit over `storage`.

    `max_frame` and `max_requests` bound one frame; `max_long_poll_ms` and `max_long_polls`
    bound long polls (see walkit.core.bookie.BookieLimits). The highest entry id accepted is
    the storage's `max_entry_id` if it declares one. `disk` is the storage's identity
    (walkit.bookie.identity), sent with every answer so clients can tell a replaced disk.
    """

    def __init__(self, storage, *, max_frame: int = DEFAULT_MAX_FRAME, max_requests: int = DEFAULT_MAX_REQUESTS,
                 max_long_poll_ms: int = 60_000, max_long_polls: int = 10_000, read_only: bool = False,
                 access=None, disk: int = 0) -> None:
        self.storage = storage
        self.disk = disk
        self._put_many = getattr(storage, "put_many", None)     # optional in the SPI: one call per add batch
        self.access = access
        self._parked: dict[int, list] = {}
        self._parked_count = 0
        self.max_frame = max_frame
        self.max_requests = max_requests
        #: No reply frame is larger: what a client takes (DEFAULT_MAX_FRAME), or less if this
        #: bookie takes smaller frames itself.
        self.reply_frame_bytes = min(max_frame, DEFAULT_MAX_FRAME)
        limits = BookieLimits(max_entry_id=getattr(storage, "max_entry_id", MAX_ID),
                              max_long_poll_ms=max_long_poll_ms, max_long_polls=max_long_polls,
                              max_read_bytes=max(1, self.reply_frame_bytes - FRAME_ROOM))
        self.handler = BookieHandler(storage, read_only=read_only, limits=limits, instance=secrets.randbits(63) | 1)
        self._replies: list[Reply] = []
        #: Bytes of entries the read answers of one round (from one flush to the next) hold at
        #: most, besides the answer that passes it: later requests wait in `_held`, in order,
        #: for the rounds after (one frame of many reads must not make a bookie build them all).
        self.read_bytes_per_round = self.reply_frame_bytes
        self._read_bytes = 0
        self._held: deque = deque()     # (peer, principal, request, arrival) waiting for a later round
        self._dirty = False             # storage changed since the last sync
        self._must_sync = False         # ... by something other than deferred-sync entries
        self._now_ms = 0
        self._synced_ms = 0
        self.unsynced_entries = 0       # entries stored since the last sync (group commit size)
        self.entries_stored = 0
        self.syncs = 0
        # Counters read by walkit.metrics when Prometheus scrapes (never reset).
        self.bytes_stored = 0           # bytes handed to storage.put (entries with their headers)
        self.add_replies = 0            # add requests answered (any status)
        self.read_replies = 0           # read and LAC read requests answered (any status)
        self.entries_read = 0           # entries returned by reads
        self.failed: Exception | None = None    # set when storage.sync() raised StorageError
        #: adds received per ledger: garbage collection deletes an unclosed ledger only if none
        #: arrived since it looked at the ledger's metadata (see BookieServer's garbage collection)
        self.writes: dict[int, int] = {}

    @property
    def read_only(self) -> bool:
        """read_only is True while the bookie refuses ordinary adds."""
        return self.handler.read_only

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self.handler.read_only = value

    @property
    def has_pending(self) -> bool:
        """has_pending is True when replies wait for a flush, or requests for a later round."""
        return bool(self._replies or self._held)

    def receive(self, peer: bytes, frame: bytes, principal: str | None = None) -> None:
        """receive handles one frame from `peer` (authenticated as `principal`); replies wait for `flush`."""
        try:
            requests = decode_requests(frame, self.max_frame, self.max_requests)
        except WireError as exc:
            log.warning("bad frame from peer %s: %s", peer.hex(), exc)
            status = Status.TOO_MANY_REQUESTS if isinstance(exc, FrameTooBusy) else Status.BAD_REQUEST
            self._replies.append(Reply(peer, ErrorResponse(txn=0, status=status, message=str(exc)), False))
            return
        arrived = time.monotonic() if self.access is not None else 0.0
        for request in requests:
            if isinstance(request, ErrorResponse):
                self._replies.append(Reply(peer, request, False))
                continue
            if type(request) is AddRequest:
                self.writes[request.ledger_id] = self.writes.get(request.ledger_id, 0) + 1
            if self._held or self._read_bytes >= self.read_bytes_per_round:
                if len(self._held) >= MAX_HELD:
                    self._refuse(peer, request, Status.TOO_MANY_REQUESTS,
                                 f"{len(self._held)} requests wait for a later round already")
                else:
                    self._held.append((peer, principal, request, arrived))
                continue
            self._handle(peer, principal, request, arrived)

    def _handle(self, peer: bytes, principal: str | None, request, arrived: float) -> None:
        """_handle runs one decoded request (on a secured bookie, once its rights are known)."""
        if self.access is None:
            self._step(peer, request)
            return
        try:
            self._checked(peer, principal, request, arrived)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the bookie
            log.exception("checking request %s on ledger %d failed", type(request).__name__, request.ledger_id)
            self._refuse(peer, request, Status.IO_ERROR, f"internal error: {exc}")

    def _checked(self, peer: bytes, principal: str | None, request, arrived: float) -> None:
        """_checked runs a request on a secured bookie once the principal's rights on its ledger are known."""
        ledger_id = request.ledger_id
        parked = self._parked.get(ledger_id)
        verdict = None if parked else self.access.decide(principal, ledger_id, _needed(request), arrived)
        if verdict is None:
            if self._parked_count >= MAX_PARKED:
                self._refuse(peer, request, Status.TOO_MANY_REQUESTS, "too many requests wait for ledger lookups")
                return
            self._parked.setdefault(ledger_id, []).append((peer, principal, request, arrived))
            self._parked_count += 1
        elif verdict == "allow":
            self._step(peer, request)
        elif verdict == "no-ledger":
            self._refuse(peer, request, Status.NO_SUCH_LEDGER, f"ledger {ledger_id} does not exist")
        elif verdict == "unreadable":
            self._refuse(peer, request, Status.IO_ERROR, f"cannot read who may use ledger {ledger_id}: "
                                                         f"{self.access.why_unreadable(ledger_id)}")
        else:
            self._refuse(peer, request, Status.UNAUTHORIZED,
                         f"this client may not {_needed(request)} ledger {ledger_id}")

    def _refuse(self, peer: bytes, request, status: Status, message: str) -> None:
        self._replies.append(Reply(peer, error_response(request, status, message), False))

    def resume(self) -> None:
        """resume runs the parked requests of the ledgers whose lookups finished (secured bookies)."""
        if self.access is None:
            return
        for ledger_id in self.access.resolved():
            parked = self._parked.pop(ledger_id, None)
            if not parked:
                continue
            self._parked_count -= len(parked)
            for index, (peer, principal, request, arrived) in enumerate(parked):
                if ledger_id in self._parked:       # looked up again meanwhile: keep the rest in order
                    self._parked[ledger_id] += parked[index:]
                    self._parked_count += len(parked) - index
                    break
                self._checked(peer, principal, request, arrived)

    def _step(self, peer: bytes, request) -> None:
        """_step lets the handler decide and stores what it says; a failure fails this request alone.

        A storage that syncs by itself inside `put` (a full write buffer) may report ledgers it
        could not store: those fail as at a flush (LedgerStorageError), and this request too.
        """
        try:
            self._apply(self.handler.step(peer, request))
        except LedgerStorageError as exc:
            log.error("storage sync failed for ledgers %s: %s", sorted(exc.ledgers), exc)
            txn = request.txn                     # this request fails: drop the answer its step queued
            self._replies = [r for r in self._replies if r.peer != peer or getattr(r.response, "txn", None) != txn]
            self._replies = self._ledgers_failed(self._replies, exc)
            self._replies.append(Reply(peer, error_response(request, Status.IO_ERROR, f"storage failed: {exc}"),
                                       False))
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the bookie
            log.exception("request %s on ledger %d failed", type(request).__name__, request.ledger_id)
            # The handler may have noted changes that never reached storage: it re-reads the ledger.
            self._apply(self.handler.forget(request.ledger_id))
            self._replies.append(Reply(peer, error_response(request, Status.IO_ERROR,
                                                            f"internal error: {exc}"), False))

    def peer_gone(self, peer: bytes) -> None:
        """peer_gone tells the service a client's connection closed (its long polls are answered)."""
        self._apply(self.handler.peer_gone(peer))

    def tick(self, now_ms: int) -> None:
        """tick passes time to the handler (long-poll timeouts) and to the deferred-sync deadline."""
        self._now_ms = now_ms
        self._apply(self.handler.tick(now_ms))

    def _apply(self, commands: list) -> None:
        """_apply stores what the handler decided and queues its replies.

        A put that synced by itself and failed other ledgers (LedgerStorageError) stored its
        own entries: the step's later commands (a truncation's tombstones and mark, say) are
        applied all the same, so storage matches the handler's view, and the error is raised
        once they are.
        """
        storage = self.storage
        failed: LedgerStorageError | None = None
        for command in commands:
            kind = type(command)
            if kind is Reply:
                self._replies.append(command)
                response = command.response
                if type(response) is ReadResponse and response.entries:
                    self._read_bytes += sum(map(len, map(_PAYLOAD, response.entries)))
            elif kind is StoreEntries:
                ledger_id = command.ledger_id
                self._dirty = True
                if self._put_many is not None:
                    try:
                        self._put_many(ledger_id, command.entries)
                    except LedgerStorageError as exc:
                        failed = _merged(failed, exc)
                else:
                    for entry_id, data in command.entries:
                        try:
                            storage.put(ledger_id, entry_id, data)
                        except LedgerStorageError as exc:
                            failed = _merged(failed, exc)
                self.bytes_stored += sum(len(data) for _, data in command.entries)
                self.entries_stored += len(command.entries)
                if not command.deferred:
                    self._must_sync = True
                    self.unsynced_entries += len(command.entries)
            elif kind is StoreLedgerState:
                self._dirty = self._must_sync = True
                storage.set_ledger_state(command.ledger_id, command.state)
            else:
                raise TypeError(f"unknown bookie command {command!r}")
        if failed is not None:
            raise failed

    def flush(self) -> list[tuple[bytes, bytes]]:
        """flush syncs storage if needed and returns (peer, frame) replies to send, in order.

        It then starts the next round: requests held back by a full round run now, and their
        replies go with the next flush.
        """
        if not self._replies and not self._dirty:
            self._next_round()
            return []
        replies, self._replies = self._replies, []
        if self._dirty and (self._must_sync or any(r.durable for r in replies)
                            or self._now_ms - self._synced_ms >= DEFERRED_SYNC_MS):
            self._dirty = self._must_sync = False
            self._synced_ms = self._now_ms
            self.unsynced_entries = 0
            try:
                self.storage.sync()
                self.syncs += 1
            except LedgerStorageError as exc:   # some ledgers failed; the rest is durable
                log.error("storage sync failed for ledgers %s: %s", sorted(exc.ledgers), exc)
                self.syncs += 1
                replies = self._ledgers_failed(replies, exc)
            except Exception as exc:  # noqa: BLE001 - never acknowledge what did not sync
                log.error("storage sync failed: %s", exc)
                if isinstance(exc, StorageError):
                    self.failed = exc
                replies = [r if not r.durable else Reply(r.peer, _as_io_error(r.response, exc), False)
                           for r in replies]
        by_peer: dict[bytes, list] = {}
        for reply in replies:
            by_peer.setdefault(reply.peer, []).append(reply.response)
            kind = type(reply.response)
            if kind is AddResponse:
                self.add_replies += 1
            elif kind is ReadResponse:
                self.read_replies += 1
                self.entries_read += len(reply.response.entries)
            elif kind is ReadLacResponse:
                self.read_replies += 1
        frames: list[tuple[bytes, bytes]] = []
        for peer, responses in by_peer.items():
            frames += [(peer, frame) for frame in self._frames(responses)]
        self._next_round()
        return frames

    def _next_round(self) -> None:
        """_next_round runs requests held back by a full round, until this round's read answers are full."""
        self._read_bytes = 0
        while self._held and self._read_bytes < self.read_bytes_per_round:
            self._handle(*self._held.popleft())

    def _frames(self, responses: list) -> list[bytes]:
        """_frames encodes one peer's responses, in order, in as few frames of at most `reply_frame_bytes` as it can.

        Responses are grouped by their estimated size (an upper bound); a group whose frame
        still came out too large is encoded again in halves. A single response larger than a
        frame (which BookieLimits.max_read_bytes prevents) goes alone in its frame.
        """
        limit, disk = self.reply_frame_bytes - FRAME_ROOM, self.disk
        groups: list[list] = [[]]
        size = 0
        for response in responses:
            cost = _encoded_bytes(response)
            if groups[-1] and size + cost > limit:
                groups.append([])
                size = 0
            groups[-1].append(response)
            size += cost
        frames: list[bytes] = []
        while groups:
            group = groups.pop(0)
            frame = encode_responses(group, disk)
            if len(frame) > self.reply_frame_bytes and len(group) > 1:
                half = len(group) // 2
                groups[:0] = [group[:half], group[half:]]
                continue
            frames.append(frame)
        return frames

    def _ledgers_failed(self, replies: list[Reply], exc: LedgerStorageError) -> list[Reply]:
        """_ledgers_failed handles a sync that lost the changes of `exc.ledgers` (the rest is durable).

        Their durable replies in `replies` become IO_ERROR, the handler re-reads them, and the
        handler takes a new instance: deferred-sync entries of those ledgers were acknowledged
        earlier without a sync and are gone now, and a new instance in later answers tells
        their writers so (as a restart would).
        """
        self.handler.instance = secrets.randbits(63) | 1
        replies = [Reply(r.peer, _as_io_error(r.response, exc), False)
                   if r.durable and getattr(r.response, "ledger_id", None) in exc.ledgers else r
                   for r in replies]
        for ledger_id in exc.ledgers:
            replies += self.handler.forget(ledger_id)
        return replies

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger drops a ledger's data (garbage collection of deleted ledgers)."""
        self.storage.delete_ledger(ledger_id)
        self.writes.pop(ledger_id, None)
        self._dirty = self._must_sync = True
        self._apply(self.handler.forget(ledger_id))
        if self.access is not None:
            self.access.forget(ledger_id)


def _encoded_bytes(response) -> int:
    """_encoded_bytes is at least the size a response takes in a frame (an estimate from above)."""
    cost = _RESPONSE_BYTES + 4 * len(response.message)        # UTF-8: at most 4 bytes a character
    kind = type(response)
    if kind is ReadResponse:
        entries = response.entries
        return (cost + ENTRY_WIRE_BYTES * len(entries) + sum(map(len, map(_DIGEST, entries)))
                + sum(map(len, map(_PAYLOAD, entries))))
    if kind is AddResponse:
        return cost + 8 * len(response.entry_ids)
    return cost


def _as_io_error(response, exc: Exception):
    """_as_io_error turns a reply that needed a failed sync into an IO_ERROR reply (no entries)."""
    fields = {"status": Status.IO_ERROR, "message": f"storage sync failed: {exc}"}
    if isinstance(response, ReadResponse):
        fields["entries"] = []
    return replace(response, **fields)
