"""LedgerRecovery: mark, fence, read forward, write back, close (docs/internals/protocol.md#recovery)."""

from __future__ import annotations

import dataclasses

from walkit.core import events as ev
from walkit.core.messages import Status
from walkit.core.metadata import LedgerMetadata
from walkit.core.recovery import RETRY_MS, LedgerRecovery
from walkit.errors import Timeout, Unauthorized

from .helpers import (
    DIGEST, LEDGER_ID, MASTER_KEY, bookies, make_entry, make_metadata, of_type, only, sent_adds, sent_reads,
)

VERSION = 1
MARKED = VERSION + 1          # the version MetadataWritten reports for the IN_RECOVERY write


def make_recovery(ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2, *, fragments=None,
                  state: str = "OPEN", window: int = 4, **options) -> LedgerRecovery:
    metadata = make_metadata(ensemble_size, write_quorum, ack_quorum, fragments=fragments, state=state)
    return LedgerRecovery(metadata, VERSION, master_key=MASTER_KEY, digest=DIGEST, window=window, **options)


def lac(recovery: LedgerRecovery, bookie: str, value: int = -1, status: Status = Status.OK) -> list:
    return recovery.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=status, lac=value))


def mark(recovery: LedgerRecovery) -> list:
    """mark starts recovery and reports its IN_RECOVERY write as done; it returns the fencing requests."""
    proposed = only(recovery.start(), ev.WriteMetadata).metadata
    return recovery.step(ev.MetadataWritten(metadata=proposed, version=MARKED))


def fence(recovery: LedgerRecovery, lacs: dict[str, int]) -> list:
    """fence marks the ledger, answers the fencing reads with `lacs`, and returns the last step's commands."""
    mark(recovery)
    commands: list = []
    for bookie, value in lacs.items():
        commands = lac(recovery, bookie, value)
    return commands


def answer(recovery: LedgerRecovery, bookie: str, entries=(), missing=()) -> list:
    return recovery.step(ev.EntriesRead(bookie=bookie, ledger_id=LEDGER_ID, entries=list(entries),
                                        missing=list(missing), lac=-1))


def ack(recovery: LedgerRecovery, bookie: str, *entry_ids: int) -> list:
    return recovery.step(ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids)))


def first_read(commands: list) -> int:
    return min(e for ids in sent_reads(commands).values() for e in ids)


def close_metadata(commands: list) -> LedgerMetadata:
    return only(commands, ev.WriteMetadata).metadata


# -- mark and fence ------------------------------------------------------------------------------
def test_start_on_open_writes_in_recovery():
    assert make_recovery().start() == [
        ev.WriteMetadata(metadata=make_metadata().in_recovery(), expected_version=VERSION)]


def test_start_on_in_recovery_fences_at_once():
    commands = make_recovery(state="IN_RECOVERY").start()
    assert [c.bookie for c in of_type(commands, ev.SendReadLac)] == list(bookies(3))


def test_start_on_closed_completes_with_that_metadata():
    recovery = LedgerRecovery(make_metadata().closed(4), VERSION, master_key=MASTER_KEY, digest=DIGEST)
    assert recovery.start() == [ev.CompleteRecovery(metadata=make_metadata().closed(4), version=VERSION)]


def test_metadata_written_fences_every_bookie_of_the_last_fragment():
    recovery = make_recovery(fragments={0: bookies(3), 5: ("B1", "B4", "B3")})
    assert mark(recovery) == [
        ev.SendReadLac(bookie=b, ledger_id=LEDGER_ID, fence=True, master_key=MASTER_KEY)
        for b in ("B1", "B4", "B3")]


def test_not_fenced_until_ensemble_coverage_answered():
    recovery = make_recovery(5, 3, 2)                   # EC = (5 - 2) + 1 = 4
    mark(recovery)
    assert lac(recovery, "B1") + lac(recovery, "B2") + lac(recovery, "B3") == []
    assert recovery.phase == "FENCING"
    assert sent_reads(lac(recovery, "B4")) != {}
    assert recovery.phase == "RECOVERING"


