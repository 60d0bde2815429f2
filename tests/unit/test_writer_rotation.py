"""LedgerWriter rotation: an unbounded ledger starts a new fragment once the current one is full.

Seed 001: "for an unbounded ledger we could also set a maximum size per fragment which would
trigger an ensemble change once the current fragment has reached capacity". The rotation is an
ensemble change without a failed bookie (walkit.core.writer, module doc): these tests feed the
machine by hand and check each of its rules.
"""

from __future__ import annotations

import pytest

from walkit.core import events as ev
from walkit.core import writer as writer_module
from walkit.core.messages import Status
from walkit.core.metadata import LedgerMetadata
from walkit.core.writer import CHANGING, CHOOSING, CLEANING, ROTATE_RETRY_MS, WRITING, LedgerWriter
from walkit.errors import ConfigError, NoSuchLedger

from .helpers import DIGEST, LEDGER_ID, MASTER_KEY, bookies, make_metadata, of_type, only, sent_adds

VERSION = 3
DISKS = {"B1": 11, "B2": 12, "B3": 13, "B4": 14, "B5": 15, "B6": 16}


def unbounded(ensemble: int = 3, write_quorum: int = 3, ack_quorum: int = 2, *, first: int = 0,
              fragments: dict[int, tuple[str, ...]] | None = None) -> LedgerMetadata:
    """unbounded returns an OPEN unbounded ledger in term 1 on B1..BE, recording each bookie's disk."""
    fragments = fragments or {first: bookies(ensemble)}
    disks = {start: tuple(DISKS[b] for b in members) for start, members in fragments.items()}
    return LedgerMetadata(ledger_id=LEDGER_ID, ensemble_size=ensemble, write_quorum=write_quorum,
                          ack_quorum=ack_quorum, ensembles=fragments, guaranteed_write_quorum=True, unbounded=True,
                          term=1, disks=disks)


def make_writer(metadata: LedgerMetadata | None = None, **options) -> LedgerWriter:
    options.setdefault("fragment_max_entries", 4)
    return LedgerWriter(metadata or unbounded(), VERSION, master_key=MASTER_KEY, digest=DIGEST, **options)


def append(writer: LedgerWriter, count: int = 1) -> list:
    first = writer.last_add_pushed + 1
    return writer.step(ev.AppendRequested(payloads=[f"p{first + i}".encode() for i in range(count)]))


def ack(writer: LedgerWriter, bookie: str, *entry_ids: int) -> list:
    return writer.step(ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids),
                                    disk=DISKS[bookie]))


def ack_all(writer: LedgerWriter, entry_ids, members=("B1", "B2", "B3")) -> list:
    commands: list = []
    for bookie in members:
        commands += ack(writer, bookie, *entry_ids)
    return commands


def chosen(writer: LedgerWriter, *candidates: str, disks: dict[str, int] | None = None, clean: bool = True) -> list:
    """chosen answers the writer's ChooseBookies; with `clean` the bookies it brings in answer their
    cleaning at once, and what is returned is what follows (the CAS), as before cleanings existed."""
    registered = {b: DISKS[b] for b in candidates} if disks is None else disks
    commands = writer.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=list(candidates), disks=registered))
    if not clean or writer.state is not CLEANING:
        return commands
    after = [c for c in commands if not (isinstance(c, ev.SendAdds) and not c.entries)]
    for cleaning in cleanings(commands):
        after += writer.step(ev.AddsAcked(bookie=cleaning.bookie, ledger_id=LEDGER_ID, entry_ids=[],
                                          disk=registered.get(cleaning.bookie, 0)))
    return after


def cleanings(commands: list) -> list[ev.SendAdds]:
    """cleanings are the empty truncating adds a change sends the bookies it brings in."""
    return [c for c in of_type(commands, ev.SendAdds) if not c.entries]


def written(writer: LedgerWriter, metadata: LedgerMetadata, version: int = VERSION + 1) -> list:
    return writer.step(ev.MetadataWritten(metadata=metadata, version=version))


def completed(commands: list) -> list[int]:
    return [c.last_entry_id for c in of_type(commands, ev.CompleteAdds)]


