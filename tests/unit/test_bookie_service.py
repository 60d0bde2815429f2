"""BookieService: no request, storage error or frame stops the serving loop (issue 11)."""

from __future__ import annotations

from dataclasses import replace

from walkit.core.messages import AddRequest, AddResponse, ErrorResponse, ForceRequest, ReadRequest, Status
from walkit.bookie.service import DEFERRED_SYNC_MS, BookieService
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


# -- deferred sync --------------------------------------------------------------------------------
class CountingStorage(MemoryStorage):
    """CountingStorage counts syncs, and what each one covered."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1
        super().sync()


def deferred_add(ledger_id: int, *entry_ids: int, txn: int = 1) -> AddRequest:
    return replace(add(ledger_id, *entry_ids, txn=txn), deferred_sync=True)


def test_deferred_sync_adds_are_answered_without_a_sync_and_a_force_syncs_them():
    storage = CountingStorage()
    service = BookieService(storage)
    round_trip(service, deferred_add(5, 0, txn=1))          # the first add records the master key: synced
    syncs = storage.syncs
    answered = round_trip(service, deferred_add(5, 1, 2, txn=2))
    assert answered[2].status == Status.OK and storage.syncs == syncs
    assert answered[2].instance == service.handler.instance != 0
    forced = round_trip(service, ForceRequest(txn=3, ledger_id=5, master_key=MASTER_KEY))
    assert forced[3].status == Status.OK and forced[3].instance == service.handler.instance
    assert storage.syncs == syncs + 1


def test_an_ordinary_add_in_the_same_round_syncs_the_deferred_ones_too():
    storage = CountingStorage()
    service = BookieService(storage)
    round_trip(service, deferred_add(5, 0), add(6, 0, txn=2))
    syncs = storage.syncs
    round_trip(service, deferred_add(5, 1, txn=3), add(6, 1, txn=4))
    assert storage.syncs == syncs + 1


def test_deferred_entries_are_synced_after_deferred_sync_ms_without_a_force():
    storage = CountingStorage()
    service = BookieService(storage)
    service.tick(10_000)
    round_trip(service, deferred_add(5, 0))
    syncs = storage.syncs
    round_trip(service, deferred_add(5, 1, txn=2))
    assert storage.syncs == syncs
    service.tick(10_000 + DEFERRED_SYNC_MS)
    assert service.flush() == [] and storage.syncs == syncs + 1


def test_a_force_with_the_wrong_master_key_is_refused_and_syncs_nothing():
    storage = CountingStorage()
    service = BookieService(storage)
    round_trip(service, deferred_add(5, 0))
    syncs = storage.syncs
    refused = round_trip(service, ForceRequest(txn=2, ledger_id=5, master_key=b"k" * 32))
    assert refused[2].status == Status.UNAUTHORIZED and storage.syncs == syncs


def test_a_deferred_recovery_add_is_a_bad_request():
    service = BookieService(MemoryStorage())
    answered = round_trip(service, replace(deferred_add(5, 0), recovery=True))
    assert answered[1].status == Status.BAD_REQUEST and "defer" in answered[1].message


class IndexFailingStorage(CountingStorage):
    """IndexFailingStorage fails syncs that cover ledger 13 once `failing` is set (a sick index file)."""

    failing = False

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[int] = set()

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.touched.add(ledger_id)
        super().put(ledger_id, entry_id, data)

    def sync(self) -> None:
        touched, self.touched = self.touched, set()
        super().sync()
        if self.failing and 13 in touched:
            raise LedgerStorageError("index of ledger 13 could not be written", {13})


def test_a_sync_that_fails_a_ledger_changes_the_instance_so_its_deferred_writer_learns_of_the_loss():
    storage = IndexFailingStorage()
    service = BookieService(storage)
    round_trip(service, add(13, 0, txn=1))
    before = round_trip(service, deferred_add(13, 1, txn=2))[2].instance
    storage.failing = True
    assert round_trip(service, add(12, 0, txn=3))[3].status == Status.OK      # ledger 12 is fine
    storage.failing = False
    forced = round_trip(service, ForceRequest(txn=4, ledger_id=13, master_key=MASTER_KEY))[4]
    assert forced.status == Status.OK and forced.instance != before