def test_failed_fence_answers_do_not_count_and_are_asked_again_after_retry_ms():
    recovery = make_recovery(3, 3, 2)                   # EC = 2
    mark(recovery)
    lac(recovery, "B1")
    assert lac(recovery, "B2", status=Status.IO_ERROR) == []
    assert recovery.step(ev.Ticked(now_ms=RETRY_MS - 1)) == []
    assert recovery.step(ev.Ticked(now_ms=RETRY_MS)) == [
        ev.SendReadLac(bookie="B2", ledger_id=LEDGER_ID, fence=True, master_key=MASTER_KEY)]


def test_unauthorized_fence_fails_recovery():
    recovery = make_recovery()
    mark(recovery)
    failure = only(lac(recovery, "B1", status=Status.UNAUTHORIZED), ev.FailRecovery)
    assert isinstance(failure.error, Unauthorized)


# -- where reading starts ------------------------------------------------------------------------
def test_reading_starts_after_the_highest_lac_of_the_fence_answers():
    commands = fence(make_recovery(3, 3, 2), {"B1": 3, "B3": 5})
    assert sent_reads(commands) == {b: [6, 7, 8, 9] for b in bookies(3)}


def test_reading_starts_at_the_last_fragment_when_every_lac_is_lower():
    # BookKeeper issue 2615: LAC -1 everywhere, but entries 0..9 are in an earlier fragment.
    recovery = make_recovery(fragments={0: bookies(3), 10: ("B4", "B2", "B3")})
    commands = fence(recovery, {"B4": -1, "B2": -1})
    assert recovery.start_entry == 9
    assert first_read(commands) == 10


def test_every_recovery_read_carries_the_fence_flag_and_master_key():
    # BookKeeper issue 2614.
    commands = fence(make_recovery(), {"B1": -1, "B2": -1})
    assert of_type(commands, ev.SendRead)
    assert all(c.fence and c.master_key == MASTER_KEY for c in of_type(commands, ev.SendRead))


def test_recovery_reads_ask_the_whole_write_set():
    commands = fence(make_recovery(4, 2, 2, window=1), {"B1": 2, "B2": 2, "B3": 2})
    assert sent_reads(commands) == {"B4": [3], "B1": [3]}


# -- present entries -----------------------------------------------------------------------------
def test_entry_with_one_ok_is_written_back_to_its_whole_write_set_with_the_recovery_flag():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    commands = answer(recovery, "B2", entries=[make_entry(0)])
    assert sent_adds(commands) == {"B1": [0], "B2": [0], "B3": [0]}
    assert all(c.recovery and c.master_key == MASTER_KEY for c in of_type(commands, ev.SendAdds))
    assert all(c.entries == [make_entry(0)] for c in of_type(commands, ev.SendAdds))


def test_corrupt_entry_is_not_written_back():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    bad = make_entry(0)._replace(payload=b"tampered")
    assert sent_adds(answer(recovery, "B1", entries=[bad])) == {}


def test_written_back_entry_counts_once_ack_quorum_acked():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", entries=[make_entry(0)])
    assert sent_reads(ack(recovery, "B1", 0)) == {}
    assert sent_reads(ack(recovery, "B3", 0)) == {b: [1] for b in bookies(3)}


# -- absent entries ------------------------------------------------------------------------------
def test_one_no_such_entry_is_not_enough_to_call_an_entry_absent():
    recovery = make_recovery(3, 3, 2, window=1)         # QC = (3 - 2) + 1 = 2
    fence(recovery, {"B1": -1, "B2": -1})
    assert of_type(answer(recovery, "B1", missing=[0]), ev.WriteMetadata) == []
    assert recovery.last_entry_id is None


def test_absent_quorum_of_no_such_entry_makes_an_entry_absent():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    commands = answer(recovery, "B3", missing=[0])
    assert recovery.last_entry_id == -1
    assert close_metadata(commands) == make_metadata().in_recovery().closed(-1)


def test_failed_read_leaves_the_entry_undecided():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    for bookie in ("B2", "B3"):
        commands = recovery.step(ev.ReadFailed(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=[0],
                                               status=Status.IO_ERROR))
        assert of_type(commands, ev.WriteMetadata) == []
    assert recovery.last_entry_id is None


