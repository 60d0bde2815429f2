"""LedgerWriter with deferred sync (BookKeeper's WriteFlag.DEFERRED_SYNC) and forces on any ledger.

Adds complete at Qa acknowledgements; the LAC moves only over entries that Qa bookies
acknowledged before answering a force from the same run; the ensemble never changes.
"""

from __future__ import annotations

import dataclasses

import pytest

from walkit.core import events as ev
from walkit.core.messages import Status
from walkit.core.writer import LedgerWriter
from walkit.errors import ConfigError, LedgerFenced, NotEnoughBookies

from .helpers import DIGEST, LEDGER_ID, MASTER_KEY, make_metadata, of_type
from .test_writer import VERSION, append, completed, make_writer, reject


def deferred(ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2, **options) -> LedgerWriter:
    return make_writer(ensemble_size, write_quorum, ack_quorum, deferred_sync=True, **options)


def ack(writer: LedgerWriter, bookie: str, *entry_ids: int, instance: int = 1) -> list:
    return writer.step(ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids), instance=instance))


def force(writer: LedgerWriter, token: int = 1) -> list:
    return writer.step(ev.ForceRequested(token=token))


def forced(writer: LedgerWriter, bookie: str, instance: int = 1) -> list:
    return writer.step(ev.ForceAcked(bookie=bookie, ledger_id=LEDGER_ID, instance=instance))


def ack_all(writer: LedgerWriter, first: int, last: int) -> list:
    """ack_all acknowledges entries first..last from every bookie of their write sets (E3/Qw2: Bi, Bi+1)."""
    commands: list = []
    for entry_id in range(first, last + 1):
        for bookie in (f"B{entry_id % 3 + 1}", f"B{(entry_id + 1) % 3 + 1}"):
            commands += ack(writer, bookie, entry_id)
    return commands


def forces_sent(commands: list) -> list[str]:
    return sorted(c.bookie for c in of_type(commands, ev.SendForce))


def test_adds_are_sent_with_the_deferred_sync_flag():
    writer = deferred()
    assert all(c.deferred_sync for c in of_type(append(writer, 3), ev.SendAdds))
    assert not any(c.deferred_sync for c in of_type(append(make_writer(3, 2, 2), 3), ev.SendAdds))


def test_adds_complete_at_ack_quorum_but_the_lac_stays_until_forced():
    writer = deferred()
    append(writer, 3)
    assert completed(ack_all(writer, 0, 2)) == [0, 1, 2]
    assert writer.last_add_acked == 2 and writer.last_add_confirmed == -1
    # Entries sent meanwhile carry the forced LAC, so readers cannot see unforced entries.
    assert {e.lac for c in of_type(append(writer, 1), ev.SendAdds) for e in c.entries} == {-1}


def test_force_sends_one_round_to_every_bookie_and_completes_once_qa_answered():
    writer = deferred()
    append(writer, 3)
    ack_all(writer, 0, 2)
    round_ = force(writer, token=7)
    assert forces_sent(round_) == ["B1", "B2", "B3"]
    assert force(writer, token=8) == []                   # one round at a time; the second waits for it
    assert forced(writer, "B1") == []
    done = forced(writer, "B2")
    # B1 and B2 answered: entries 0 (B1, B2) and 1 (B2, B3 -> only B2) ... entry 0 only.
    assert writer.last_add_confirmed == 0 and of_type(done, ev.CompleteForce) == []
    done = forced(writer, "B3")
    assert writer.last_add_confirmed == 2
    assert of_type(done, ev.CompleteForce) == [ev.CompleteForce(ledger_id=LEDGER_ID, tokens=[7, 8], last_entry_id=2)]


