"""The replica's write path against a scripted log writer: ack order, apply-time results, failures."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from walkit import LogRecord, Position
from walkit.adapters.kv.records import IncrBy, Set, decode_entry, encode_entry, encode_record
from walkit.adapters.kv.replica import FOLLOWER, LEADER, NotLeader, Replica
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.errors import LedgerFenced


class ScriptedWriter:
    """ScriptedWriter stands in for a LogWriter: the test decides when each append completes."""

    def __init__(self) -> None:
        self.appended: list[tuple[bytes, Future]] = []

    def append_async(self, data: bytes) -> Future:
        future: Future = Future()
        self.appended.append((data, future))
        return future


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def spin(loop) -> None:
    """spin runs every callback the loop has ready (including those handed over from other threads)."""
    for _ in range(3):
        loop.run_until_complete(asyncio.sleep(0))


def leader(loop, **options) -> tuple[Replica, ScriptedWriter, list]:
    deposed: list[BaseException] = []
    replica = Replica(loop, on_deposed=deposed.append, **options)
    writer = ScriptedWriter()
    replica.start_leading(writer, 7, "127.0.0.1:1")
    return replica, writer, deposed


def test_writes_are_answered_after_their_ack_in_log_order_with_apply_time_results(loop):
    replica, writer, _ = leader(loop)
    answers: list = []
    replica.submit(Set(b"k", b"1"), lambda r: answers.append(("set", r)))
    replica.submit(IncrBy(b"k", 1), lambda r: answers.append(("incr", r)))
    spin(loop)
    assert len(writer.appended) == 1                      # one loop iteration, one entry
    stamp, first, records = decode_entry(writer.appended[0][0])
    assert first == 0 and records == [Set(b"k", b"1"), IncrBy(b"k", 1)]
    replica.submit(IncrBy(b"k", 5), lambda r: answers.append(("incr5", r)))
    spin(loop)
    assert decode_entry(writer.appended[1][0])[1] == 2    # numbering continues
    writer.appended[1][1].set_result(Position(3, 1))      # the later entry is acked first
    spin(loop)
    assert answers == [] and replica.state.get(b"k", stamp) is None
    writer.appended[0][1].set_result(Position(3, 0))
    spin(loop)
    assert answers == [("set", OK), ("incr", 2), ("incr5", 7)]
    assert replica.position == Position(3, 1) and replica.index == 3


def test_a_failed_append_ends_the_leadership_and_fails_every_pending_write(loop):
    replica, writer, deposed = leader(loop)
    answers: list = []
    replica.submit(Set(b"a", b"1"), answers.append)
    spin(loop)
    replica.submit(Set(b"b", b"2"), answers.append)
    spin(loop)
    replica.submit(Set(b"c", b"3"), answers.append)        # still batched, not yet appended
    writer.appended[0][1].set_exception(LedgerFenced("fenced"))
    spin(loop)
    assert len(answers) == 3 and all(isinstance(a, ReplyError) and "LedgerFenced" in a.message for a in answers)
    assert replica.role == FOLLOWER and [type(e) for e in deposed] == [LedgerFenced]
    writer.appended[1][1].set_result(Position(0, 1))       # a late ack of an abandoned entry changes nothing
    spin(loop)
    assert replica.index == 0 and replica.state.get(b"b", 0) is None
    with pytest.raises(NotLeader):
        replica.submit(Set(b"d", b"4"), answers.append)


def test_log_entries_are_applied_once_and_gaps_are_refused(loop):
    replica = Replica(loop)

    def entry(first: int, *records) -> bytes:
        return encode_entry(1000, first, [encode_record(r) for r in records])
    replica.apply_log_records([LogRecord(Position(1, 0), entry(0, Set(b"k", b"1"), IncrBy(b"k", 1))),
                               LogRecord(Position(1, 1), entry(2, IncrBy(b"k", 10)))])
    assert replica.state.get(b"k", 0) == b"12" and replica.index == 3
    replica.apply_log_records([LogRecord(Position(1, 1), entry(2, IncrBy(b"k", 10)))])    # seen: skipped
    replica.apply_log_records([LogRecord(Position(1, 3), entry(5, IncrBy(b"k", 100)))])   # gap: refused
    assert replica.state.get(b"k", 0) == b"12" and replica.position == Position(1, 1)


def test_a_snapshot_is_taken_every_n_records_one_at_a_time(loop):
    images = []
    replica, writer, _ = leader(loop, snapshot_every=3, take_snapshot=images.append)
    for i in range(4):
        replica.submit(Set(b"k%d" % i, b"v"), lambda r: None)
        spin(loop)
        writer.appended[i][1].set_result(Position(0, i))
        spin(loop)
    assert [(image.position, image.index, len(image.data)) for image in images] == [(Position(0, 2), 3, 3)]
    for i in range(4, 7):
        replica.submit(Set(b"k%d" % i, b"v"), lambda r: None)
        spin(loop)
        writer.appended[i][1].set_result(Position(0, i))
        spin(loop)
    assert len(images) == 1                                # the first one is still being written
    replica.snapshot_done(None)
    replica.submit(Set(b"k7", b"v"), lambda r: None)
    spin(loop)
    writer.appended[7][1].set_result(Position(0, 7))
    spin(loop)
    assert images[-1].index == 8 and replica.role == LEADER
