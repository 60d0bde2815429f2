"""LogReader: what a following reader does when the ledger it reads is deleted (walkit.core.logreader)."""

from __future__ import annotations

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.loglist import LogMetadata, LogSegment
from walkit.core.logreader import LogReader
from walkit.core.messages import Status
from walkit.core.metadata import LedgerMetadata
from walkit.errors import LogTruncated

from .helpers import bookies, make_entry, of_type, only

NAME = "orders"
B = bookies(3)


def open_ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles={0: B})


def listed(*ledger_ids: int, truncated_to: int = -1) -> lev.LogMetadataRead:
    metadata = LogMetadata(name=NAME, segments=tuple(LogSegment(i) for i in ledger_ids), truncated_to=truncated_to)
    return lev.LogMetadataRead(name=NAME, metadata=metadata, version=1)


def lac(reader: LogReader, ledger_id: int, value: int) -> list:
    """lac answers the reader's long poll (a TailReader's read, or a LacReader's) from every bookie: LAC `value`, no entry."""
    out: list = []
    for bookie in B:
        out += reader.step(ev.EntriesRead(bookie=bookie, ledger_id=ledger_id, entries=[], missing=[], lac=value))
        out += reader.step(ev.LacRead(bookie=bookie, ledger_id=ledger_id, status=Status.OK, lac=value))
    return out


def following(ledger_id: int) -> LogReader:
    """following returns a following reader long-polling `ledger_id` (OPEN, nothing confirmed yet)."""
    reader = LogReader(NAME, follow=True, poll_ms=100)
    reader.start()
    assert reader.step(listed(ledger_id)) == [ev.ReadLedgerMetadata(ledger_id=ledger_id)]
    reader.step(ev.LedgerMetadataRead(ledger_id=ledger_id, metadata=open_ledger(ledger_id), version=0))
    return reader


def test_a_ledger_a_new_writer_dropped_empty_is_passed_over():
    # Writer A died with ledger 11 empty; writer B's open recovered it empty, dropped it from the
    # list and deleted it. Nothing was lost, so the follower goes on to B's ledger 12.
    reader = following(11)
    assert lac(reader, 11, -1) == [lev.ReaderCaughtUp(position=None),
                                   ev.ReadLedgerMetadata(ledger_id=11)]    # nothing new: is it closed?
    assert reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=None, version=-1)) == [
        lev.ReadLogMetadata(name=NAME)]
    assert reader.step(listed(12)) == [ev.ReadLedgerMetadata(ledger_id=12)]
    assert not reader.done


def test_a_deleted_ledger_the_list_still_names_is_log_truncated():
    reader = following(11)
    lac(reader, 11, -1)
    reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=None, version=-1))
    assert reader.step(listed(11, 12)) == [ev.ReadLedgerMetadata(ledger_id=11)]
    failed = only(reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=None, version=-1)), ev.FailRead)
    assert isinstance(failed.error, LogTruncated)


def test_a_deleted_ledger_records_of_which_were_delivered_is_log_truncated():
    reader = following(11)
    reads = lac(reader, 11, 0)                                              # entry 0 confirmed: read it
    send = only(reads, ev.SendRead)
    delivered = reader.step(ev.EntriesRead(bookie=send.bookie, ledger_id=11, missing=[], lac=0,
                                           entries=[make_entry(0, b"r0", ledger_id=11)]))
    assert [e.payload for e in only(delivered, lev.DeliverRecords).entries] == [b"r0"]
    reader.step(ev.EntriesConsumed(upto=0, ledger_id=11))
    assert reader.delivered is not None and reader.delivered.ledger_id == 11
    commands = lac(reader, 11, 0)                                           # nothing new: is it closed?
    assert commands == [lev.ReaderCaughtUp(position=reader.delivered), ev.ReadLedgerMetadata(ledger_id=11)]
    failed = only(reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=None, version=-1)), ev.FailRead)
    assert isinstance(failed.error, LogTruncated)


def test_an_idle_follower_long_polls_and_a_log_change_makes_it_look_at_once():
    reader = LogReader(NAME, follow=True, poll_ms=100, long_poll_ms=30_000)
    reader.start()
    reader.step(listed(11))
    polls = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
    # held until something new: entry 0 and the LAC that confirms it, of the replica that stores entry 1 too
    assert polls == [ev.SendRead(bookie="B2", ledger_id=11, entry_ids=[0], previous_lac=-1, timeout_ms=30_000)]
    assert reader.step(lev.LogChanged()) == [ev.ReadLedgerMetadata(ledger_id=11)]  # a watch fired: look now
    again = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=1))
    assert [(p.previous_lac, p.timeout_ms) for p in again] == [(-1, 30_000)]       # still open: held again


def test_after_a_failed_read_the_follower_asks_the_lac_plainly_before_it_long_polls_again():
    reader = LogReader(NAME, follow=True, poll_ms=100, long_poll_ms=30_000)
    reader.start()
    reader.step(listed(11))
    reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
    out: list = []
    for bookie in ("B2", "B1"):       # the first replica failed, so the other was asked at once: it fails too
        out += reader.step(ev.ReadFailed(bookie=bookie, ledger_id=11, entry_ids=[0], status=Status.UNREACHABLE))
    retrying = only(out, lev.ReaderRetrying)
    assert retrying.failures == 1
    reader.step(ev.Ticked(now_ms=200, wall_ms=200))
    plain = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
    assert {p.timeout_ms for p in plain} == {0}                  # its answer says the bookies are back
    assert lac(reader, 11, -1)[0] == lev.ReaderCaughtUp(position=None)
    again = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
    assert {p.timeout_ms for p in again} == {30_000}


