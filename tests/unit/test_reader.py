"""RangeReader, LacReader and TailReader: replica fallback, ordered delivery, flow control, LAC reads, tailing."""

from __future__ import annotations

import dataclasses

import pytest

from walkit.core import events as ev
from walkit.core.messages import Status
from walkit.core.reader import SLOW_FOR_MS, LacReader, RangeReader, TailReader
from walkit.errors import BookieError, DigestMismatch, NoSuchEntry, Unauthorized

from .helpers import DIGEST, LEDGER_ID, bookies, corrupt, make_entry, make_metadata, of_type, only, sent_reads


def make_reader(first: int = 0, last: int = 5, ensemble_size: int = 3, write_quorum: int = 2,
                fragments=None, **options) -> RangeReader:
    """make_reader returns a reader of [first, last] on B1..BE (entry e's write set starts at B(e % E + 1))."""
    metadata = make_metadata(ensemble_size, write_quorum, min(write_quorum, 2), fragments=fragments)
    return RangeReader(metadata, first, last, DIGEST, **options)


def answer(reader: RangeReader, bookie: str, entries=(), missing=()) -> list:
    return reader.step(ev.EntriesRead(bookie=bookie, ledger_id=LEDGER_ID, entries=list(entries),
                                      missing=list(missing), lac=-1))


def fail(reader: RangeReader, bookie: str, *entry_ids: int, status: Status = Status.IO_ERROR) -> list:
    return reader.step(ev.ReadFailed(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=list(entry_ids), status=status))


def delivered(commands: list) -> list[int]:
    """delivered lists the entry ids handed over by DeliverEntries commands, in order."""
    return [e.entry_id for c in of_type(commands, ev.DeliverEntries) for e in c.entries]


def read_error(commands: list) -> Exception:
    return only(commands, ev.FailRead).error


# -- where requests go ---------------------------------------------------------------------------
def test_start_asks_each_entry_from_the_first_bookie_of_its_write_set():
    assert sent_reads(make_reader(0, 5).start()) == {"B1": [0, 3], "B2": [1, 4], "B3": [2, 5]}


def test_start_sends_one_request_per_bookie():
    assert len(of_type(make_reader(0, 5).start(), ev.SendRead)) == 3


@pytest.mark.parametrize("first, last, asked", [(0, 0, {"B1": [0]}), (4, 5, {"B2": [4], "B3": [5]}),
                                                 (7, 7, {"B2": [7]})])
def test_a_short_range_asks_only_the_bookies_that_hold_its_entries(first, last, asked):
    commands = make_reader(first, last).start()
    assert sent_reads(commands) == asked
    assert all(command.entry_ids for command in of_type(commands, ev.SendRead))     # no empty request


def test_entries_of_a_later_fragment_are_asked_from_that_fragment():
    reader = make_reader(0, 4, fragments={0: bookies(3), 3: ("B4", "B2", "B3")})
    assert sent_reads(reader.start()) == {"B1": [0], "B2": [1, 4], "B3": [2], "B4": [3]}


def test_missing_entry_is_asked_from_the_next_replica():
    reader = make_reader(0, 0)
    reader.start()
    assert sent_reads(answer(reader, "B1", missing=[0])) == {"B2": [0]}


def test_failed_read_is_asked_from_the_next_replica():
    reader = make_reader(0, 0)
    reader.start()
    assert sent_reads(fail(reader, "B1", 0, status=Status.UNREACHABLE)) == {"B2": [0]}


def test_unanswered_read_is_asked_from_the_next_replica_after_the_timeout():
    reader = make_reader(0, 0, timeout_ms=1000)
    reader.start()
    assert reader.step(ev.Ticked(now_ms=999)) == []
    assert sent_reads(reader.step(ev.Ticked(now_ms=1000))) == {"B2": [0]}