def test_failed_read_is_asked_again_after_retry_ms():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    recovery.step(ev.ReadFailed(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.IO_ERROR))
    assert recovery.step(ev.Ticked(now_ms=RETRY_MS - 1)) == []
    assert recovery.step(ev.Ticked(now_ms=RETRY_MS)) == [
        ev.SendRead(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], fence=True, master_key=MASTER_KEY)]


def test_answer_to_a_retried_read_can_prove_absence():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    recovery.step(ev.ReadFailed(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.IO_ERROR))
    recovery.step(ev.Ticked(now_ms=RETRY_MS))
    assert close_metadata(answer(recovery, "B2", missing=[0])).last_entry_id == -1


def test_no_such_ledger_counts_as_no_such_entry():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    commands = recovery.step(ev.ReadFailed(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[0],
                                           status=Status.NO_SUCH_LEDGER))
    assert close_metadata(commands).last_entry_id == -1


def test_entry_found_after_absence_was_proven_is_not_written_back():
    recovery = make_recovery(3, 3, 2, window=2)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    answer(recovery, "B2", missing=[0])
    assert sent_adds(answer(recovery, "B3", entries=[make_entry(0), make_entry(1, lac=0)])) == {}


# -- close ---------------------------------------------------------------------------------------
def recover_to_absent_at(recovery: LedgerRecovery, present: list[int], absent: int) -> list:
    """recover_to_absent_at answers reads so `present` entries exist and `absent` does not, acks
    every write-back from B1 and B2, and returns the commands of the last step."""
    commands: list = []
    for entry_id in present:
        answer(recovery, "B1", entries=[make_entry(entry_id, lac=entry_id - 1)])
    answer(recovery, "B1", missing=[absent])
    answer(recovery, "B2", missing=[absent])
    for entry_id in present:
        ack(recovery, "B1", entry_id)
        commands = ack(recovery, "B2", entry_id)
    return commands


def test_close_writes_closed_at_the_entry_before_the_first_absent():
    recovery = make_recovery(3, 3, 2, window=4)
    fence(recovery, {"B1": 1, "B2": 0})                 # reads 2..5
    commands = recover_to_absent_at(recovery, present=[2, 3], absent=4)
    close = only(commands, ev.WriteMetadata)
    assert close.expected_version == MARKED
    assert close.metadata == make_metadata().in_recovery().closed(3)


def test_close_waits_for_the_write_back_of_every_present_entry():
    recovery = make_recovery(3, 3, 2, window=4)
    fence(recovery, {"B1": 1, "B2": 0})
    answer(recovery, "B1", entries=[make_entry(2, lac=1)])
    answer(recovery, "B1", missing=[3])
    assert of_type(answer(recovery, "B2", missing=[3]), ev.WriteMetadata) == []
    assert of_type(ack(recovery, "B1", 2), ev.WriteMetadata) == []
    assert close_metadata(ack(recovery, "B3", 2)).last_entry_id == 2


def test_close_written_completes_recovery():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    closed = close_metadata(answer(recovery, "B2", missing=[0]))
    assert recovery.step(ev.MetadataWritten(metadata=closed, version=MARKED + 1)) == [
        ev.CompleteRecovery(metadata=closed, version=MARKED + 1)]


def test_close_conflict_showing_closed_adopts_that_close():
    recovery = make_recovery(3, 3, 2, window=4)
    fence(recovery, {"B1": 1, "B2": 0})
    recover_to_absent_at(recovery, present=[2, 3], absent=4)
    theirs = make_metadata().in_recovery().closed(3)
    assert recovery.step(ev.MetadataConflict(metadata=theirs, version=9)) == [
        ev.CompleteRecovery(metadata=theirs, version=9)]


def test_mark_conflict_showing_closed_completes_with_that_metadata():
    recovery = make_recovery()
    recovery.start()
    theirs = make_metadata().closed(12)
    assert recovery.step(ev.MetadataConflict(metadata=theirs, version=4)) == [
        ev.CompleteRecovery(metadata=theirs, version=4)]


