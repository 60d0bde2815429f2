"""walkit.autorecovery.bookieio sends requests to chosen bookies and waits for their answers.

Re-replication addresses bookies one by one (read these entries from that replica, store them
on this new bookie), which the ledger machines of walkit.core never do: they pick replicas
themselves. `BookieIO` is a small synchronous client over the same ZeroMQ transport and wire
codec the public client uses (so CurveZMQ works the same way): `exchange` sends a batch of
(bookie, request) pairs at once and returns every answer, or an UNREACHABLE stand-in for a
bookie that is down or silent past the timeout. It belongs to one thread.

Reads are bounded by bytes (BP-62): each ReadRequest it makes carries `max_read_bytes`, and an
answer that reached it leaves the ids it did not look at unread (ReadResponse.unread). `reads`
asks the same bookie again for those until every id was looked at, handing over each answer
as it comes, so a caller keeps only what it needs of one answer at a time; `looked_at` says
which ids an answer covers (an id it covers and lacks is absent there; an unread one is not).
"""

from __future__ import annotations

import itertools
import time

from walkit.core.messages import (
    DEFAULT_MAX_READ_BYTES, AddRequest, AddResponse, Entry, ReadLacRequest, ReadLacResponse, ReadRequest,
    ReadResponse, Status, split_answer,
)
from walkit.wire.codec import DEFAULT_MAX_REQUESTS, WireError, decode_responses, encode_requests


def unreachable(request, why: str):
    """unreachable is the response a request gets when its bookie cannot answer."""
    if isinstance(request, AddRequest):
        return AddResponse(txn=request.txn, status=Status.UNREACHABLE, ledger_id=request.ledger_id, message=why)
    if isinstance(request, ReadLacRequest):
        return ReadLacResponse(txn=request.txn, status=Status.UNREACHABLE, ledger_id=request.ledger_id, message=why)
    return ReadResponse(txn=request.txn, status=Status.UNREACHABLE, ledger_id=request.ledger_id, message=why)


def _zmq_transport(key: str | None, server_key, lookup):
    """_zmq_transport is a ZeroMQ client transport, a CurveZMQ one when a key pair is given or in WALKIT_KEY."""
    import os

    from walkit.transport.zmq import ZmqTransport
    curve = None
    key = key if key is not None else (os.environ.get("WALKIT_KEY") or None)
    if key is not None:
        from walkit.security import load_keys
        curve = load_keys(key)
    return ZmqTransport(curve=curve, server_key=server_key, lookup=lookup)