def full_fragment(writer: LedgerWriter, pending: int = 2) -> list:
    """full_fragment appends 4 + `pending` entries and replicates entries 0-3 everywhere: the rotation starts."""
    append(writer, 4 + pending)
    return ack_all(writer, range(4))


# -- when it rotates --------------------------------------------------------------------------------
def test_the_writer_rotates_once_the_fragment_holds_max_entries_on_every_write_quorum_bookie():
    writer = make_writer()
    append(writer, 6)
    commands = ack_all(writer, range(3))
    assert completed(commands) == [2] and writer.state is WRITING               # three entries: not full
    commands = ack_all(writer, [3])
    choose = only(commands, ev.ChooseBookies)
    assert writer.state is CHOOSING and writer.last_add_fully_replicated == 3
    assert choose.exclude == frozenset() and choose.ensemble == ("B1", "B2", "B3")
    assert choose.replacing == ("B2", "B3", "B1") and choose.write_quorum == 3       # from position 1 (1 fragment)


def test_a_fresh_placement_takes_bookies_outside_the_ensemble_and_starts_at_lafr_plus_one():
    writer = make_writer()
    full_fragment(writer)
    proposal = only(chosen(writer, "B5", "B4", "B6", "B1", "B2", "B3"), ev.WriteMetadata)
    assert writer.state is CHANGING and proposal.expected_version == VERSION
    assert dict(proposal.metadata.ensembles) == {0: ("B1", "B2", "B3"), 4: ("B6", "B5", "B4")}   # for B2, B3, B1
    assert proposal.metadata.disks[4] == (16, 15, 14)           # new bookies: the disks they registered with
    assert proposal.metadata.term == 1 and proposal.metadata.first_entry_id == 0


def test_the_pending_adds_go_to_the_new_bookies_only_after_the_cas_and_complete_in_order():
    writer = make_writer()
    full_fragment(writer, pending=2)                           # entries 4 and 5 are pending on B1-B3
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    during = ack_all(writer, [4, 5]) + append(writer, 1)       # entry 6 goes to the old write set meanwhile
    assert completed(during) == [] and sent_adds(during) == {"B1": [6], "B2": [6], "B3": [6]}
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {"B4": [4, 5, 6], "B5": [4, 5, 6], "B6": [4, 5, 6]}
    assert completed(commands) == [] and writer.state is WRITING
    assert ack(writer, "B1", 4, 5, 6) == []                    # old bookies no longer count
    assert completed(ack(writer, "B5", 5, 6) + ack(writer, "B6", 5) + ack(writer, "B4", 4)) == []   # 4 first
    assert completed(ack(writer, "B6", 4)) == [5]
    assert completed(ack(writer, "B4", 5, 6)) == [6]
    ack(writer, "B5", 4)
    ack(writer, "B6", 6)
    assert writer.last_add_fully_replicated == 6 and writer.pending_count == 0


def test_rotation_counts_bytes_of_fully_replicated_entries_and_then_starts_again_from_zero():
    writer = make_writer(fragment_max_entries=0, fragment_max_bytes=10)
    writer.step(ev.AppendRequested(payloads=[b"12345", b"1234", b"1"]))
    assert of_type(ack_all(writer, [0, 1]), ev.ChooseBookies) == []      # 9 bytes
    only(ack_all(writer, [2]), ev.ChooseBookies)                           # 10 bytes
    proposal = only(chosen(writer, "B1", "B2", "B3"), ev.WriteMetadata)
    written(writer, proposal.metadata)
    writer.step(ev.AppendRequested(payloads=[b"123456789"]))
    assert of_type(ack_all(writer, [3]), ev.ChooseBookies) == []


def test_rotation_by_age_comes_with_a_tick_once_a_fully_replicated_entry_is_in_the_fragment():
    writer = make_writer(fragment_max_entries=0, fragment_max_ms=1000, now_ms=0)
    assert writer.step(ev.Ticked(now_ms=1000)) == []             # an empty fragment is not rotated
    writer = make_writer(fragment_max_entries=0, fragment_max_ms=1000, now_ms=0)
    append(writer, 1)
    assert of_type(ack_all(writer, [0]) + writer.step(ev.Ticked(now_ms=999)), ev.ChooseBookies) == []
    assert of_type(writer.step(ev.Ticked(now_ms=1000)), ev.ChooseBookies)