def test_mark_conflict_showing_in_recovery_goes_on_to_fence():
    recovery = make_recovery()
    recovery.start()
    commands = recovery.step(ev.MetadataConflict(metadata=make_metadata().in_recovery(), version=4))
    assert [c.fence for c in of_type(commands, ev.SendReadLac)] == [True, True, True]


def test_close_conflict_still_in_recovery_retries_the_close_on_the_new_version():
    recovery = make_recovery(3, 3, 2, window=1)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", missing=[0])
    answer(recovery, "B2", missing=[0])
    commands = recovery.step(ev.MetadataConflict(metadata=make_metadata().in_recovery(), version=7))
    assert commands == [ev.WriteMetadata(metadata=make_metadata().in_recovery().closed(-1), expected_version=7)]


def test_recovery_that_does_not_finish_in_time_fails_with_timeout():
    recovery = make_recovery(timeout_ms=1000)
    mark(recovery)
    failure = only(recovery.step(ev.Ticked(now_ms=1000)), ev.FailRecovery)
    assert isinstance(failure.error, Timeout)


# -- write-back failures -------------------------------------------------------------------------
def replace_b2_during_write_back(recovery: LedgerRecovery) -> list:
    """replace_b2_during_write_back reads entries 0..2 (0 and 1 present on B1, 2 missing there),
    acks entry 1 from B1 and B2 and entry 0 from B1 only, then B2 refuses entry 0 and B4 replaces
    it; it returns the BookiesChosen commands."""
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", entries=[make_entry(0), make_entry(1, lac=0)], missing=[2])
    ack(recovery, "B1", 0, 1)
    ack(recovery, "B2", 1)
    chooses = recovery.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0],
                                            status=Status.IO_ERROR))
    assert only(chooses, ev.ChooseBookies).exclude == frozenset(bookies(3))
    return recovery.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=["B4"]))


def test_write_back_refused_by_a_bookie_is_resent_to_its_replacement():
    recovery = make_recovery(3, 3, 2, window=3)
    assert 0 in sent_adds(replace_b2_during_write_back(recovery))["B4"]


def test_write_back_acks_of_a_replaced_bookie_no_longer_count():
    recovery = make_recovery(3, 3, 2, window=3)
    commands = replace_b2_during_write_back(recovery)
    assert sent_adds(commands)["B4"] == [0, 1]          # entry 1 lost B2's ack with B2
    answer(recovery, "B3", missing=[2])                 # entry 2 absent: last entry is 1
    assert of_type(ack(recovery, "B4", 0), ev.WriteMetadata) == []
    close = close_metadata(ack(recovery, "B4", 1))
    assert close.ensembles == {0: ("B1", "B4", "B3")} and close.last_entry_id == 1


def test_a_failed_bookie_that_answers_before_anyone_replaced_it_gets_the_write_backs_it_missed():
    """A slow bookie fails (its write-back unanswered for add_timeout_ms), no spare can replace it,
    and its answer then comes: the recovery writes on to it, the write-backs made meanwhile too,
    instead of failing for want of a replacement and starting over."""
    recovery = make_recovery(3, 3, 2, window=3, add_timeout_ms=100)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", entries=[make_entry(0)], missing=[])
    ack(recovery, "B1", 0)
    chooses = recovery.step(ev.Ticked(now_ms=100))            # B2 and B3 silent for entry 0
    assert only(chooses, ev.ChooseBookies).replacing == ("B2",)          # B3 joins the failed ones
    assert recovery.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[])) == []      # no spare
    skipped = answer(recovery, "B1", entries=[make_entry(1, lac=0)])
    assert sent_adds(skipped) == {"B1": [1]}                 # B2 and B3 are failed: not sent to
    back = ack(recovery, "B3", 0)
    assert sent_adds(back) == {"B3": [1]}                     # B3 is back, and gets entry 1
    assert sent_adds(ack(recovery, "B2", 0)) == {"B2": [1]}
    answer(recovery, "B2", missing=[2])
    answer(recovery, "B3", missing=[2])
    ack(recovery, "B1", 1)
    close = close_metadata(ack(recovery, "B3", 1))
    assert close.last_entry_id == 1 and close.ensembles == {0: ("B1", "B2", "B3")}