# -- a stalled bookie (SIGSTOP, a partition): one timeout per read, not one per window ----------
def test_a_timeout_moves_every_entry_asked_of_that_bookie_on_at_once():
    reader = make_reader(0, 99, window=4, write_quorum=3, timeout_ms=1000)
    reader.start()                                         # at 0: B1 asked 0, 3; B2 asked 1; B3 asked 2
    answer(reader, "B2", entries=[make_entry(1)])
    reader.step(ev.Ticked(now_ms=600))
    assert sent_reads(answer(reader, "B3", missing=[2])) == {"B1": [2]}      # at 600
    assert sent_reads(reader.step(ev.Ticked(now_ms=1000))) == {"B2": [0, 2, 3]}   # 2 too, though young


def test_a_bookie_that_timed_out_is_asked_last_for_the_rest_of_the_read():
    reader = make_reader(0, 99, window=8, timeout_ms=1000)
    reader.start()
    answer(reader, "B2", entries=[make_entry(1), make_entry(4), make_entry(7)])
    answer(reader, "B3", entries=[make_entry(2), make_entry(5)])
    retried = reader.step(ev.Ticked(now_ms=1000))          # B1 is late with 0, 3, 6
    assert sent_reads(retried) == {"B2": [0, 3, 6]}
    commands = answer(reader, "B2", entries=[make_entry(0), make_entry(3), make_entry(6)])
    commands += reader.step(ev.EntriesConsumed(upto=7))
    assert sent_reads(commands) == {"B3": [8, 11, 14], "B2": [9, 10, 12, 13, 15]}    # none of 8..15 of B1


def test_an_unreachable_report_moves_its_entries_on_and_the_bookie_is_asked_last():
    slow: dict[str, int] = {}
    reader = make_reader(0, 8, timeout_ms=1000, slow=slow)
    reader.start()                                         # B1 holds 0, 3, 6 first
    assert sent_reads(fail(reader, "B1", 0, 3, status=Status.UNREACHABLE)) == {"B2": [0, 3]}
    assert slow == {"B1": SLOW_FOR_MS}                     # 6 stays asked of B1 until its own timeout


def test_a_retry_skips_a_slow_replica_for_a_healthy_one():
    reader = make_reader(0, 2, write_quorum=3, timeout_ms=1000)
    reader.start()
    answer(reader, "B3", entries=[make_entry(2)])
    assert sent_reads(reader.step(ev.Ticked(now_ms=1000))) == {"B3": [0, 1]}   # 0 skips B2: late too
    commands = answer(reader, "B3", missing=[0, 1])
    assert sent_reads(commands) == {"B2": [0], "B1": [1]}                    # the slow ones last


def test_a_slow_bookie_is_still_asked_when_the_other_replica_lacks_the_entry():
    reader = make_reader(0, 99, window=4, timeout_ms=1000)
    reader.start()                                         # B1 holds 0, 3 first
    answer(reader, "B2", entries=[make_entry(1)])
    answer(reader, "B3", entries=[make_entry(2)])
    reader.step(ev.Ticked(now_ms=1000))                    # B1 is late: slow from now on
    answer(reader, "B2", entries=[make_entry(0), make_entry(3)])
    asked = sent_reads(reader.step(ev.EntriesConsumed(upto=3)))
    assert asked == {"B2": [4, 6, 7], "B3": [5]}           # 6's write set is (B1, B2): B2 first now
    assert sent_reads(answer(reader, "B2", missing=[6])) == {"B1": [6]}


def test_a_bookie_is_asked_first_again_once_slow_for_ms_passed():
    slow = {"B1": 1000 + SLOW_FOR_MS}                      # B1 timed out at 1000
    assert sent_reads(make_reader(0, 2, slow=slow, now_ms=1000 + SLOW_FOR_MS - 1).start()) == {"B2": [0, 1],
                                                                                            "B3": [2]}
    assert sent_reads(make_reader(0, 2, slow=slow, now_ms=1000 + SLOW_FOR_MS).start()) == {"B1": [0], "B2": [1],
                                                                                        "B3": [2]}


