"""LedgerWriter: ordered completion, LAC, failures, ensemble changes and close.

The rules: docs/internals/protocol.md#writing, #ensemble-change and #closing.
"""

from __future__ import annotations

import dataclasses

import pytest

from walkit.core import events as ev
from walkit.core.messages import Status
from walkit.core.metadata import LedgerMetadata
from walkit.core.writer import LedgerWriter
from walkit.errors import LedgerClosed, LedgerFenced, MetadataError, NotEnoughBookies, Unauthorized

from .helpers import DIGEST, LEDGER_ID, MASTER_KEY, bookies, make_metadata, of_type, only, sent_adds

VERSION = 1


def make_writer(ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2, **options) -> LedgerWriter:
    """make_writer returns a writer of a new ledger on B1..BE (metadata version VERSION)."""
    return LedgerWriter(make_metadata(ensemble_size, write_quorum, ack_quorum), VERSION,
                        master_key=MASTER_KEY, digest=DIGEST, **options)


def append(writer: LedgerWriter, count: int = 1) -> list:
    first = writer.last_add_pushed + 1
    return writer.step(ev.AppendRequested(payloads=[f"p{first + i}".encode() for i in range(count)]))


def ack(writer: LedgerWriter, bookie: str, *entry_ids: int) -> list:
    return writer.step(ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids)))


def reject(writer: LedgerWriter, bookie: str, *entry_ids: int, status: Status = Status.IO_ERROR) -> list:
    return writer.step(ev.AddsRejected(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids),
                                       status=status))


def choose(writer: LedgerWriter, *candidates: str) -> list:
    return writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=list(candidates)))


def completed(commands: list) -> list[int]:
    """completed lists the last_entry_id of every CompleteAdds command, in order."""
    return [c.last_entry_id for c in of_type(commands, ev.CompleteAdds)]


def change_to(writer: LedgerWriter, failed: str, replacement: str) -> LedgerMetadata:
    """change_to fails `failed` with IO_ERROR, offers `replacement`, and returns the proposed metadata."""
    reject(writer, failed, writer.last_add_confirmed + 1)
    return only(choose(writer, replacement), ev.WriteMetadata).metadata


def written(writer: LedgerWriter, metadata: LedgerMetadata, version: int = VERSION + 1) -> list:
    return writer.step(ev.MetadataWritten(metadata=metadata, version=version))


def conflict(writer: LedgerWriter, metadata: LedgerMetadata, version: int = VERSION + 5) -> list:
    return writer.step(ev.MetadataConflict(metadata=metadata, version=version))


# -- appends -------------------------------------------------------------------------------------
def test_append_sends_each_entry_to_its_write_set_in_one_batch_per_bookie():
    writer = make_writer(4, 3, 2)
    commands = append(writer, 6)
    assert len(of_type(commands, ev.SendAdds)) == 4
    assert sent_adds(commands) == {"B1": [0, 2, 3, 4], "B2": [0, 1, 3, 4, 5],
                                   "B3": [0, 1, 2, 4, 5], "B4": [1, 2, 3, 5]}


def test_append_sends_with_the_master_key_and_without_the_recovery_flag():
    for command in append(make_writer(), 2):
        assert (command.ledger_id, command.master_key, command.recovery) == (LEDGER_ID, MASTER_KEY, False)


def test_appended_entries_get_consecutive_ids_and_verifying_digests():
    writer = make_writer()
    append(writer, 2)
    entries = of_type(append(writer, 3), ev.SendAdds)[0].entries
    assert [e.entry_id for e in entries] == [2, 3, 4]
    assert [e.payload for e in entries] == [b"p2", b"p3", b"p4"]
    assert all(DIGEST.verify(e) for e in entries)


def test_every_entry_carries_the_lac_at_send_time():
    writer = make_writer()
    first = of_type(append(writer, 2), ev.SendAdds)[0].entries
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    second = of_type(append(writer, 1), ev.SendAdds)[0].entries
    ack(writer, "B1", 1, 2)
    ack(writer, "B2", 1, 2)
    third = of_type(append(writer, 1), ev.SendAdds)[0].entries
    assert [(e.entry_id, e.lac) for e in first + second + third] == [(0, -1), (1, -1), (2, 0), (3, 2)]