def test_a_bookie_that_refused_a_write_back_is_not_taken_back_by_a_later_answer():
    recovery = make_recovery(3, 3, 2, window=3, add_timeout_ms=100)
    fence(recovery, {"B1": -1, "B2": -1})
    answer(recovery, "B1", entries=[make_entry(0)], missing=[])
    ack(recovery, "B1", 0)
    recovery.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.IO_ERROR))
    assert recovery.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=[])) == []      # no spare
    answer(recovery, "B1", entries=[make_entry(1, lac=0)])
    assert sent_adds(ack(recovery, "B2", 0)) == {}           # a late answer: B2 still counts as failed


# -- guaranteed write quorum ----------------------------------------------------------------------
def test_gwq_recovery_reads_from_the_lafr_and_closes_only_once_write_backs_reached_qw():
    metadata = dataclasses.replace(make_metadata(3, 3, 2), guaranteed_write_quorum=True)
    recovery = LedgerRecovery(metadata, VERSION, master_key=MASTER_KEY, digest=DIGEST, window=4)
    mark(recovery)
    lac_answer = lambda bookie: recovery.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=Status.OK,
                                                         lac=5, lafr=2))
    lac_answer("B1")
    reads = lac_answer("B2")                                 # EC = 2: fenced; LAC 5, LAFR 2
    assert first_read(reads) == 3                            # not 6: entries 3..5 may be on Qa only
    commands = []
    for bookie in ("B1", "B2", "B3"):
        commands += answer(recovery, bookie, [make_entry(3)], missing=[4, 5, 6])
    assert sent_adds(commands) == {"B1": [3], "B2": [3], "B3": [3]}
    ack(recovery, "B1", 3)
    assert of_type(ack(recovery, "B2", 3), ev.WriteMetadata) == []       # Qa is not enough
    assert close_metadata(ack(recovery, "B3", 3)).last_entry_id == 3


# -- unbounded ledgers: one holder per term, and nothing written back past the end ----------------
def unbounded_metadata(term: int = 1) -> LedgerMetadata:
    return dataclasses.replace(make_metadata(3, 3, 2), guaranteed_write_quorum=True, unbounded=True, term=term)


def test_an_unbounded_recovery_needs_a_holder_to_take_a_term_with():
    import pytest
    from walkit.errors import ConfigError
    with pytest.raises(ConfigError, match="holder"):
        LedgerRecovery(unbounded_metadata(), VERSION, master_key=MASTER_KEY, digest=DIGEST, reopen=True)


def test_two_reopens_of_the_same_metadata_propose_the_same_term_in_different_bytes():
    """An unknown put outcome is settled by reading the key back (walkit.core.dispatch): with equal
    bytes, the recovery whose put did not land would take the other's write for its own, and two
    writers would hold term 2 (found by the simulator, seed 212887 of the unbounded battles)."""
    from walkit.core.dispatch import Dispatcher
    from walkit.errors import MetadataError
    first, second = (LedgerRecovery(unbounded_metadata(), VERSION, master_key=MASTER_KEY, digest=DIGEST,
                                    reopen=True, holder=holder) for holder in ("w2", "w3"))
    ours, theirs = (only(r.start(), ev.WriteMetadata).metadata for r in (second, first))
    assert ours.term == theirs.term == 2 and ours.to_bytes() != theirs.to_bytes()
    assert (ours.term_holder, LedgerMetadata.from_bytes(ours.to_bytes()).term_holder) == ("w3", "w3")

    dispatcher = Dispatcher()                  # the second's put: unknown outcome; the store holds the first's
    dispatcher.execute(second, [ev.WriteMetadata(metadata=ours, expected_version=VERSION)], 0)
    (put,) = dispatcher.take_calls()
    dispatcher.store_result(put.call_id, error=MetadataError("answer lost"))
    (get,) = dispatcher.take_calls()
    ((owner, event),) = dispatcher.store_result(get.call_id, (theirs.to_bytes(), MARKED))
    assert owner is second and event == ev.MetadataConflict(metadata=theirs, version=MARKED)
    retry = only(second.step(event), ev.WriteMetadata)         # it marks again, the term after the first's
    assert (retry.metadata.term, retry.metadata.term_holder, retry.expected_version) == (3, "w3", MARKED)