def test_readers_sharing_the_slow_map_carry_a_timeout_over():
    slow: dict[str, int] = {}
    first = make_reader(0, 2, timeout_ms=1000, slow=slow)
    first.start()
    answer(first, "B2", entries=[make_entry(1)])
    answer(first, "B3", entries=[make_entry(2)])
    first.step(ev.Ticked(now_ms=1000))                     # B1 is late
    assert slow == {"B1": 1000 + SLOW_FOR_MS}
    second = make_reader(3, 5, slow=slow, now_ms=2000)     # the next ledger of a log, say
    assert sent_reads(second.start()) == {"B2": [3, 4], "B3": [5]}


# -- speculative reads --------------------------------------------------------------------------
def speculating(last: int = 0, **options) -> RangeReader:
    """speculating returns a started reader with timeout 1000 ms and speculative reads at 200 ms."""
    reader = make_reader(0, last, timeout_ms=1000, speculative_ms=200, **options)
    reader.start()
    return reader


def test_an_entry_unanswered_for_speculative_ms_is_also_asked_of_the_next_replica():
    reader = speculating()
    assert reader.step(ev.Ticked(now_ms=199)) == []
    assert sent_reads(reader.step(ev.Ticked(now_ms=200))) == {"B2": [0]}


def test_the_first_replica_may_still_answer_after_a_speculative_read():
    reader = speculating()
    reader.step(ev.Ticked(now_ms=200))
    commands = answer(reader, "B1", entries=[make_entry(0)])
    assert delivered(commands) == [0] and of_type(commands, ev.FailRead) == []


def test_a_missing_answer_from_the_speculative_replica_waits_for_the_first():
    reader = speculating()
    reader.step(ev.Ticked(now_ms=200))
    assert answer(reader, "B2", missing=[0]) == []                 # B1 is still asked
    assert delivered(answer(reader, "B1", entries=[make_entry(0)])) == [0]


def test_an_entry_fails_once_every_open_ask_failed():
    reader = speculating()
    reader.step(ev.Ticked(now_ms=200))
    assert answer(reader, "B2", missing=[0]) == []
    error = read_error(fail(reader, "B1", 0, status=Status.UNREACHABLE))
    assert isinstance(error, BookieError) and "B1: UNREACHABLE" in str(error) and "B2: NO_SUCH_ENTRY" in str(error)


def test_an_entry_waiting_only_for_an_earlier_ask_fails_at_the_timeout():
    reader = speculating()
    reader.step(ev.Ticked(now_ms=200))                             # B2 asked at 200
    answer(reader, "B2", missing=[0])
    assert of_type(reader.step(ev.Ticked(now_ms=1199)), ev.FailRead) == []
    assert isinstance(read_error(reader.step(ev.Ticked(now_ms=1200))), BookieError)


def test_a_speculative_read_needs_a_replica_left():
    reader = speculating(write_quorum=1, ensemble_size=1)
    assert reader.step(ev.Ticked(now_ms=500)) == []
    assert isinstance(read_error(reader.step(ev.Ticked(now_ms=1000))), BookieError)


def test_a_bookie_slower_than_speculative_ms_is_asked_last_afterwards():
    reader = speculating(last=99, window=4)                        # B1 holds 0, 3 first
    answer(reader, "B2", entries=[make_entry(1)])
    answer(reader, "B3", entries=[make_entry(2)])
    assert sent_reads(reader.step(ev.Ticked(now_ms=200))) == {"B2": [0, 3]}
    answer(reader, "B2", entries=[make_entry(0), make_entry(3)])
    assert sent_reads(reader.step(ev.EntriesConsumed(upto=3))) == {"B2": [4, 6, 7], "B3": [5]}


