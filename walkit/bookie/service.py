"""walkit.bookie.service runs the bookie protocol over an EntryStorage, without any sockets.

`BookieService` is fed frames with `receive(peer, frame)`; it decodes them, lets the sans-IO
`BookieHandler` decide, applies the handler's store commands to storage, and queues replies.
`flush()` then calls `storage.sync()` once if anything changed -- the group commit: one sync
covers every request received since the previous flush -- and returns the encoded replies, one
frame per peer. A reply is never returned before the sync that covers it (DESIGN.md §2); if the
sync fails, the replies that needed it become IO_ERROR instead.

Both the ZeroMQ server (`walkit.bookie.server`) and the in-memory transport use this class.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from walkit.core.bookie import BookieHandler, Reply, StoreEntries, StoreLedgerState
from walkit.core.messages import (
    AddRequest, AddResponse, ErrorResponse, ReadLacRequest, ReadLacResponse, ReadRequest, ReadResponse,
    Status, WriteLacRequest, WriteLacResponse,
)
from walkit.errors import StorageError
from walkit.wire.codec import DEFAULT_MAX_FRAME, WireError, decode_requests, encode_responses

log = logging.getLogger("walkit.bookie")

_ERROR_KIND = {AddRequest: AddResponse, ReadRequest: ReadResponse, ReadLacRequest: ReadLacResponse,
               WriteLacRequest: WriteLacResponse}


class BookieService:
    """BookieService is one bookie's request processing and group commit over `storage`."""

    def __init__(self, storage, *, max_frame: int = DEFAULT_MAX_FRAME, read_only: bool = False) -> None:
        self.storage = storage
        self.max_frame = max_frame
        self.handler = BookieHandler(storage, read_only=read_only)
        self._replies: list[Reply] = []
        self._dirty = False
        self.unsynced_entries = 0       # entries stored since the last sync (group commit size)
        self.entries_stored = 0
        self.syncs = 0
        self.failed: Exception | None = None    # set when storage.sync() raised StorageError

    @property
    def read_only(self) -> bool:
        """read_only is True while the bookie refuses ordinary adds."""
        return self.handler.read_only

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self.handler.read_only = value

    @property
    def has_pending(self) -> bool:
        """has_pending is True when replies wait for a flush."""
        return bool(self._replies)

    def receive(self, peer: bytes, frame: bytes) -> None:
        """receive handles one frame from `peer`; replies wait for `flush`."""
        try:
            requests = decode_requests(frame, self.max_frame)
        except WireError as exc:
            log.warning("bad frame from peer %s: %s", peer.hex(), exc)
            self._replies.append(Reply(peer, ErrorResponse(txn=0, status=Status.BAD_REQUEST, message=str(exc)),
                                       False))
            return
        for request in requests:
            if isinstance(request, ErrorResponse):
                self._replies.append(Reply(peer, request, False))
                continue
            try:
                commands = self.handler.step(peer, request)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the bookie
                log.exception("request %s failed", type(request).__name__)
                commands = [Reply(peer, _ERROR_KIND[type(request)](
                    txn=request.txn, status=Status.IO_ERROR, ledger_id=request.ledger_id,
                    message=f"internal error: {exc}"), False)]
            self._apply(commands)

    def tick(self, now_ms: int) -> None:
        """tick passes time to the handler (long-poll timeouts)."""
        self._apply(self.handler.tick(now_ms))

    def _apply(self, commands: list) -> None:
        storage = self.storage
        for command in commands:
            kind = type(command)
            if kind is Reply:
                self._replies.append(command)
            elif kind is StoreEntries:
                ledger_id = command.ledger_id
                for entry_id, data in command.entries:
                    storage.put(ledger_id, entry_id, data)
                self.entries_stored += len(command.entries)
                self.unsynced_entries += len(command.entries)
                self._dirty = True
            elif kind is StoreLedgerState:
                storage.set_ledger_state(command.ledger_id, command.state)
                self._dirty = True
            else:
                raise TypeError(f"unknown bookie command {command!r}")

    def flush(self) -> list[tuple[bytes, bytes]]:
        """flush syncs storage if needed and returns (peer, frame) replies to send, in order."""
        if not self._replies and not self._dirty:
            return []
        replies, self._replies = self._replies, []
        if self._dirty:
            self._dirty = False
            self.unsynced_entries = 0
            try:
                self.storage.sync()
                self.syncs += 1
            except Exception as exc:  # noqa: BLE001 - never acknowledge what did not sync
                log.error("storage sync failed: %s", exc)
                if isinstance(exc, StorageError):
                    self.failed = exc
                replies = [r if not r.durable else Reply(r.peer, _as_io_error(r.response, exc), False)
                           for r in replies]
        by_peer: dict[bytes, list] = {}
        for reply in replies:
            by_peer.setdefault(reply.peer, []).append(reply.response)
        return [(peer, encode_responses(responses)) for peer, responses in by_peer.items()]

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger drops a ledger's data (garbage collection of deleted ledgers)."""
        self.storage.delete_ledger(ledger_id)
        self.handler.forget(ledger_id)
        self._dirty = True


def _as_io_error(response, exc: Exception):
    """_as_io_error turns a reply that needed a failed sync into an IO_ERROR reply (no entries)."""
    fields = {"status": Status.IO_ERROR, "message": f"storage sync failed: {exc}"}
    if isinstance(response, ReadResponse):
        fields["entries"] = []
    return replace(response, **fields)