def test_an_acknowledgement_that_arrives_after_the_force_was_sent_needs_another_round():
    writer = deferred(3, 3, 3)
    append(writer, 1)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    force(writer)                                         # B3 has not acknowledged entry 0 yet
    ack(writer, "B3", 0)
    for bookie in ("B1", "B2"):
        forced(writer, bookie)
    done = forced(writer, "B3")
    # B3's answer may predate its add: the round covers nothing of B3's, so a second round starts.
    assert writer.last_add_confirmed == -1
    assert forces_sent(done) == ["B1", "B2", "B3"]
    for bookie in ("B1", "B2", "B3"):
        done = forced(writer, bookie)
    assert of_type(done, ev.CompleteForce)[0].last_entry_id == 0


def test_a_force_answered_by_a_restarted_bookie_fails_the_writer():
    writer = deferred()
    append(writer, 1)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    force(writer, token=3)
    forced(writer, "B1")
    failed = forced(writer, "B2", instance=2)
    assert isinstance(writer.error, NotEnoughBookies) and "restarted" in str(writer.error)
    assert of_type(failed, ev.FailForce)[0].tokens == [3]
    assert writer.last_add_confirmed == -1


def test_an_acknowledgement_from_a_restarted_bookie_fails_the_writer():
    writer = deferred()
    append(writer, 2)
    ack(writer, "B2", 0)
    ack(writer, "B2", 1, instance=9)
    assert isinstance(writer.error, NotEnoughBookies)


def test_a_failed_bookie_ends_the_writer_without_an_ensemble_change():
    writer = deferred()
    append(writer, 3)
    ack_all(writer, 0, 0)
    commands = reject(writer, "B2", 1)
    assert of_type(commands, ev.ChooseBookies) == [] and of_type(commands, ev.WriteMetadata) == []
    assert isinstance(writer.error, NotEnoughBookies) and "deferred-sync" in str(writer.error)
    # Entry 0 completed before; the failure starts after it.
    assert of_type(commands, ev.FailAdds)[0].first_entry_id == 1


def test_a_fenced_force_fails_the_writer_with_ledger_fenced():
    writer = deferred()
    append(writer, 1)
    ack_all(writer, 0, 0)
    force(writer, token=4)
    commands = writer.step(ev.AddsRejected(bookie="B1", ledger_id=LEDGER_ID, entry_ids=[], status=Status.FENCED))
    assert isinstance(writer.error, LedgerFenced)
    assert of_type(commands, ev.FailForce)[0].tokens == [4]


def test_close_forces_everything_then_closes_at_the_forced_lac():
    writer = deferred()
    append(writer, 3)
    ack_all(writer, 0, 2)
    commands = writer.step(ev.CloseRequested())
    assert forces_sent(commands) == ["B1", "B2", "B3"] and of_type(commands, ev.WriteMetadata) == []
    commands = forced(writer, "B1") + forced(writer, "B2") + forced(writer, "B3")
    closing = of_type(commands, ev.WriteMetadata)
    assert len(closing) == 1 and closing[0].metadata.last_entry_id == 2


def test_appends_that_must_queue_start_a_force_so_a_writer_that_never_forces_goes_on():
    writer = deferred(max_bytes_in_flight=4)
    append(writer, 2)                                      # two 2-byte payloads fill the window
    ack_all(writer, 0, 1)
    commands = append(writer, 1)
    assert of_type(commands, ev.SendAdds) == [] and writer.queued_count == 1
    assert forces_sent(commands) == ["B1", "B2", "B3"]
    commands = forced(writer, "B1") + forced(writer, "B2") + forced(writer, "B3")
    assert writer.last_add_confirmed == 1
    assert [e.entry_id for c in of_type(commands, ev.SendAdds) for e in c.entries] == [2, 2]


def test_a_slow_bookie_does_not_time_out_entries_already_acknowledged():
    writer = deferred(3, 3, 2, add_timeout_ms=100)
    append(writer, 1)
    ack(writer, "B1", 0)
    ack(writer, "B2", 0)
    assert writer.step(ev.Ticked(now_ms=500)) == []       # B3 never answered, and nothing waits on it
    assert writer.error is None