def test_a_retry_skips_a_bookie_found_slow_on_the_same_tick():
    reader = make_reader(0, 3, ensemble_size=4, write_quorum=4, timeout_ms=1000, speculative_ms=300)
    reader.start()                                         # B1: 0, B2: 1, B3: 2, B4: 3
    reader.step(ev.Ticked(now_ms=200))
    answer(reader, "B2", entries=[make_entry(1)])
    answer(reader, "B3", entries=[make_entry(2)])
    answer(reader, "B4", missing=[3])                      # 3 -> B1
    answer(reader, "B1", missing=[3])                      # 3 -> B2, at 200
    # at 1000 B1 is late with 0 and B2 is due to be speculated around with 3: 0 skips B2 for B3
    assert sent_reads(reader.step(ev.Ticked(now_ms=1000))) == {"B3": [0, 3]}


def test_speculative_ms_at_or_above_the_timeout_is_off():
    reader = make_reader(0, 0, timeout_ms=1000, speculative_ms=1000)
    reader.start()
    assert reader.step(ev.Ticked(now_ms=999)) == []


def test_corrupted_entry_is_asked_from_the_next_replica_and_the_good_copy_delivered():
    reader = make_reader(0, 0)
    reader.start()
    assert sent_reads(answer(reader, "B1", entries=[corrupt(make_entry(0))])) == {"B2": [0]}
    commands = answer(reader, "B2", entries=[make_entry(0)])
    assert delivered(commands) == [0]
    assert of_type(commands, ev.FailRead) == []


def test_entry_of_another_ledger_is_treated_as_corrupt():
    reader = make_reader(0, 0)
    reader.start()
    assert sent_reads(answer(reader, "B1", entries=[make_entry(0, ledger_id=LEDGER_ID + 1)])) == {"B2": [0]}


# -- failures ------------------------------------------------------------------------------------
def test_digest_mismatch_only_when_every_replica_fails_verification():
    reader = make_reader(0, 0, ensemble_size=3, write_quorum=3)
    reader.start()
    assert of_type(answer(reader, "B1", entries=[corrupt(make_entry(0))]), ev.FailRead) == []
    assert of_type(answer(reader, "B2", entries=[corrupt(make_entry(0))]), ev.FailRead) == []
    assert isinstance(read_error(answer(reader, "B3", entries=[corrupt(make_entry(0))])), DigestMismatch)


def test_every_replica_saying_no_such_entry_fails_with_no_such_entry():
    reader = make_reader(0, 0)
    reader.start()
    answer(reader, "B1", missing=[0])
    assert isinstance(read_error(answer(reader, "B2", missing=[0])), NoSuchEntry)


def test_no_such_ledger_counts_as_no_such_entry():
    reader = make_reader(0, 0)
    reader.start()
    fail(reader, "B1", 0, status=Status.NO_SUCH_LEDGER)
    assert isinstance(read_error(answer(reader, "B2", missing=[0])), NoSuchEntry)


def test_every_replica_failing_otherwise_fails_with_bookie_error():
    reader = make_reader(0, 0)
    reader.start()
    answer(reader, "B1", missing=[0])
    error = read_error(fail(reader, "B2", 0, status=Status.IO_ERROR))
    assert type(error) is BookieError and error.status == "IO_ERROR"


def test_unauthorized_fails_the_read_at_once():
    reader = make_reader(0, 3)
    reader.start()
    assert isinstance(read_error(fail(reader, "B1", 0, 3, status=Status.UNAUTHORIZED)), Unauthorized)
    assert reader.done


def test_answer_from_a_bookie_no_longer_asked_does_not_move_the_entry_on():
    reader = make_reader(0, 0, ensemble_size=3, write_quorum=3)
    reader.start()
    answer(reader, "B1", missing=[0])                     # now asked from B2
    assert fail(reader, "B1", 0) == []                     # a stale answer from B1 changes nothing
    assert sent_reads(answer(reader, "B2", missing=[0])) == {"B3": [0]}


# -- delivery ------------------------------------------------------------------------------------
def test_delivery_is_in_entry_order_even_when_later_entries_arrive_first():
    reader = make_reader(0, 2)
    reader.start()
    assert delivered(answer(reader, "B3", entries=[make_entry(2)])) == []
    assert delivered(answer(reader, "B2", entries=[make_entry(1)])) == []
    commands = answer(reader, "B1", entries=[make_entry(0)])
    assert delivered(commands) == [0, 1, 2]
    assert commands[-1] == ev.CompleteRead(ledger_id=LEDGER_ID)