def test_a_takeover_in_a_full_fragment_rotates_at_its_first_tick():
    """A writer that took the ledger over counts its predecessors' entries (by id): it rotates at once."""
    writer = make_writer(unbounded(), last_entry_id=9)          # entries 0-9 and the no-op were written before
    only(writer.step(ev.Ticked(now_ms=1)), ev.ChooseBookies)
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    assert proposal.metadata.last_fragment_start == 10


def test_no_rotation_while_a_close_is_requested_or_without_limits():
    writer = make_writer()
    append(writer, 4)
    writer.step(ev.CloseRequested())
    commands = ack_all(writer, range(4))
    assert of_type(commands, ev.ChooseBookies) == [] and only(commands, ev.WriteMetadata).metadata.is_closed
    plain = LedgerWriter(unbounded(), VERSION, master_key=MASTER_KEY, digest=DIGEST)
    append(plain, 40)
    assert of_type(ack_all(plain, range(40)), ev.ChooseBookies) == []


def test_a_ledger_with_max_rotated_fragments_rotates_again_once_a_truncation_dropped_some(monkeypatch):
    monkeypatch.setattr(writer_module, "MAX_ROTATED_FRAGMENTS", 2)
    metadata = unbounded(fragments={0: ("B4", "B5", "B6"), 10: ("B1", "B2", "B3")})
    writer = make_writer(metadata, last_entry_id=9, now_ms=0)
    append(writer, 6)
    commands = ack_all(writer, range(10, 16))
    assert of_type(commands, ev.ChooseBookies) == [] and only(commands, ev.ReadLedgerMetadata).ledger_id == LEDGER_ID
    assert writer.step(ev.LedgerMetadataRead(ledger_id=LEDGER_ID, metadata=metadata, version=VERSION)) == []
    assert of_type(writer.step(ev.Ticked(now_ms=ROTATE_RETRY_MS - 1)), ev.ReadLedgerMetadata) == []   # a second later
    only(writer.step(ev.Ticked(now_ms=ROTATE_RETRY_MS)), ev.ReadLedgerMetadata)
    other = unbounded(fragments={0: ("B4", "B5", "B6"), 10: ("B1", "B2", "B5")})      # not the writer's fragment
    assert writer.step(ev.LedgerMetadataRead(ledger_id=LEDGER_ID, metadata=other, version=VERSION + 1)) == []
    truncated = metadata.truncated(12)
    choose = only(writer.step(ev.LedgerMetadataRead(ledger_id=LEDGER_ID, metadata=truncated, version=VERSION + 2)),
                  ev.ChooseBookies)
    assert choose.ensemble == ("B1", "B2", "B3") and writer.version == VERSION + 2
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    assert proposal.expected_version == VERSION + 2 and proposal.metadata.first_entry_id == 12
    assert sorted(proposal.metadata.ensembles) == [10, 16]


# -- where it goes -----------------------------------------------------------------------------------
def test_with_no_other_writable_bookie_the_new_fragment_has_the_same_bookies_and_disks():
    writer = make_writer()
    full_fragment(writer)
    proposal = only(chosen(writer, "B2", "B3", "B1"), ev.WriteMetadata)
    assert dict(proposal.metadata.ensembles) == {0: ("B1", "B2", "B3"), 4: ("B1", "B2", "B3")}
    assert proposal.metadata.disks[4] == (11, 12, 13)
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {}                            # the same write sets: nothing to send again
    assert completed(ack(writer, "B1", 4, 5) + ack(writer, "B3", 4, 5)) == [5]