class BookieIO:
    """BookieIO exchanges requests with bookies for one thread; `close()` releases its sockets.

    `key` is a client key pair file (as walkit.Client takes; default WALKIT_KEY) for secured
    clusters; `lookup(id)` returns a bookie's registration (walkit.registry.BookieInfo: the
    endpoint to dial and the public key; BookieRegistry.info), `server_key(id)` only its public
    key (without either, bookie ids are dialled as addresses). `transport` is
    another client transport to use instead (the in-memory one of walkit.testing.memory).
    """

    def __init__(self, *, key: str | None = None, server_key=None, timeout: float = 10.0, transport=None,
                 max_read_bytes: int = DEFAULT_MAX_READ_BYTES, lookup=None) -> None:
        if transport is None:
            transport = _zmq_transport(key, server_key, lookup)
        self.transport = transport
        self.timeout = timeout
        self.max_read_bytes = max_read_bytes
        self._txns = itertools.count(1)

    def next_txn(self) -> int:
        """next_txn is a fresh transaction id for a request."""
        return next(self._txns)

    def read_request(self, ledger_id: int, entry_ids: list[int]) -> ReadRequest:
        """read_request is a read of `entry_ids` (at most MAX_READ_IDS) bounded by `max_read_bytes`."""
        return ReadRequest(txn=self.next_txn(), ledger_id=ledger_id, entry_ids=list(entry_ids),
                           max_bytes=self.max_read_bytes)

    def exchange(self, requests: list[tuple[str, object]], timeout: float | None = None) -> dict[int, object]:
        """exchange sends every (bookie, request) and returns {txn: response} once all are answered.

        A request whose bookie is down, or that gets no answer within `timeout`, is answered
        with status UNREACHABLE.
        """
        timeout = self.timeout if timeout is None else timeout
        waiting: dict[int, tuple[str, object]] = {}
        answers: dict[int, object] = {}
        by_bookie: dict[str, list] = {}
        for address, request in requests:
            by_bookie.setdefault(address, []).append(request)
            waiting[request.txn] = (address, request)
        for address, batch in by_bookie.items():
            for start in range(0, len(batch), DEFAULT_MAX_REQUESTS):
                chunk = batch[start:start + DEFAULT_MAX_REQUESTS]
                if not self.transport.send(address, encode_requests(chunk)):
                    self._give_up(waiting, answers, address, f"bookie {address} is down")
        deadline = time.monotonic() + timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                for txn, (address, request) in list(waiting.items()):
                    answers[txn] = unreachable(request, f"bookie {address} did not answer within {timeout:g} s")
                break
            frames, down = self.transport.poll(int(min(left, 0.5) * 1000) + 1)
            for address, frame in frames:
                try:
                    responses = decode_responses(frame)
                except WireError:
                    continue
                for response in responses:
                    if response.txn in waiting:
                        del waiting[response.txn]
                        answers[response.txn] = response
            for address in down:
                self._give_up(waiting, answers, address, f"lost the connection to bookie {address}")
        return answers

    @staticmethod
    def _give_up(waiting: dict, answers: dict, address: str, why: str) -> None:
        for txn, (bookie, request) in list(waiting.items()):
            if bookie == address:
                del waiting[txn]
                answers[txn] = unreachable(request, why)

    def reads(self, reads: list[tuple[str, ReadRequest]], timeout: float | None = None,
              answers: dict[int, object] | None = None):
        """reads sends every (bookie, read) and yields (bookie, read, answer) for each, then for the
        reads it sends again for the ids answers left unread, until none is left.

        `answers` ({txn: answer}) holds the answers to `reads` if they were exchanged already
        (with other requests). An answer that returned no entry and left ids unread made no
        progress: those ids are not asked again (a caller finds them neither returned nor
        looked at, see `looked_at`).
        """
        while reads:
            if answers is None:
                answers = self.exchange(reads, timeout)
            again = []
            for address, request in reads:
                response = answers[request.txn]
                yield address, request, response
                if response.status == Status.OK and response.unread and response.entries:
                    unread = split_answer(request, response)[1]
                    if unread:
                        again.append((address, self.read_request(request.ledger_id, unread)))
            reads, answers = again, None

    @staticmethod
    def looked_at(request: ReadRequest, response) -> list[int]:
        """looked_at lists the ids of `request` an OK `response` answered for: returned, or absent there."""
        if response.status != Status.OK:
            return []
        unread = set(split_answer(request, response)[1])
        return [i for i in request.entry_ids if i not in unread] if unread else list(request.entry_ids)

    def read(self, address: str, ledger_id: int, entry_ids: list[int], timeout: float | None = None) -> ReadResponse:
        """read asks one bookie for entries of a ledger, in as many bounded answers as it takes.

        It returns one answer holding every entry the bookie has of `entry_ids` (absent ones
        are missing from it), or the first answer that was not OK. For a few entries; `reads`
        streams many.
        """
        entries: list[Entry] = []
        last = None
        for _, _, response in self.reads([(address, self.read_request(ledger_id, entry_ids))], timeout):
            if response.status != Status.OK:
                return response
            entries += response.entries
            last = response
        return ReadResponse(txn=last.txn, status=Status.OK, ledger_id=ledger_id, entries=entries, lac=last.lac,
                            disk=last.disk, unread=last.unread if not last.entries else 0)

    def add(self, address: str, ledger_id: int, master_key: bytes, entries: list[Entry],
            timeout: float | None = None) -> AddResponse:
        """add stores entries on one bookie as recovery adds (they pass a fenced ledger)."""
        request = AddRequest(txn=self.next_txn(), ledger_id=ledger_id, master_key=master_key,
                             entries=list(entries), recovery=True)
        return self.exchange([(address, request)], timeout)[request.txn]

    def close(self) -> None:
        """close closes every socket."""
        self.transport.close()