def test_together_delivers_the_entries_asked_in_one_piece_once_all_came():
    reader = make_reader(0, 5, together=True)
    reader.start()
    assert delivered(answer(reader, "B1", entries=[make_entry(0), make_entry(3)])) == []      # 0 could go: held
    assert delivered(answer(reader, "B2", entries=[make_entry(1), make_entry(4)])) == []
    commands = answer(reader, "B3", entries=[make_entry(2), make_entry(5)])
    assert len(of_type(commands, ev.DeliverEntries)) == 1 and delivered(commands) == [0, 1, 2, 3, 4, 5]
    assert commands[-1] == ev.CompleteRead(ledger_id=LEDGER_ID)
    plain = make_reader(0, 5)
    plain.start()
    assert delivered(answer(plain, "B1", entries=[make_entry(0), make_entry(3)])) == [0]       # streams


def test_together_waits_for_an_entry_asked_again_elsewhere_and_delivers_once_it_came():
    reader = make_reader(0, 2, together=True)
    reader.start()
    answer(reader, "B2", entries=[make_entry(1)])
    answer(reader, "B3", entries=[make_entry(2)])
    retried = fail(reader, "B1", 0)                                 # 0 is asked of its other replica
    assert delivered(retried) == [] and sent_reads(retried) == {"B2": [0]}
    assert delivered(answer(reader, "B2", entries=[make_entry(0)])) == [0, 1, 2]


def test_delivery_hands_over_the_entries_themselves():
    reader = make_reader(0, 0)
    reader.start()
    assert only(answer(reader, "B1", entries=[make_entry(0)]), ev.DeliverEntries).entries == [make_entry(0)]


def test_read_completes_only_after_the_last_entry():
    reader = make_reader(0, 1)
    reader.start()
    assert of_type(answer(reader, "B1", entries=[make_entry(0)]), ev.CompleteRead) == []
    assert of_type(answer(reader, "B2", entries=[make_entry(1)]), ev.CompleteRead) != []
    assert reader.done


def test_empty_range_completes_at_start():
    assert make_reader(5, 4).start() == [ev.CompleteRead(ledger_id=LEDGER_ID)]


@pytest.mark.parametrize("first, last", [(-1, 3), (5, 3)])
def test_invalid_range_is_refused(first, last):
    with pytest.raises(ValueError):
        make_reader(first, last)


# -- flow control --------------------------------------------------------------------------------
def answer_all(reader: RangeReader, commands: list) -> list:
    """answer_all answers every SendRead in `commands` with the entries asked, and returns the result."""
    out: list = []
    for command in of_type(commands, ev.SendRead):
        out += answer(reader, command.bookie, entries=[make_entry(e) for e in command.entry_ids])
    return out


def requested(commands: list) -> list[int]:
    return sorted(e for ids in sent_reads(commands).values() for e in ids)


def test_window_bounds_the_first_requests():
    assert requested(make_reader(0, 99, window=8).start()) == list(range(8))


def test_no_more_requests_until_the_caller_consumes():
    reader = make_reader(0, 99, window=8)
    commands = answer_all(reader, reader.start())
    assert delivered(commands) == list(range(8))
    assert requested(commands) == []


def test_consuming_less_than_half_the_window_requests_nothing():
    reader = make_reader(0, 99, window=8)
    answer_all(reader, reader.start())
    assert reader.step(ev.EntriesConsumed(upto=2)) == []


def test_consuming_tops_the_window_up_again():
    reader = make_reader(0, 99, window=8)
    answer_all(reader, reader.start())
    assert requested(reader.step(ev.EntriesConsumed(upto=3))) == [8, 9, 10, 11]