def test_a_recovery_that_finds_its_term_held_by_another_gives_up():
    recovery = LedgerRecovery(unbounded_metadata(), VERSION, master_key=MASTER_KEY, digest=DIGEST, reopen=True,
                              holder="w3")
    mark(recovery)
    assert recovery.term == 2
    other = dataclasses.replace(unbounded_metadata(2), term_holder="w2")     # term 2, another holder
    failure = only(recovery.step(ev.MetadataConflict(metadata=other, version=MARKED + 1)), ev.FailRecovery)
    assert "term 2" in str(failure.error)


def test_entries_read_past_one_not_read_yet_are_written_back_only_once_it_is():
    """Reads run ahead of write-backs: e1 and e2 arrive before e0, and nothing is written back until
    e0 is; when e0 turns out absent, e1 and e2 are never written back (a late write-back past the
    end would land after the no-op, over an entry of the next writer: simulator seeds 220398, 237145)."""
    recovery = make_recovery(window=4)
    fence(recovery, {"B1": -1, "B2": -1, "B3": -1})
    late = [make_entry(1), make_entry(2)]
    commands = recovery.step(ev.EntriesRead(bookie="B1", ledger_id=LEDGER_ID, entries=late, missing=[0], lac=-1))
    assert sent_adds(commands) == {}
    commands = recovery.step(ev.EntriesRead(bookie="B2", ledger_id=LEDGER_ID, entries=[], missing=[0], lac=-1))
    assert recovery.last_entry_id == -1                          # e0 is absent: the ledger ends before it
    assert sent_adds(commands) == {} and of_type(commands, ev.WriteMetadata)

    recovery = make_recovery(window=4)
    fence(recovery, {"B1": -1, "B2": -1, "B3": -1})
    recovery.step(ev.EntriesRead(bookie="B1", ledger_id=LEDGER_ID, entries=late, missing=[], lac=-1))
    commands = recovery.step(ev.EntriesRead(bookie="B2", ledger_id=LEDGER_ID, entries=[make_entry(0)], missing=[],
                                            lac=-1))
    assert {bookie: sorted(ids) for bookie, ids in sent_adds(commands).items()} == {
        "B1": [0, 1, 2], "B2": [0, 1, 2], "B3": [0, 1, 2]}             # all of them, once e0 is in


def test_an_entry_that_arrives_after_it_was_proven_absent_is_not_written_back():
    """Qw=3, Qa=2: two bookies' NO_SUCH_ENTRY prove e0 absent (QC = 2); the third bookie's copy
    arriving afterwards must not be written back at the id the no-op will take."""
    recovery = make_recovery(window=4)
    fence(recovery, {"B1": -1, "B2": -1, "B3": -1})
    recovery.step(ev.EntriesRead(bookie="B1", ledger_id=LEDGER_ID, entries=[], missing=[0, 1], lac=-1))
    recovery.step(ev.EntriesRead(bookie="B2", ledger_id=LEDGER_ID, entries=[], missing=[0, 1], lac=-1))
    assert recovery.last_entry_id == -1
    commands = recovery.step(ev.EntriesRead(bookie="B3", ledger_id=LEDGER_ID, entries=[make_entry(0)], missing=[],
                                            lac=-1))
    assert sent_adds(commands) == {}


def test_metadata_from_a_newer_walkit_is_refused_by_name_not_half_read():
    import json

    import pytest
    from walkit.errors import ConfigError
    doc = json.loads(make_metadata().to_bytes())
    doc["from_the_future"] = 1
    with pytest.raises(ConfigError, match="from_the_future"):
        LedgerMetadata.from_bytes(json.dumps(doc).encode())
    held = dataclasses.replace(unbounded_metadata(2), term_holder="w2")
    assert LedgerMetadata.from_bytes(held.to_bytes()) == held