def test_add_completes_when_ack_quorum_of_its_write_set_acked():
    writer = make_writer(3, 3, 2)
    append(writer)
    assert completed(ack(writer, "B1", 0)) == []
    assert completed(ack(writer, "B3", 0)) == [0]


def test_add_acked_out_of_order_completes_only_after_all_lower_entries():
    writer = make_writer(3, 3, 2)
    append(writer, 3)
    early = ack(writer, "B1", 2) + ack(writer, "B2", 2) + ack(writer, "B1", 1) + ack(writer, "B3", 1)
    early += ack(writer, "B1", 0)
    assert of_type(early, ev.CompleteAdds) == []
    assert ack(writer, "B2", 0) == [ev.CompleteAdds(ledger_id=LEDGER_ID, last_entry_id=2)]


def test_lac_is_the_highest_completed_entry():
    writer = make_writer(3, 3, 2)
    append(writer, 3)
    assert writer.last_add_confirmed == -1
    ack(writer, "B1", 0, 1)
    ack(writer, "B2", 0)
    assert writer.last_add_confirmed == 0
    ack(writer, "B3", 1, 2)
    assert writer.last_add_confirmed == 1
    ack(writer, "B2", 2)
    assert (writer.last_add_confirmed, writer.pending_count) == (2, 0)


def test_acks_from_bookies_outside_the_write_set_do_not_count():
    writer = make_writer(4, 2, 2)          # entry 0 goes to B1, B2 only
    append(writer)
    assert ack(writer, "B3", 0) + ack(writer, "B4", 0) + ack(writer, "B1", 0) == []
    assert completed(ack(writer, "B2", 0)) == [0]


def test_repeated_acks_from_one_bookie_count_once():
    writer = make_writer(3, 3, 2)
    append(writer)
    assert ack(writer, "B1", 0) + ack(writer, "B1", 0) == []


def test_acks_for_unknown_entries_are_ignored():
    writer = make_writer(3, 3, 2)
    append(writer)
    assert ack(writer, "B1", 5, -1) + ack(writer, "B2", 5) == []
    assert writer.last_add_confirmed == -1


# -- fatal rejections ----------------------------------------------------------------------------
def test_fenced_rejection_fails_pending_adds_with_ledger_fenced():
    writer = make_writer()
    append(writer, 3)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    failure = only(reject(writer, "B2", 1, 2, status=Status.FENCED), ev.FailAdds)
    assert failure.first_entry_id == 1
    assert isinstance(failure.error, LedgerFenced)


def test_appends_after_fenced_fail_at_once_and_send_nothing():
    writer = make_writer()
    append(writer, 2)
    reject(writer, "B1", 0, 1, status=Status.FENCED)
    commands = append(writer, 2)
    assert of_type(commands, ev.SendAdds) == []
    failure = only(commands, ev.FailAdds)
    assert failure.first_entry_id == 2 and isinstance(failure.error, LedgerFenced)


def test_acks_after_fenced_complete_nothing():
    writer = make_writer()
    append(writer)
    reject(writer, "B1", 0, status=Status.FENCED)
    assert ack(writer, "B2", 0) + ack(writer, "B3", 0) == []


def test_unauthorized_rejection_fails_pending_adds_with_unauthorized():
    writer = make_writer()
    append(writer)
    failure = only(reject(writer, "B3", 0, status=Status.UNAUTHORIZED), ev.FailAdds)
    assert (failure.first_entry_id, type(failure.error)) == (0, Unauthorized)


# -- ensemble change -----------------------------------------------------------------------------
@pytest.mark.parametrize("status", [Status.IO_ERROR, Status.UNREACHABLE, Status.READ_ONLY,
                                    Status.TOO_MANY_REQUESTS], ids=lambda s: s.name)
def test_rejected_bookie_asks_for_a_replacement_outside_the_ensemble(status):
    writer = make_writer()
    append(writer)
    commands = reject(writer, "B2", 0, status=status)
    # Only an unreachable bookie (its connection closed) may be used again if it comes back.
    recheck = frozenset({"B2"}) if status == Status.UNREACHABLE else frozenset()
    assert commands == [ev.ChooseBookies(ledger_id=LEDGER_ID, exclude=frozenset(bookies(3)), recheck=recheck,
                                         ensemble=bookies(3), replacing=("B2",), write_quorum=3)]
    assert writer.changing_ensemble