def caught_up_lingering(linger_ms: int = 20) -> tuple[LogReader, list]:
    """caught_up_lingering is a following reader with `linger_ms` that delivered entry 0 of ledger 11 and was told,
    at 1,000 ms, that it was consumed (what it answered to that)."""
    reader = LogReader(NAME, follow=True, poll_ms=100, long_poll_ms=30_000, linger_ms=linger_ms)
    reader.start()
    reader.step(listed(11))
    [poll] = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
    delivered = reader.step(ev.EntriesRead(bookie=poll.bookie, ledger_id=11, missing=[], lac=0,
                                           entries=[make_entry(0, b"r0", ledger_id=11)]))
    assert [e.payload for e in only(delivered, lev.DeliverRecords).entries] == [b"r0"]
    return reader, reader.step(ev.EntriesConsumed(upto=0, ledger_id=11, now_ms=1_000))


def test_a_caught_up_follower_with_linger_waits_before_its_next_long_poll_and_says_until_when():
    reader, consumed = caught_up_lingering(20)
    assert consumed == [lev.ReaderCaughtUp(position=reader.delivered, wake_at_ms=1_020)]   # no request yet
    assert reader.step(ev.Ticked(now_ms=1_019, wall_ms=1_019)) == []
    polls = reader.step(ev.Ticked(now_ms=1_020, wall_ms=1_020))
    assert [(p.entry_ids, p.previous_lac, p.timeout_ms) for p in polls] == [([1], 0, 30_000)]


def test_after_a_linger_the_entries_its_long_poll_confirms_come_together_from_one_range_read():
    reader, _ = caught_up_lingering(20)
    [poll] = reader.step(ev.Ticked(now_ms=1_020, wall_ms=1_020))
    # the answer brings entry 1 and a LAC of 4: entry 1 is left to the range read of 1..4, not delivered alone
    reads = reader.step(ev.EntriesRead(bookie=poll.bookie, ledger_id=11, missing=[], lac=4,
                                       entries=[make_entry(1, b"r1", ledger_id=11)]))
    assert not of_type(reads, lev.DeliverRecords)
    sends = of_type(reads, ev.SendRead)
    assert sorted(i for s in sends for i in s.entry_ids) == [1, 2, 3, 4]
    out: list = []
    for send in sends:
        out += reader.step(ev.EntriesRead(bookie=send.bookie, ledger_id=11, missing=[], lac=4,
                                          entries=[make_entry(i, b"r%d" % i, ledger_id=11) for i in send.entry_ids]))
    assert [e.payload for d in of_type(out, lev.DeliverRecords) for e in d.entries] == [b"r1", b"r2", b"r3", b"r4"]


def test_without_linger_a_caught_up_follower_long_polls_at_once():
    reader, consumed = caught_up_lingering(0)
    assert consumed[0] == lev.ReaderCaughtUp(position=reader.delivered)
    assert [(p.entry_ids, p.previous_lac) for p in consumed[1:]] == [([1], 0)]


def test_catch_up_ends_a_linger_and_a_log_change_during_one_reads_the_ledger_again():
    reader, _ = caught_up_lingering(20)
    polls = reader.step(lev.CatchUp())                      # a read barrier waits on the follower
    assert [(p.entry_ids, p.previous_lac) for p in polls] == [([1], 0)]
    assert reader.step(lev.CatchUp()) == []                 # long-polling already: nothing more
    reader, _ = caught_up_lingering(20)
    assert reader.step(lev.LogChanged()) == [ev.ReadLedgerMetadata(ledger_id=11)]    # closed, say: look first
    assert reader.step(ev.Ticked(now_ms=1_020, wall_ms=1_020)) == []                # the linger is over


def test_a_log_change_while_the_caller_applies_is_looked_at_before_the_next_long_poll():
    # A roll may close the ledger while the caller still applies what the reader delivered: the reader then
    # reads the ledger's metadata before it long-polls again, not a long poll of a closed ledger (30 s).
    for linger in (0, 20):
        reader = LogReader(NAME, follow=True, poll_ms=100, long_poll_ms=30_000, linger_ms=linger)
        reader.start()
        reader.step(listed(11))
        [poll] = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=0))
        reader.step(ev.EntriesRead(bookie=poll.bookie, ledger_id=11, missing=[], lac=0,
                                   entries=[make_entry(0, b"r0", ledger_id=11)]))
        assert reader.step(lev.LogChanged()) == []                                 # parked: the caller applies
        out = reader.step(ev.EntriesConsumed(upto=0, ledger_id=11, now_ms=1_000))
        if linger:
            out = reader.step(ev.Ticked(now_ms=1_020, wall_ms=1_020))
        assert [c for c in out if not isinstance(c, lev.ReaderCaughtUp)] == [ev.ReadLedgerMetadata(ledger_id=11)]
        again = reader.step(ev.LedgerMetadataRead(ledger_id=11, metadata=open_ledger(11), version=1))
        assert [(p.entry_ids, p.previous_lac) for p in again] == [([1], 0)]       # still open: polled now