def test_window_never_has_more_than_window_entries_unconsumed():
    reader = make_reader(0, 99, window=8)
    commands = reader.start()
    highest = 7
    consumed = -1
    while not reader.done:
        answered = answer_all(reader, commands)
        if delivered(answered):
            consumed = delivered(answered)[-1]
        commands = answered + reader.step(ev.EntriesConsumed(upto=consumed))
        if requested(commands):
            highest = max(highest, requested(commands)[-1])
        assert highest - consumed <= 8
    assert consumed == 99


# -- LAC reads -----------------------------------------------------------------------------------
def lac_answer(reader: LacReader, bookie: str, lac: int = -1, status: Status = Status.OK, last: int = -1) -> list:
    return reader.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=status, lac=lac, last_entry_id=last))


def test_lac_reader_asks_every_bookie_of_the_last_fragment():
    metadata = make_metadata(fragments={0: bookies(3), 4: ("B1", "B4", "B3")})
    assert LacReader(metadata).start() == [
        ev.SendReadLac(bookie=b, ledger_id=LEDGER_ID) for b in ("B1", "B4", "B3")]


def test_lac_reader_completes_at_ensemble_coverage_with_the_highest_lac():
    reader = LacReader(make_metadata(3, 3, 2))                 # EC = 2
    assert lac_answer(reader, "B1", 6) == []
    assert lac_answer(reader, "B2", 4) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=6, last_entry_id=6)]


def test_lac_reader_errors_do_not_count_towards_coverage():
    reader = LacReader(make_metadata(3, 3, 2))
    lac_answer(reader, "B1", 6)
    assert lac_answer(reader, "B2", status=Status.IO_ERROR) == []
    assert lac_answer(reader, "B3", 8) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=8, last_entry_id=8)]


def test_lac_reader_fails_when_no_bookie_answered_ok():
    reader = LacReader(make_metadata(3, 3, 2))
    lac_answer(reader, "B1", status=Status.IO_ERROR)
    lac_answer(reader, "B2", status=Status.UNREACHABLE)
    assert isinstance(read_error(lac_answer(reader, "B3", status=Status.IO_ERROR)), BookieError)


def test_lac_reader_long_poll_completes_at_the_first_answer_above_previous_lac():
    reader = LacReader(make_metadata(3, 3, 2), previous_lac=5, timeout_ms=1000)
    assert all((c.previous_lac, c.timeout_ms) == (5, 1000) for c in reader.start())
    assert lac_answer(reader, "B1", 5) == []
    assert lac_answer(reader, "B2", 5) == []
    assert lac_answer(reader, "B3", 7) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=7, last_entry_id=7)]


def test_lac_reader_long_poll_completes_on_one_answer_above_previous_lac():
    reader = LacReader(make_metadata(3, 3, 2), previous_lac=5, timeout_ms=1000)
    assert lac_answer(reader, "B2", 6) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=6, last_entry_id=6)]


def test_lac_reader_long_poll_with_no_progress_completes_once_all_answered():
    reader = LacReader(make_metadata(3, 3, 2), previous_lac=5, timeout_ms=1000)
    lac_answer(reader, "B1", 5)
    lac_answer(reader, "B2", 4)
    assert lac_answer(reader, "B3", 5) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=5, last_entry_id=5)]


def test_lac_reader_applies_the_issue_2615_floor_after_every_bookie_was_replaced():
    """Issue 12: E5/Qw3/Qa2 with every bookie replaced at entry 10: the new fragment's bookies
    answer LAC -1, yet entries 0..9 were confirmed when the fragment was made."""
    metadata = make_metadata(5, 3, 2, fragments={0: bookies(5), 10: ("B6", "B7", "B8", "B9", "B10")})
    reader = LacReader(metadata)
    commands: list = []
    for bookie in ("B6", "B7", "B8", "B9"):                    # EC = (5 - 2) + 1 = 4
        commands += lac_answer(reader, bookie, -1)
    assert commands == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=9, last_entry_id=9)]