# -- a restarted bookie is used again in place (issue 11, case 5) --------------------------------
def test_unreachable_bookie_back_with_no_spare_is_retried_in_place_without_a_metadata_change():
    writer = make_writer(3, 3, 3)
    append(writer, 2)
    ack(writer, "B1", 0, 1)
    ack(writer, "B3", 0, 1)
    reject(writer, "B2", 0, 1, status=Status.UNREACHABLE)
    commands = writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[], back=frozenset({"B2"})))
    assert of_type(commands, ev.WriteMetadata) == []
    assert sent_adds(commands) == {"B2": [0, 1]}
    assert not writer.changing_ensemble
    assert completed(ack(writer, "B2", 0, 1)) == [1]
    assert writer.metadata.ensembles == {0: tuple(bookies(3))}


def test_a_spare_bookie_is_preferred_to_retrying_a_returned_one():
    writer = make_writer(3, 3, 2)
    append(writer)
    reject(writer, "B2", 0, status=Status.UNREACHABLE)
    commands = writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=["B4"], back=frozenset({"B2"})))
    assert only(commands, ev.WriteMetadata).metadata.current_ensemble == ("B1", "B4", "B3")


def test_a_bookie_that_stopped_answering_on_a_live_connection_is_not_retried_in_place():
    writer = make_writer(3, 3, 3, add_timeout_ms=100)
    append(writer)
    ack(writer, "B1", 0)
    ack(writer, "B3", 0)
    commands = writer.step(ev.Ticked(now_ms=100))          # B2 holds its ack (SIGSTOP)
    assert only(commands, ev.ChooseBookies).recheck == frozenset()
    assert writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[], back=frozenset({"B2"}))) == []
    assert writer.changing_ensemble


def test_in_place_retries_stop_once_the_bookie_was_unreachable_for_add_timeout():
    writer = make_writer(3, 3, 3, add_timeout_ms=100)
    append(writer)
    reject(writer, "B2", 0, status=Status.UNREACHABLE)
    writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[], back=frozenset({"B2"})))
    writer.step(ev.Ticked(now_ms=60))
    reject(writer, "B2", 0, status=Status.UNREACHABLE)     # connected, then lost again
    writer.step(ev.Ticked(now_ms=120))
    assert writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[], back=frozenset({"B2"}))) == []
    failure = only(writer.step(ev.Ticked(now_ms=300)), ev.FailAdds)
    assert isinstance(failure.error, NotEnoughBookies)


def test_rejection_from_a_bookie_outside_the_ensemble_is_ignored():
    writer = make_writer()
    append(writer)
    assert reject(writer, "B9", 0) == []
    assert not writer.changing_ensemble


def test_bookies_chosen_writes_a_fragment_at_lac_plus_one_with_the_failed_bookie_replaced():
    writer = make_writer()
    append(writer, 3)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    reject(writer, "B3", 1, 2)
    command = only(choose(writer, "B4"), ev.WriteMetadata)
    assert command.expected_version == VERSION
    assert command.metadata.ensembles == {0: ("B1", "B2", "B3"), 1: ("B1", "B2", "B4")}
    assert command.metadata.state == "OPEN"


def test_bookies_chosen_with_no_lac_replaces_the_first_fragment():
    writer = make_writer()
    append(writer)
    assert change_to(writer, "B1", "B4").ensembles == {0: ("B4", "B2", "B3")}


def test_bookies_chosen_skips_candidates_already_in_the_ensemble():
    writer = make_writer()
    append(writer)
    reject(writer, "B2", 0)
    command = only(choose(writer, "B1", "B3", "B5"), ev.WriteMetadata)
    assert command.metadata.current_ensemble == ("B1", "B5", "B3")


def test_bookies_chosen_without_enough_candidates_writes_nothing():
    writer = make_writer()
    append(writer)
    reject(writer, "B2", 0)
    assert choose(writer, "B1") == []


def test_no_add_completes_while_the_ensemble_change_is_in_flight():
    writer = make_writer(3, 3, 2)
    append(writer, 2)
    reject(writer, "B3", 0, 1)
    during = ack(writer, "B1", 0, 1) + ack(writer, "B2", 0)
    during += choose(writer, "B4")
    during += ack(writer, "B2", 1)
    assert of_type(during, ev.CompleteAdds) == []
    assert writer.last_add_confirmed == -1


