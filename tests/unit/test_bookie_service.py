"""BookieService: no request, storage error or frame stops the serving loop (issue 11)."""

from __future__ import annotations

from walkit.core.messages import AddRequest, AddResponse, ErrorResponse, ReadRequest, Status
from walkit.bookie.service import BookieService
from walkit.errors import LedgerStorageError
from walkit.plugins.storage.memory import MemoryStorage
from walkit.wire.codec import decode_responses, encode_requests

from .helpers import MASTER_KEY, make_entry

PEER = b"peer"


def add(ledger_id: int, *entry_ids: int, txn: int = 1) -> AddRequest:
    return AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY,
                      entries=[make_entry(e, ledger_id=ledger_id) for e in entry_ids])


def round_trip(service: BookieService, *requests) -> dict[int, object]:
    """round_trip sends one frame of `requests` and returns the responses by txn."""
    service.receive(PEER, encode_requests(list(requests)))
    ((peer, frame),) = service.flush()
    assert peer == PEER
    return {r.txn: r for r in decode_responses(frame)}


class FlakyStorage(MemoryStorage):
    """FlakyStorage fails puts to ledger 13, and syncs that cover ledger 14, like a sick disk."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[int] = set()

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        if ledger_id == 13:
            raise OSError(5, "Input/output error")
        self.touched.add(ledger_id)
        super().put(ledger_id, entry_id, data)

    def sync(self) -> None:
        touched, self.touched = self.touched, set()
        if 14 in touched:
            raise LedgerStorageError("index of ledger 14 could not be written", {14})


def test_an_exception_while_storing_one_request_fails_that_request_only():
    service = BookieService(FlakyStorage())
    responses = round_trip(service, add(13, 0, txn=1), add(12, 0, txn=2))
    assert (responses[1].status, responses[2].status) == (Status.IO_ERROR, Status.OK)
    assert "Input/output error" in responses[1].message
    assert service.failed is None
    assert round_trip(service, add(12, 1, txn=3))[3].status == Status.OK


def test_a_sync_that_failed_some_ledgers_fails_their_replies_only():
    service = BookieService(FlakyStorage())
    responses = round_trip(service, add(14, 0, txn=1), add(12, 0, txn=2))
    assert isinstance(responses[1], AddResponse) and responses[1].status == Status.IO_ERROR
    assert responses[2].status == Status.OK
    assert service.failed is None             # the bookie serves on


def test_a_frame_with_too_many_requests_is_refused_whole():
    service = BookieService(MemoryStorage(), max_requests=2)
    requests = [ReadRequest(txn=i, ledger_id=1, entry_ids=[0]) for i in range(1, 4)]
    (response,) = round_trip(service, *requests).values()
    assert isinstance(response, ErrorResponse) and response.status == Status.TOO_MANY_REQUESTS


def test_the_storage_declares_the_highest_entry_id():
    storage = MemoryStorage()
    storage.max_entry_id = 10
    service = BookieService(storage)
    assert round_trip(service, add(1, 11))[1].status == Status.BAD_REQUEST
    assert round_trip(service, add(1, 10))[1].status == Status.OK