def test_a_spare_bookie_takes_each_position_in_turn_and_the_rest_keep_their_bookie():
    writer = make_writer()
    full_fragment(writer)
    proposal = only(chosen(writer, "B1", "B2", "B3", "B4"), ev.WriteMetadata)
    assert proposal.metadata.current_ensemble == ("B1", "B4", "B3")          # position 1 first (1 fragment)
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {"B4": [4, 5]}
    ack_all(writer, [4, 5], members=("B1", "B4", "B3"))
    append(writer, 4)
    only(ack_all(writer, range(6, 10), members=("B1", "B4", "B3")), ev.ChooseBookies)
    proposal = only(chosen(writer, "B1", "B2", "B3", "B4"), ev.WriteMetadata)
    assert proposal.metadata.current_ensemble == ("B1", "B4", "B2")          # then position 2 (2 fragments)


def test_a_position_no_writable_bookie_can_take_puts_the_rotation_off():
    writer = make_writer(now_ms=0)
    append(writer, 6)
    ack_all(writer, range(4))
    ack(writer, "B1", 4)
    commands = chosen(writer, "B1", "B2")                       # B3 is not writable and there is no spare
    assert of_type(commands, ev.WriteMetadata) == [] and writer.state is WRITING
    assert writer.rotations_put_off == 1
    assert writer.rotation_put_off_because == "no writable bookie for position 2 (B3 is not writable)"
    assert completed(commands) == []
    assert completed(ack(writer, "B2", 4)) == [4]               # completions go on in the old fragment
    assert of_type(ack(writer, "B3", 4) + writer.step(ev.Ticked(now_ms=ROTATE_RETRY_MS - 1)), ev.ChooseBookies) == []
    only(writer.step(ev.Ticked(now_ms=ROTATE_RETRY_MS)), ev.ChooseBookies)


def test_a_bookie_on_another_disk_than_the_fragment_records_is_not_kept():
    writer = make_writer()
    full_fragment(writer)
    commands = chosen(writer, "B1", "B2", "B3", disks={"B1": 11, "B2": 12, "B3": 99})
    assert of_type(commands, ev.WriteMetadata) == [] and writer.state is WRITING
    assert writer.rotation_put_off_because.endswith("(B3 has another disk)")


def test_a_pinned_bookie_keeps_its_position_and_its_confirmed_entries_stay_on_qa_bookies():
    """B1 and B2 acknowledged entry 4 (confirmed at Qa=2, not on Qw=3): they stay where they are."""
    writer = make_writer()
    append(writer, 5)
    ack(writer, "B1", 4)
    ack(writer, "B2", 4)
    choose = only(ack_all(writer, range(4)), ev.ChooseBookies)
    assert writer.last_add_confirmed == 4 and writer.last_add_fully_replicated == 3
    assert choose.replacing == ("B3",)
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    assert proposal.metadata.current_ensemble == ("B1", "B2", "B4")
    assert proposal.metadata.disks[4] == (11, 12, 14)
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {"B4": [4]}
    ack(writer, "B4", 4)
    assert writer.last_add_fully_replicated == 4


# -- failures during a rotation -----------------------------------------------------------------------
def test_a_bookie_failing_while_the_rotation_chooses_turns_it_into_an_ordinary_change():
    writer = make_writer()
    full_fragment(writer)
    writer.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[4, 5], status=Status.IO_ERROR))
    proposal = only(chosen(writer, "B4", "B5", "B6", "B1", "B3"), ev.WriteMetadata)
    assert proposal.metadata.current_ensemble == ("B1", "B4", "B3")     # only the failed bookie is replaced
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {"B4": [4, 5]}


def test_a_bookie_failing_while_the_rotation_writes_is_replaced_by_a_second_change():
    writer = make_writer()
    full_fragment(writer)
    proposal = only(chosen(writer, "B1", "B2", "B3"), ev.WriteMetadata)        # the same bookies
    writer.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[4], status=Status.IO_ERROR))
    commands = written(writer, proposal.metadata)
    again = only(commands, ev.ChooseBookies)
    assert writer.state is CHOOSING and again.replacing == ("B2",) and "B2" in again.exclude
    second = only(chosen(writer, "B5"), ev.WriteMetadata)
    assert dict(second.metadata.ensembles) == {0: ("B1", "B2", "B3"), 4: ("B1", "B5", "B3")}