def test_lac_reader_reports_the_highest_entry_stored_by_the_answering_bookies():
    reader = LacReader(make_metadata(3, 3, 2))                 # EC = 2
    lac_answer(reader, "B1", 4, last=6)
    assert lac_answer(reader, "B2", 5, last=5) == [ev.CompleteRead(ledger_id=LEDGER_ID, lac=5, last_entry_id=6)]


def test_entries_out_of_replicas_in_one_tick_fail_the_read_at_the_lowest_of_them():
    reader = RangeReader(make_metadata(2, 2, 2), 0, 1, DIGEST, timeout_ms=100)
    reader.start()                                    # entry 0 asked of B1, entry 1 of B2
    reader.step(ev.EntriesRead(bookie="B1", ledger_id=LEDGER_ID, entries=[corrupt(make_entry(0, lac=-1))],
                               missing=[], lac=-1))   # 0 now asked of B2
    reader.step(ev.EntriesRead(bookie="B2", ledger_id=LEDGER_ID, entries=[], missing=[1], lac=-1))
    fail = only(reader.step(ev.Ticked(now_ms=1000)), ev.FailRead)    # both last replicas are late
    assert isinstance(fail.error, DigestMismatch) and "entry 0 " in str(fail.error)


# -- TailReader: the LAC and the next entry in one long poll -------------------------------------------
def make_tail(entry_id: int = 4, *, slow=None, fragments=None) -> tuple[TailReader, list]:
    """make_tail long-polls entry `entry_id` on B1..B3 (E3/Qw2: entry e is on B(e%3+1) and B((e+1)%3+1))."""
    tail = TailReader(make_metadata(3, 2, 2, fragments=fragments), entry_id, DIGEST, timeout_ms=30_000,
                      spread_ms=200, now_ms=1_000, slow=slow)
    return tail, tail.start()


def tail_answer(tail: TailReader, bookie: str, lac: int, entries=(), disk: int = 0) -> list:
    return tail.step(ev.EntriesRead(bookie=bookie, ledger_id=LEDGER_ID, entries=list(entries), missing=[], lac=lac,
                                    disk=disk))


def test_tail_reader_asks_one_replica_for_the_entry_with_the_lac_before_it():
    _, sent = make_tail(4)          # entry 4 is on B2, B3; entry 5 on B3, B1: B3 learns the LAC that confirms 4
    assert sent == [ev.SendRead(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[4], previous_lac=3, timeout_ms=30_000)]


def test_tail_reader_delivers_the_entry_its_answer_confirms_and_completes_with_the_lac():
    tail, _ = make_tail(4)
    out = tail_answer(tail, "B3", 4, [make_entry(4)])
    assert delivered(out) == [4]
    assert only(out, ev.CompleteRead).lac == 4 and tail.done


def test_tail_reader_leaves_the_entry_to_the_range_read_when_its_answer_confirms_more():
    tail, _ = make_tail(4)
    out = tail_answer(tail, "B3", 9, [make_entry(4)])       # after a linger: 4..9 confirmed at once
    assert delivered(out) == [] and only(out, ev.CompleteRead).lac == 9    # the caller reads 4..9 together


def test_tail_reader_delivers_nothing_the_answers_lac_does_not_confirm():
    tail, _ = make_tail(4)
    out = tail_answer(tail, "B3", 3, [make_entry(4)])       # held until its timeout: nothing new
    assert delivered(out) == [] and only(out, ev.CompleteRead).lac == 3


def test_tail_reader_hands_a_corrupt_entry_to_the_range_read_by_completing_without_it():
    tail, _ = make_tail(4)
    out = tail_answer(tail, "B3", 6, [corrupt(make_entry(4))])
    assert delivered(out) == [] and only(out, ev.CompleteRead).lac == 6    # the caller reads 4..6 with retries


def test_tail_reader_asks_the_other_replica_after_spread_ms_and_takes_the_first_answer():
    tail, _ = make_tail(4)
    assert tail.step(ev.Ticked(now_ms=1_199, wall_ms=0)) == []
    spread = tail.step(ev.Ticked(now_ms=1_200, wall_ms=0))
    assert [(s.bookie, s.entry_ids, s.previous_lac) for s in spread] == [("B2", [4], 3)]
    assert tail.step(ev.Ticked(now_ms=5_000, wall_ms=0)) == []             # nobody left to ask
    out = tail_answer(tail, "B2", 4, [make_entry(4)])
    assert delivered(out) == [4] and tail.done