def test_metadata_written_resends_unacked_entries_only_to_the_replacement():
    writer = make_writer(3, 3, 2)
    append(writer, 3)
    ack(writer, "B1", 0, 1, 2)
    ack(writer, "B2", 0)
    proposed = change_to(writer, "B3", "B4")
    commands = written(writer, proposed)
    assert sent_adds(commands) == {"B4": [1, 2]}
    assert completed(commands) == []
    assert not writer.changing_ensemble


def test_resent_entries_complete_once_the_replacement_acks():
    writer = make_writer(3, 3, 2)
    append(writer, 3)
    ack(writer, "B1", 0, 1, 2)
    ack(writer, "B2", 0)
    written(writer, change_to(writer, "B3", "B4"))
    assert completed(ack(writer, "B4", 1, 2)) == [2]


def test_acks_gathered_during_the_change_complete_after_metadata_written():
    writer = make_writer(3, 3, 2)
    append(writer, 2)
    proposed = change_to(writer, "B3", "B4")
    ack(writer, "B1", 0, 1)
    ack(writer, "B2", 0, 1)
    commands = written(writer, proposed)
    assert sent_adds(commands) == {"B4": [0, 1]}
    assert completed(commands) == [1]


def test_acks_of_the_replaced_bookie_no_longer_count():
    writer = make_writer(3, 3, 2)
    append(writer)
    ack(writer, "B3", 0)
    reject(writer, "B3", 0, status=Status.UNREACHABLE)        # e.g. it acked, then went away
    written(writer, only(choose(writer, "B4"), ev.WriteMetadata).metadata)
    assert ack(writer, "B1", 0) == []
    assert completed(ack(writer, "B2", 0)) == [0]


def test_appends_during_the_change_skip_the_failed_bookie_and_reach_the_replacement_after_it():
    writer = make_writer(3, 3, 2)
    append(writer)
    proposed = change_to(writer, "B3", "B4")
    assert sent_adds(append(writer)) == {"B1": [1], "B2": [1]}
    assert sent_adds(written(writer, proposed)) == {"B4": [0, 1]}
    assert sent_adds(append(writer)) == {"B1": [2], "B2": [2], "B4": [2]}


def test_bookie_failing_during_the_metadata_write_starts_a_second_change():
    writer = make_writer(3, 3, 2)
    append(writer)
    proposed = change_to(writer, "B3", "B4")
    assert reject(writer, "B2", 0) == []
    commands = written(writer, proposed)
    assert only(commands, ev.ChooseBookies).exclude == frozenset({"B1", "B2", "B4"})
    second = only(choose(writer, "B5"), ev.WriteMetadata)
    assert second.expected_version == VERSION + 1
    assert second.metadata.ensembles == {0: ("B1", "B5", "B4")}


def test_metadata_conflict_in_recovery_fails_pending_adds_with_ledger_fenced():
    writer = make_writer()
    append(writer, 2)
    change_to(writer, "B3", "B4")
    failure = only(conflict(writer, make_metadata().in_recovery()), ev.FailAdds)
    assert failure.first_entry_id == 0 and isinstance(failure.error, LedgerFenced)


def test_metadata_conflict_still_open_retries_the_change_on_the_new_version():
    writer = make_writer(3, 3, 2)
    append(writer)
    ack(writer, "B1", 0)
    change_to(writer, "B3", "B4")
    ack(writer, "B2", 0)
    retry = conflict(writer, make_metadata(), version=VERSION + 5)
    assert retry == [ev.ChooseBookies(ledger_id=LEDGER_ID, exclude=frozenset(bookies(3)), ensemble=bookies(3),
                                      replacing=("B3",), write_quorum=3)]
    again = only(choose(writer, "B4"), ev.WriteMetadata)
    assert again.expected_version == VERSION + 5
    commands = written(writer, again.metadata, version=VERSION + 6)
    assert sent_adds(commands) == {"B4": [0]}
    assert completed(commands) == [0]


