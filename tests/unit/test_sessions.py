"""Client sessions (walkit.core.sessions) and the entry format that carries them (walkit.core.batch)."""

from __future__ import annotations

import random
from collections import deque

import pytest

from walkit.core import batch
from walkit.core.batch import Session
from walkit.core.sessions import DuplicateError, SessionTable, StaleSubmit, decode_result, encode_result


def test_entries_without_sessions_keep_the_format_older_readers_know():
    entry = batch.encode([b"a", b"bc"])
    assert entry[0] == batch.FORMAT and batch.decode(entry) == [b"a", b"bc"]
    assert batch.decode_entry(entry) == batch.Entry([b"a", b"bc"], [None, None], 0)


def test_entries_with_sessions_round_trip_with_their_stamp():
    sessions = [Session("client-é", 7), None, Session("x", 2**63)]
    entry = batch.encode([b"a", b"", b"c" * 300], sessions, stamp_ms=123456)
    decoded = batch.decode_entry(entry)
    assert decoded.records == [b"a", b"", b"c" * 300] and decoded.sessions == sessions and decoded.stamp_ms == 123456
    assert batch.decode(entry) == decoded.records


@pytest.mark.parametrize("cut", range(1, 40))
def test_truncated_or_corrupt_entries_are_refused(cut):
    entry = batch.encode([b"abc", b"de"], [Session("c", 1), None], 5)
    with pytest.raises(batch.BatchError):
        batch.decode_entry(entry[:-cut] if cut < len(entry) else b"\x02")


def test_take_never_builds_an_entry_over_the_limit_in_either_format():
    rng = random.Random(3)
    for _ in range(2000):
        max_entry = rng.randint(60, 300)
        queued = deque()
        for _ in range(rng.randint(1, 12)):
            session = Session("c" * rng.randint(1, 6), rng.randint(1, 99)) if rng.random() < 0.5 else None
            queued.append((bytes(rng.randint(0, batch.max_record_of(session, max_entry))), None, None, session))
        while queued:
            taken, _ = batch.take(queued, rng.randint(1, 8), rng.randint(1, 150), max_entry)
            entry = batch.encode([t[0] for t in taken], [t[3] for t in taken], 1)
            assert len(entry) <= max_entry


def test_a_duplicate_gets_the_first_result_and_an_older_seq_is_stale():
    table = SessionTable(ttl_ms=1000)
    assert table.check("c", 1) == (SessionTable.NEW, None)
    table.applied("c", 1, (5, b"x"), stamp_ms=10)
    assert table.check("c", 1) == (SessionTable.DUPLICATE, (5, b"x"))
    table.applied("c", 2, None, stamp_ms=20)
    verdict, error = table.check("c", 1)
    assert verdict == SessionTable.STALE and isinstance(error, StaleSubmit)
    assert table.check("c", 3) == (SessionTable.NEW, None)


def test_sessions_expire_by_entry_stamps_and_survive_a_snapshot():
    table = SessionTable(ttl_ms=100)
    table.applied("a", 1, 1, stamp_ms=10)
    table.applied("b", 1, ValueError("no"), stamp_ms=60)
    copy = SessionTable.from_bytes(table.to_bytes())
    assert copy == table
    verdict, result = copy.check("b", 1)
    assert verdict == SessionTable.DUPLICATE and isinstance(result, DuplicateError) and result.kind == "ValueError"
    copy.expire(150)                                  # a idle 140 ms, b 90 ms
    assert copy.check("a", 1) == (SessionTable.NEW, None) and len(copy) == 1


@pytest.mark.parametrize("value", [None, True, 3, -2.5, "s", b"\x00\xff", [1, [b"x"]], (1, b"y"), {"k": (b"v",)}])
def test_results_round_trip(value):
    assert decode_result(encode_result(value)) == value


def test_a_pending_result_is_settled_by_its_own_entry_only_and_a_duplicate_of_it_waits():
    table = SessionTable(ttl_ms=1000)
    table.applied("c", 5, None, 100, pending=(1, 0))            # planned in entry 1:0; its result comes later
    assert table.awaits([Session("c", 5)]) and not table.awaits([Session("c", 6), None, Session("d", 5)])
    assert table.check("c", 6) == (SessionTable.NEW, None)      # a later record of the client needs no result
    table.settle("c", 5, (1, 1), "not mine")                    # another entry's: ignored
    table.settle("c", 5, (1, 0), 42)
    assert not table.awaits([Session("c", 5)]) and table.check("c", 5) == (SessionTable.DUPLICATE, 42)
    table.applied("c", 6, None, 200, pending=(2, 0))
    table.expire(1300)                                          # idle too long: forgotten while pending
    table.settle("c", 6, (2, 0), 7)                             # nothing to settle
    assert len(table) == 0


def test_a_table_with_a_result_pending_is_not_snapshotted():
    table = SessionTable()
    table.applied("c", 1, None, 100, pending=(1, 0))
    with pytest.raises(AssertionError, match="pending"):
        table.to_bytes()