def test_no_answer_to_the_rotation_s_choice_puts_it_off_and_completions_resume():
    writer = make_writer(now_ms=0, add_timeout_ms=500)
    full_fragment(writer)
    assert writer.state is CHOOSING
    ack(writer, "B1", 4)
    ack(writer, "B2", 4)
    assert writer.rotations_put_off == 0
    commands = writer.step(ev.Ticked(now_ms=500))
    assert writer.state is WRITING and writer.error is None and completed(commands) == [4]
    assert (writer.rotations_put_off, writer.rotation_put_off_because) == (1, "no bookies chosen within 500 ms")


def test_a_bookie_failed_while_an_unanswered_rotation_waited_is_replaced_when_it_is_put_off():
    writer = make_writer(now_ms=0, add_timeout_ms=500)
    full_fragment(writer)
    writer.step(ev.AddsRejected(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[4], status=Status.IO_ERROR))
    choose = only(writer.step(ev.Ticked(now_ms=500)), ev.ChooseBookies)
    assert writer.state is CHOOSING and "B3" in choose.exclude and choose.replacing == ("B3",)
    assert dict(only(chosen(writer, "B6"), ev.WriteMetadata).metadata.ensembles)[4] == ("B1", "B2", "B6")


def test_a_conflict_with_a_truncation_re_reads_and_rotates_on_the_new_version():
    writer = make_writer()
    full_fragment(writer)
    only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    truncated = unbounded().truncated(2)                       # a client truncated meanwhile
    commands = writer.step(ev.MetadataConflict(metadata=truncated, version=VERSION + 7))
    again = only(commands, ev.ChooseBookies)
    assert writer.state is CHOOSING and again.ensemble == ("B1", "B2", "B3")
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    assert proposal.expected_version == VERSION + 7 and proposal.metadata.first_entry_id == 2
    assert dict(proposal.metadata.ensembles) == {0: ("B1", "B2", "B3"), 4: ("B6", "B4", "B5")}


def test_a_conflict_with_another_term_fails_the_writer_as_fenced():
    writer = make_writer()
    full_fragment(writer)
    only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    taken = unbounded().in_recovery("other")
    commands = writer.step(ev.MetadataConflict(metadata=taken, version=VERSION + 2))
    assert only(commands, ev.FailAdds).first_entry_id == 4 and writer.error is not None


def test_a_deleted_ledger_fails_the_rotating_writer():
    writer = make_writer()
    full_fragment(writer)
    only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    commands = writer.step(ev.MetadataFailed(ledger_id=LEDGER_ID, error=NoSuchLedger("gone")))
    assert only(commands, ev.FailAdds).first_entry_id == 4


# -- settings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["fragment_max_entries", "fragment_max_bytes", "fragment_max_ms"])
def test_fragment_limits_are_non_negative_integers_for_unbounded_ledgers_only(option):
    with pytest.raises(ConfigError, match=option):
        make_writer(**{option: -1})
    with pytest.raises(ConfigError, match=option):
        make_writer(**{option: 1.5})
    with pytest.raises(ConfigError, match="only unbounded ledgers rotate"):
        LedgerWriter(make_metadata(), VERSION, master_key=MASTER_KEY, digest=DIGEST, **{option: 10})


# -- cleaning the bookies a change brings in (docs/internals/protocol.md#stale-bookie) -------------
def test_a_rotation_cleans_the_bookies_it_brings_in_and_proposes_only_once_each_answered():
    writer = make_writer()
    full_fragment(writer)                                      # entries 4 and 5 pending; LAFR 3
    commands = chosen(writer, "B4", "B5", "B6", clean=False)
    sent = cleanings(commands)
    assert writer.state is CLEANING and of_type(commands, ev.WriteMetadata) == []
    assert {c.bookie for c in sent} == {"B4", "B5", "B6"}
    assert all(c.truncate and c.truncate_from == 4 and c.term == 1 for c in sent)   # (term, fragment start)
    assert ack(writer, "B4") == [] and ack(writer, "B6") == [] and writer.state is CLEANING
    assert ack(writer, "B6") == []                             # a duplicate answer changes nothing
    proposal = only(ack(writer, "B5"), ev.WriteMetadata)
    assert writer.state is CHANGING and set(dict(proposal.metadata.ensembles)[4]) == {"B4", "B5", "B6"}