def test_a_force_covers_appends_still_queued():
    writer = deferred(max_bytes_in_flight=2)
    append(writer, 3)                                      # one sent, two queued behind it
    commands = force(writer, token=5)
    acked, rounds = 0, 0
    while not of_type(commands, ev.CompleteForce):
        assert writer.error is None and rounds < 10
        commands = ack_all(writer, acked, writer.last_add_pushed)
        acked = writer.last_add_pushed + 1
        for bookie in forces_sent(commands) or ["B1", "B2", "B3"]:
            commands += forced(writer, bookie)
        rounds += 1
        if writer.last_add_confirmed < 2:
            assert of_type(commands, ev.CompleteForce) == []
    assert of_type(commands, ev.CompleteForce)[0].tokens == [5] and writer.last_add_confirmed == 2


def test_force_on_an_ordinary_ledger_completes_when_the_appends_before_it_complete():
    writer = make_writer(3, 2, 2)
    append(writer, 2)
    assert force(writer, token=1) == []                    # no force requests: acks are durable
    commands = writer.step(ev.AddsAcked(bookie="B1", ledger_id=LEDGER_ID, entry_ids=[0]))
    commands += writer.step(ev.AddsAcked(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0, 1]))
    commands += writer.step(ev.AddsAcked(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[1]))
    assert of_type(commands, ev.CompleteForce) == [ev.CompleteForce(ledger_id=LEDGER_ID, tokens=[1], last_entry_id=1)]
    assert of_type(force(writer, token=2), ev.CompleteForce)[0].tokens == [2]      # nothing left: at once


def test_deferred_sync_refuses_guaranteed_write_quorum():
    metadata = dataclasses.replace(make_metadata(3, 2, 2), guaranteed_write_quorum=True)
    with pytest.raises(ConfigError, match="deferred sync"):
        LedgerWriter(metadata, VERSION, master_key=MASTER_KEY, digest=DIGEST, deferred_sync=True)


def test_a_forced_lac_is_announced_while_later_entries_wait_for_a_force():
    writer = deferred(explicit_lac_ms=100)
    append(writer, 1)
    ack_all(writer, 0, 0)
    force(writer, token=1)
    sent = append(writer, 1)                               # e1 goes out while the force runs, with LAC -1
    assert {e.lac for c in of_type(sent, ev.SendAdds) for e in c.entries} == {-1}
    ack_all(writer, 1, 1)
    done = forced(writer, "B1") + forced(writer, "B2") + forced(writer, "B3")
    assert of_type(done, ev.CompleteForce)[0].last_entry_id == 0 and writer.pending_count == 1
    lacs = [c.lac for t in (50, 150) for c in of_type(writer.step(ev.Ticked(now_ms=t)), ev.SendWriteLac)]
    assert lacs == [0, 0, 0]                               # to each bookie, after 100 ms idle
    for bookie in ("B1", "B2", "B3"):
        writer.step(ev.LacWritten(bookie=bookie, ledger_id=LEDGER_ID, lac=0))
    assert [c for t in (250, 350) for c in of_type(writer.step(ev.Ticked(now_ms=t)), ev.SendWriteLac)] == []


def test_a_late_force_answer_while_closing_does_not_fail_the_close():
    writer = deferred(3, 3, 2)
    append(writer, 1)
    for bookie in ("B1", "B2"):
        ack(writer, bookie, 0)
    closing = writer.step(ev.CloseRequested())
    assert forces_sent(closing) == ["B1", "B2", "B3"]
    forced(writer, "B1")
    cas = of_type(forced(writer, "B2"), ev.WriteMetadata)
    assert len(cas) == 1 and writer.state.name == "CLOSING"
    assert forced(writer, "B3", instance=7) == []          # a restarted B3 answers late: nothing waits on it
    done = writer.step(ev.MetadataWritten(metadata=cas[0].metadata, version=VERSION + 1))
    assert of_type(done, ev.CompleteClose) and writer.error is None