def test_metadata_failure_fails_pending_adds():
    writer = make_writer()
    append(writer)
    change_to(writer, "B3", "B4")
    error = MetadataError("store down")
    assert writer.step(ev.MetadataFailed(ledger_id=LEDGER_ID, error=error)) == [
        ev.FailAdds(ledger_id=LEDGER_ID, first_entry_id=0, error=error)]


def test_add_timeout_replaces_the_bookies_that_did_not_ack():
    writer = make_writer(3, 2, 2, add_timeout_ms=5000)      # entry 0 goes to B1, B2
    append(writer)
    ack(writer, "B1", 0)
    assert writer.step(ev.Ticked(now_ms=4999)) == []
    commands = writer.step(ev.Ticked(now_ms=5000))
    assert commands == [ev.ChooseBookies(ledger_id=LEDGER_ID, exclude=frozenset(bookies(3)), ensemble=bookies(3),
                                         replacing=("B2",), write_quorum=2)]
    proposed = only(choose(writer, "B4"), ev.WriteMetadata).metadata
    assert proposed.ensembles == {0: ("B1", "B4", "B3")}


def test_no_replacement_within_add_timeout_fails_with_not_enough_bookies():
    writer = make_writer(add_timeout_ms=1000)
    append(writer)
    reject(writer, "B3", 0)
    choose(writer)                                       # nobody available
    failure = only(writer.step(ev.Ticked(now_ms=1000)), ev.FailAdds)
    assert isinstance(failure.error, NotEnoughBookies)


# -- close ---------------------------------------------------------------------------------------
def test_close_waits_for_pending_adds_then_writes_closed_at_the_lac():
    writer = make_writer(3, 3, 2)
    append(writer, 2)
    assert writer.step(ev.CloseRequested()) == []
    ack(writer, "B1", 0, 1)
    commands = ack(writer, "B2", 0, 1)
    assert completed(commands) == [1]
    close = only(commands, ev.WriteMetadata)
    assert (close.metadata, close.expected_version) == (make_metadata().closed(1), VERSION)


def test_close_with_nothing_pending_writes_closed_at_once():
    writer = make_writer()
    assert writer.step(ev.CloseRequested()) == [
        ev.WriteMetadata(metadata=make_metadata().closed(-1), expected_version=VERSION)]


def test_close_completes_when_the_metadata_is_written():
    writer = make_writer()
    closed = only(writer.step(ev.CloseRequested()), ev.WriteMetadata).metadata
    assert written(writer, closed) == [ev.CompleteClose(metadata=closed, version=VERSION + 1)]
    assert writer.closed


def test_append_after_close_requested_fails_with_ledger_closed():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    failure = only(append(writer), ev.FailAdds)
    assert (failure.first_entry_id, type(failure.error)) == (0, LedgerClosed)


def test_close_waits_for_an_ensemble_change_to_finish():
    writer = make_writer(3, 3, 2)
    append(writer)
    ack(writer, "B1", 0)
    proposed = change_to(writer, "B3", "B4")
    assert writer.step(ev.CloseRequested()) == []
    ack(writer, "B2", 0)
    commands = written(writer, proposed)
    assert completed(commands) == [0]
    assert only(commands, ev.WriteMetadata).metadata == proposed.closed(0)


def test_close_conflict_with_in_recovery_fails_the_close():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    failure = only(conflict(writer, make_metadata().in_recovery()), ev.FailClose)
    assert isinstance(failure.error, LedgerFenced)


def test_close_conflict_with_closed_at_the_same_last_entry_completes_the_close():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    theirs = make_metadata().in_recovery().closed(-1)
    assert conflict(writer, theirs, version=9) == [ev.CompleteClose(metadata=theirs, version=9)]


def test_close_conflict_with_closed_at_another_last_entry_fails_the_close():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    failure = only(conflict(writer, make_metadata().closed(3)), ev.FailClose)
    assert isinstance(failure.error, LedgerFenced)
    assert "3" in str(failure.error)


def test_close_conflict_still_open_retries_on_the_new_version():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    assert conflict(writer, make_metadata(), version=9) == [
        ev.WriteMetadata(metadata=make_metadata().closed(-1), expected_version=9)]


def test_metadata_failure_during_close_fails_the_close_once():
    writer = make_writer()
    writer.step(ev.CloseRequested())
    error = MetadataError("store down")
    commands = writer.step(ev.MetadataFailed(ledger_id=LEDGER_ID, error=error))
    assert of_type(commands, ev.FailClose) == [ev.FailClose(ledger_id=LEDGER_ID, error=error)]