def test_a_rotation_to_the_same_bookies_and_a_bounded_ledger_s_change_clean_nobody():
    writer = make_writer()
    full_fragment(writer)
    commands = chosen(writer, "B1", "B2", "B3", clean=False)
    assert cleanings(commands) == [] and writer.state is CHANGING
    bounded = LedgerWriter(make_metadata(), VERSION, master_key=MASTER_KEY,
                           digest=DIGEST)
    bounded.step(ev.AppendRequested(payloads=[b"x"]))
    bounded.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.IO_ERROR))
    commands = bounded.step(ev.BookiesChosen(ledger_id=LEDGER_ID, bookies=["B4"], disks={}))
    assert cleanings(commands) == [] and bounded.state is CHANGING


def test_a_bookie_that_refuses_its_cleaning_puts_the_rotation_off_without_a_cas():
    writer = make_writer(now_ms=0)
    full_fragment(writer)
    chosen(writer, "B4", "B5", "B6", clean=False)
    ack(writer, "B4")
    commands = writer.step(ev.AddsRejected(bookie="B5", ledger_id=LEDGER_ID, entry_ids=[], status=Status.BAD_REQUEST,
                                           message="an older bookie"))
    assert writer.state is WRITING and of_type(commands, ev.WriteMetadata) == [] and writer.error is None
    assert (writer.rotations_put_off, writer.rotation_put_off_because) == (1, "cleaning B5 failed")
    assert completed(ack_all(writer, [4])) == [4]              # writing goes on in the current fragment
    assert ack(writer, "B6") == []                             # a late answer finds no cleaning


def test_an_unanswered_cleaning_in_a_replacement_chooses_again_without_that_bookie():
    writer = make_writer(now_ms=0, add_timeout_ms=500, fragment_max_entries=0)
    append(writer, 2)
    writer.step(ev.AddsRejected(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0, 1], status=Status.IO_ERROR))
    cleaning = only(cleanings(chosen(writer, "B4", clean=False)), ev.SendAdds)
    assert writer.state is CLEANING and cleaning.bookie == "B4" and cleaning.truncate_from == 0
    choose = only(writer.step(ev.Ticked(now_ms=500)), ev.ChooseBookies)
    assert writer.state is CHOOSING and {"B2", "B4"} <= choose.exclude
    assert writer.step(ev.Ticked(now_ms=510)) == [] and writer.error is None     # a fresh window to choose
    proposal = only(chosen(writer, "B5"), ev.WriteMetadata)
    assert proposal.metadata.current_ensemble == ("B1", "B5", "B3")
    commands = written(writer, proposal.metadata)
    assert sent_adds(commands) == {"B5": [0, 1]}


def test_a_bookie_back_on_a_new_disk_is_cleaned_before_it_takes_its_own_place():
    """Its empty disk may have taken a late add of an older term before this writer's first one."""
    writer = make_writer(fragment_max_entries=0)
    append(writer, 2)
    writer.step(ev.AddsAcked(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], disk=99))    # a new disk answers
    commands = chosen(writer, "B2", disks={"B2": 99}, clean=False)
    cleaning = only(cleanings(commands), ev.SendAdds)
    assert writer.state is CLEANING and cleaning.bookie == "B2" and cleaning.truncate_from == 0
    assert of_type(ack(writer, "B2"), ev.WriteMetadata) == []          # DISKS says 12: the old disk's answer
    assert writer.state is CHOOSING                                      # does not count; chosen again
    proposal = only(chosen(writer, "B2", disks={"B2": 99}), ev.WriteMetadata)
    assert proposal.metadata.disks[0] == (11, 99, 13)


def test_a_late_refusal_of_an_old_cleaning_changes_nothing():
    writer = make_writer()
    full_fragment(writer)
    proposal = only(chosen(writer, "B4", "B5", "B6"), ev.WriteMetadata)
    written(writer, proposal.metadata)
    late = writer.step(ev.AddsRejected(bookie="B5", ledger_id=LEDGER_ID, entry_ids=[], status=Status.UNREACHABLE))
    assert late == [] and writer.state is WRITING and writer.error is None
