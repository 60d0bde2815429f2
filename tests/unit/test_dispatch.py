"""Dispatcher: one translation of commands to requests and metadata calls, for every shell (issue 12)."""

from __future__ import annotations

from walkit.core import events as ev
from walkit.core.dispatch import RETRY_MS, Dispatcher
from walkit.core.messages import ReadLacRequest, ReadLacResponse, Status
from walkit.core.metadata import ledger_key
from walkit.errors import BadVersion, MetadataError, NoSuchKey, NoSuchLedger, SessionLost

from .helpers import LEDGER_ID, make_metadata

OWNER = object()


def write(dispatcher: Dispatcher, expected: int = 3):
    proposed = make_metadata().with_fragment(2, ("B1", "B4", "B3"))
    dispatcher.execute(OWNER, [ev.WriteMetadata(metadata=proposed, expected_version=expected)], 0)
    (call,) = dispatcher.take_calls()
    assert (call.method, call.args) == ("put", (ledger_key(LEDGER_ID), proposed.to_bytes(), expected))
    return proposed, call


def test_a_long_poll_read_lac_keeps_every_field_and_its_timeout_extends_the_deadline():
    dispatcher = Dispatcher(request_timeout_ms=100)
    dispatcher.execute(OWNER, [ev.SendReadLac(bookie="B1", ledger_id=LEDGER_ID, previous_lac=4, timeout_ms=500)], 0)
    ((bookie, (request,)),) = dispatcher.take_requests().items()
    assert bookie == "B1" and isinstance(request, ReadLacRequest)
    assert (request.previous_lac, request.timeout_ms) == (4, 500)
    assert dispatcher.tick(599) == []
    ((owner, event),) = dispatcher.tick(600)
    assert owner is OWNER and event.status == Status.UNREACHABLE


def test_an_answer_becomes_an_event_for_the_machine_that_asked_and_only_once():
    dispatcher = Dispatcher()
    dispatcher.execute(OWNER, [ev.SendReadLac(bookie="B1", ledger_id=LEDGER_ID)], 0)
    ((_, (request,)),) = dispatcher.take_requests().items()
    response = ReadLacResponse(txn=request.txn, status=Status.OK, ledger_id=LEDGER_ID, lac=7)
    assert dispatcher.on_response("B2", response) == []          # not the bookie that was asked
    ((owner, event),) = dispatcher.on_response("B1", response)
    assert owner is OWNER and event.lac == 7
    assert dispatcher.on_response("B1", response) == []          # a duplicate
    assert dispatcher.bookie_down("B1", "gone") == []


def test_a_bookie_going_down_ends_its_requests_as_unreachable():
    dispatcher = Dispatcher()
    dispatcher.execute(OWNER, [ev.SendReadLac(bookie="B1", ledger_id=LEDGER_ID),
                               ev.SendReadLac(bookie="B2", ledger_id=LEDGER_ID)], 0)
    dispatcher.take_requests()
    ((_, event),) = dispatcher.bookie_down("B1", "connection lost")
    assert (event.bookie, event.status) == ("B1", Status.UNREACHABLE)


def test_a_cas_whose_answer_was_lost_but_took_effect_is_reported_written():
    dispatcher = Dispatcher()
    proposed, put = write(dispatcher)
    assert dispatcher.store_result(put.call_id, error=MetadataError("connection lost")) == []
    (get,) = dispatcher.take_calls()
    assert (get.method, get.args) == ("get", (ledger_key(LEDGER_ID),))
    ((_, event),) = dispatcher.store_result(get.call_id, (proposed.to_bytes(), 4))
    assert event == ev.MetadataWritten(metadata=proposed, version=4)


def test_a_cas_whose_answer_was_lost_and_did_not_happen_is_reported_as_a_conflict():
    dispatcher = Dispatcher()
    _, put = write(dispatcher)
    dispatcher.store_result(put.call_id, error=SessionLost("session lost"))
    (get,) = dispatcher.take_calls()
    current = make_metadata()
    ((_, event),) = dispatcher.store_result(get.call_id, (current.to_bytes(), 3))
    assert event == ev.MetadataConflict(metadata=current, version=3)


def test_a_re_read_that_fails_is_tried_again_after_retry_ms():
    dispatcher = Dispatcher()
    proposed, put = write(dispatcher)
    dispatcher.store_result(put.call_id, error=MetadataError("timeout"))
    (get,) = dispatcher.take_calls()
    assert dispatcher.store_result(get.call_id, error=MetadataError("still unreachable")) == []
    assert dispatcher.take_calls() == []
    dispatcher.tick(RETRY_MS - 1)
    assert dispatcher.take_calls() == []
    dispatcher.tick(RETRY_MS)
    (again,) = dispatcher.take_calls()
    ((_, event),) = dispatcher.store_result(again.call_id, (proposed.to_bytes(), 4))
    assert type(event) is ev.MetadataWritten


def test_bad_version_reads_what_the_store_holds():
    dispatcher = Dispatcher()
    _, put = write(dispatcher)
    dispatcher.store_result(put.call_id, error=BadVersion("v5"))
    (get,) = dispatcher.take_calls()
    current = make_metadata(state="IN_RECOVERY")
    ((_, event),) = dispatcher.store_result(get.call_id, (current.to_bytes(), 5))
    assert event == ev.MetadataConflict(metadata=current, version=5)


def test_a_deleted_ledger_is_a_definite_failure():
    dispatcher = Dispatcher()
    _, put = write(dispatcher)
    ((_, event),) = dispatcher.store_result(put.call_id, error=NoSuchKey("gone"))
    assert type(event) is ev.MetadataFailed and isinstance(event.error, NoSuchLedger)


def test_choose_bookies_reports_candidates_and_failed_bookies_registered_again():
    dispatcher = Dispatcher()
    dispatcher.execute(OWNER, [ev.ChooseBookies(ledger_id=LEDGER_ID, exclude=frozenset({"B1", "B2", "B3"}),
                                                recheck=frozenset({"B2"}))], 0)
    (call,) = dispatcher.take_calls()
    assert call.method == "live_bookies"
    ((_, event),) = dispatcher.store_result(call.call_id, ["B3", "B2", "B5", "B1"])
    assert event == ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=["B5"], back=frozenset({"B2"}))
    assert dispatcher.reconnect == {"B2"}


def _read_answer(asked: list[int], returned: list[int]) -> ev.EntriesRead:
    from walkit.core.dispatch import response_event
    from walkit.core.messages import Entry, ReadRequest, ReadResponse
    request = ReadRequest(txn=1, ledger_id=LEDGER_ID, entry_ids=asked)
    response = ReadResponse(txn=1, status=Status.OK, ledger_id=LEDGER_ID, lac=9,
                            entries=[Entry(LEDGER_ID, e, -1, b"", b"") for e in returned])
    return response_event("B1", request, response)


def test_a_read_answer_names_the_entries_the_bookie_did_not_return():
    assert _read_answer([0, 3, 6], [0, 3, 6]).missing == []
    assert _read_answer([0, 3, 6], [0, 6]).missing == [3]
    assert _read_answer([0, 3, 6], [6, 0, 3]).missing == []              # returned out of order: none missing
    assert _read_answer([0, 3, 6], [0, 3, 7]).missing == [6]             # an entry not asked for is no answer
    assert _read_answer([0, 3, 6], []).missing == [0, 3, 6]