# -- explicit LAC --------------------------------------------------------------------------------
def test_idle_writer_sends_its_lac_after_explicit_lac_ms():
    writer = make_writer(3, 3, 2, explicit_lac_ms=100)
    append(writer)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    assert writer.step(ev.Ticked(now_ms=99)) == []
    assert writer.step(ev.Ticked(now_ms=100)) == [
        ev.SendWriteLac(bookie=b, ledger_id=LEDGER_ID, master_key=MASTER_KEY, lac=0) for b in bookies(3)]


def test_idle_writer_sends_each_lac_until_each_bookie_acknowledged_it():
    """A lost WriteLac would leave tailing readers an entry behind until the next append: the LAC
    goes again, every explicit_lac_ms while idle, to the bookies that did not acknowledge it."""
    writer = make_writer(3, 3, 2, explicit_lac_ms=100)
    append(writer)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    assert sorted(c.bookie for c in writer.step(ev.Ticked(now_ms=100))) == ["B1", "B2", "B3"]
    assert writer.step(ev.Ticked(now_ms=150)) == []                 # not again before explicit_lac_ms
    for bookie in ("B1", "B2"):
        writer.step(ev.LacWritten(bookie=bookie, ledger_id=LEDGER_ID, lac=0))
    assert [c.bookie for c in writer.step(ev.Ticked(now_ms=500))] == ["B3"]
    writer.step(ev.LacWritten(bookie="B3", ledger_id=LEDGER_ID, lac=0))
    assert writer.step(ev.Ticked(now_ms=900)) == []


def test_writer_with_nothing_confirmed_sends_no_lac():
    assert make_writer(explicit_lac_ms=100).step(ev.Ticked(now_ms=1000)) == []


# -- guaranteed write quorum ------------------------------------------------------------------------
def make_gwq_writer(**options) -> LedgerWriter:
    """make_gwq_writer is a writer of an E3/Qw3/Qa2 ledger with guaranteed write quorum."""
    metadata = dataclasses.replace(make_metadata(3, 3, 2), guaranteed_write_quorum=True)
    return LedgerWriter(metadata, VERSION, master_key=MASTER_KEY, digest=DIGEST, **options)


def test_gwq_acknowledges_at_qa_but_keeps_the_add_until_qw_and_sends_the_lafr():
    writer = make_gwq_writer()
    append(writer, 2)
    ack(writer, "B1", 0, 1)
    assert completed(ack(writer, "B2", 0, 1)) == [1]             # Qa=2: confirmed
    assert writer.pending_count == 2 and writer.last_add_fully_replicated == -1
    ack(writer, "B3", 0)
    assert writer.pending_count == 1 and writer.last_add_fully_replicated == 0
    assert {c.lafr for c in of_type(append(writer), ev.SendAdds)} == {0}


def test_gwq_close_waits_until_every_entry_reached_qw():
    writer = make_gwq_writer()
    append(writer)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    assert writer.step(ev.CloseRequested()) == []                # confirmed, but on 2 of 3 bookies
    close = only(ack(writer, "B3", 0), ev.WriteMetadata)
    assert close.metadata.state == "CLOSED" and close.metadata.last_entry_id == 0


def test_gwq_ensemble_change_starts_at_lafr_plus_one_and_resends_confirmed_entries():
    writer = make_gwq_writer()
    append(writer, 3)
    for bookie in ("B1", "B2"):
        ack(writer, bookie, 0, 1, 2)
    ack(writer, "B3", 0)                                         # LAFR 0, LAC 2
    reject(writer, "B3", 1)
    proposed = only(choose(writer, "B4"), ev.WriteMetadata).metadata
    assert proposed.ensembles == {0: ("B1", "B2", "B3"), 1: ("B1", "B2", "B4")}
    resent = written(writer, proposed)
    assert sent_adds(resent) == {"B4": [1, 2]}                   # confirmed, not yet on Qw
    close_after = ack(writer, "B4", 1, 2)
    assert writer.pending_count == 0 and writer.last_add_fully_replicated == 2 and completed(close_after) == []