def test_tail_reader_marks_a_replica_slow_that_stayed_silent_while_the_other_had_news():
    slow: dict[str, int] = {}
    tail, _ = make_tail(4, slow=slow)
    tail.step(ev.Ticked(now_ms=1_200, wall_ms=0))                        # B3 silent for spread_ms: B2 asked
    assert delivered(tail_answer(tail, "B2", 4, [make_entry(4)])) == [4]
    assert slow["B3"] > 1_200 and "B2" not in slow
    _, sent = make_tail(4, slow=slow)
    assert [s.bookie for s in sent] == ["B2"]                            # the next tail read does not wait for B3


def test_tail_reader_marks_no_replica_slow_when_the_first_answers():
    slow: dict[str, int] = {}
    tail, _ = make_tail(4, slow=slow)
    tail.step(ev.Ticked(now_ms=1_200, wall_ms=0))
    tail_answer(tail, "B3", 4, [make_entry(4)])
    assert slow == {}


def test_tail_reader_asks_the_next_replica_at_once_when_one_fails_and_marks_it_slow():
    slow: dict[str, int] = {}
    tail, _ = make_tail(4, slow=slow)
    out = tail.step(ev.ReadFailed(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[4], status=Status.UNREACHABLE))
    assert [s.bookie for s in of_type(out, ev.SendRead)] == ["B2"] and slow["B3"] > 1_000
    _, sent = make_tail(4, slow=slow)
    assert [s.bookie for s in sent] == ["B2"]                               # a healthy replica first now


def test_tail_reader_fails_only_when_every_replica_failed():
    tail, _ = make_tail(4)
    tail.step(ev.ReadFailed(bookie="B3", ledger_id=LEDGER_ID, entry_ids=[4], status=Status.IO_ERROR))
    out = tail.step(ev.ReadFailed(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[4], status=Status.IO_ERROR))
    assert isinstance(read_error(out), BookieError)


def test_tail_reader_takes_no_such_ledger_as_holding_nothing_yet():
    tail, _ = make_tail(0)
    out = tail.step(ev.ReadFailed(bookie="B2", ledger_id=LEDGER_ID, entry_ids=[0], status=Status.NO_SUCH_LEDGER))
    assert only(out, ev.CompleteRead).lac == -1


def test_tail_reader_counts_an_answer_from_a_replaced_disk_as_a_failure():
    metadata = dataclasses.replace(make_metadata(3, 2, 2), disks={0: (1, 2, 7)})     # B3's disk is 7
    tail = TailReader(metadata, 4, DIGEST, timeout_ms=30_000, spread_ms=200, now_ms=1_000)
    tail.start()
    out = tail_answer(tail, "B3", 6, [make_entry(4)], disk=9)     # a new disk: its LAC proves nothing
    assert delivered(out) == [] and [s.bookie for s in of_type(out, ev.SendRead)] == ["B2"]
    assert delivered(tail_answer(tail, "B2", 4, [make_entry(4)], disk=2)) == [4]


def test_tail_reader_ignores_answers_of_replicas_it_did_not_ask():
    tail, _ = make_tail(4)
    assert tail_answer(tail, "B2", 4, [make_entry(4)]) == [] and not tail.done


def test_tail_reader_never_completes_below_the_last_fragments_start():
    tail, _ = make_tail(10, fragments={0: bookies(3), 10: ("B4", "B5", "B6")})
    out = tail.step(ev.ReadFailed(bookie="B6", ledger_id=LEDGER_ID, entry_ids=[10], status=Status.NO_SUCH_LEDGER))
    assert only(out, ev.CompleteRead).lac == 9           # issue 2615: the fragment started at LAC + 1