def test_gwq_a_pinned_bookie_is_retried_in_place_then_the_writer_fails():
    writer = make_gwq_writer(add_timeout_ms=100)
    append(writer, 2)
    for bookie in ("B1", "B2"):
        ack(writer, bookie, 0, 1)
    ack(writer, "B3", 0)                                         # B3 holds confirmed entry 0 only: not pinned
    assert not writer._pinned("B3")
    append(writer)                                               # entry 2
    ack(writer, "B1", 2)
    ack(writer, "B3", 2)                                         # entry 2 confirmed by B1+B3; B3 pinned
    reject(writer, "B3", 1)
    retried = choose(writer, "B4")                               # a candidate exists, but B3 is pinned
    assert of_type(retried, ev.WriteMetadata) == []
    assert sent_adds(retried) == {"B3": [1]}                     # sent again to the same bookie
    writer.step(ev.Ticked(now_ms=150))
    reject(writer, "B3", 1)
    failed = choose(writer, "B4")
    assert isinstance(only(failed, ev.FailAdds).error, NotEnoughBookies)


# -- backpressure --------------------------------------------------------------------------------
def test_appends_beyond_max_bytes_in_flight_wait_without_ids_and_go_as_earlier_ones_complete():
    writer = make_writer(3, 3, 2, max_bytes_in_flight=10)
    sent = sent_adds(writer.step(ev.AppendRequested(payloads=[b"aaaa", b"bbbb", b"cccc", b"dddd"])))
    assert sent["B1"] == [0, 1] and writer.queued_count == 2 and writer.bytes_in_flight == 8
    assert writer.last_add_pushed == 1                      # queued appends have no entry id yet
    ack(writer, "B1", 0)
    commands = ack(writer, "B2", 0)                         # entry 0 done: 4 bytes free, room for one more
    assert completed(commands) == [0] and sent_adds(commands)["B1"] == [2] and writer.queued_count == 1
    commands = ack(writer, "B3", 1) + ack(writer, "B2", 1)
    assert completed(commands) == [1]
    assert sent_adds(commands)["B1"] == [3] and writer.queued_count == 0
    assert all(e.lac == 1 for c in of_type(commands, ev.SendAdds) for e in c.entries)   # sent after 1 completed


def test_one_entry_larger_than_max_bytes_in_flight_is_still_sent_alone():
    writer = make_writer(3, 3, 2, max_bytes_in_flight=4)
    sent = sent_adds(writer.step(ev.AppendRequested(payloads=[b"x" * 100, b"y"])))
    assert sent["B1"] == [0] and writer.queued_count == 1
    ack(writer, "B1", 0)
    commands = ack(writer, "B2", 0)
    assert completed(commands) == [0] and sent_adds(commands)["B1"] == [1]


def test_close_waits_for_queued_appends_and_a_failure_fails_them_from_the_first_pending_id():
    writer = make_writer(3, 3, 2, max_bytes_in_flight=2)
    append(writer, 3)                                       # p0 sent; p1, p2 queued (2 bytes each)
    assert writer.queued_count == 2 and not writer.step(ev.CloseRequested())
    for entry_id in range(3):
        ack(writer, "B1", entry_id)
        commands = ack(writer, "B2", entry_id)
    assert only(commands, ev.WriteMetadata).metadata.last_entry_id == 2

    failing = make_writer(3, 3, 2, max_bytes_in_flight=2)
    append(failing, 3)
    failed = reject(failing, "B1", 0, status=Status.FENCED)
    assert only(failed, ev.FailAdds).first_entry_id == 0
    assert failing.queued_count == 0 and failing.bytes_in_flight == 0


def test_with_guaranteed_write_quorum_bytes_leave_flight_only_once_on_every_write_quorum_bookie():
    writer = LedgerWriter(dataclasses.replace(make_metadata(3, 3, 2), guaranteed_write_quorum=True), VERSION,
                          master_key=MASTER_KEY, digest=DIGEST, max_bytes_in_flight=2)
    append(writer, 2)
    ack(writer, "B1", 0)
    commands = ack(writer, "B2", 0)
    assert completed(commands) == [0] and not of_type(commands, ev.SendAdds)   # confirmed, not on Qw yet
    commands = ack(writer, "B3", 0)
    assert sent_adds(commands)["B1"] == [1]
