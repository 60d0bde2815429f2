"""The KV state machine: apply-time results at the record's stamp, snapshots captured then persisted, the lock."""

from __future__ import annotations

import io
import random
import threading

import pytest

from walkit import Position
from walkit.adapters.kv.machine import KVMachine, SnapshotFormatError
from walkit.adapters.kv.records import KEEPTTL, XX, Delete, FlushDb, IncrBy, MSet, RecordError, Set, encode
from walkit.adapters.kv.resp import OK, ReplyError

T = 1_700_000_000_000


def feed(machine: KVMachine, records, first: int = 0) -> list:
    """feed applies (stamp, record) pairs as log entries first, first + 1, ... and returns the results."""
    return [machine.apply(encode(stamp, record), Position(1, first + i)) for i, (stamp, record) in enumerate(records)]


def test_results_are_computed_when_a_record_is_applied_at_its_stamp():
    machine = KVMachine()
    assert feed(machine, [(T, Set(b"k", b"1")), (T, IncrBy(b"k", 1)), (T + 5, IncrBy(b"k", 5))]) == [OK, 2, 7]
    assert machine.index == 3 and machine.stamp == T + 5 and machine.position == Position(1, 2)
    error = feed(machine, [(T + 6, Set(b"t", b"text")), (T + 6, IncrBy(b"t", 1))], first=3)[1]
    assert isinstance(error, ReplyError) and "not an integer" in error.message      # a reply, on every node
    assert feed(machine, [(T + 1, Set(b"e", b"v", T + 10))], first=5) == [OK]
    assert machine.stamp == T + 6                                  # the largest stamp applied
    assert feed(machine, [(T + 10, Set(b"e", b"again", 0, XX))], first=6) == [None]   # expired at T + 10


def test_a_record_that_does_not_decode_raises_on_every_node_and_changes_nothing():
    machine = KVMachine()
    feed(machine, [(T, Set(b"k", b"v"))])
    with pytest.raises(RecordError):
        machine.apply(b"\x02garbage", Position(1, 1))
    assert machine.index == 1 and machine.state.get(b"k", T) == b"v"


def test_nodes_applying_the_same_records_hold_the_same_state_expiry_included():
    rng = random.Random(7)
    records, stamp = [], T
    for _ in range(3000):
        stamp += rng.randrange(3)
        key = b"k%d" % rng.randrange(100)
        records.append((stamp, rng.choice([Set(key, b"v", stamp + rng.randrange(1, 40)), Set(key, b"w"),
                                           IncrBy(key, 1), Delete((key,)), Set(key, b"x", 0, KEEPTTL | XX),
                                           MSet((key, b"m"))])))
    records.append((stamp, FlushDb()))
    records += [(stamp + 1, Set(b"k%d" % i, b"z", stamp + 50)) for i in range(10)]
    a, b = KVMachine(), KVMachine()
    assert [repr(r) for r in feed(a, records)] == [repr(r) for r in feed(b, records)]
    assert a.state.data == b.state.data and a.state.expires == b.state.expires and a.index == b.index


def test_a_snapshot_holds_the_state_when_it_was_taken_even_if_written_later():
    machine = KVMachine()
    feed(machine, [(T, MSet((b"a", b"1", b"b", b"2"))), (T, Set(b"ttl", b"v", T + 1000)),
                   (T, Set(b"gone", b"v", T + 2)), (T + 3, IncrBy(b"a", 10))])
    out = io.BytesIO()
    persist = machine.snapshot(out)                    # on the apply thread: a copy, nothing written yet
    assert machine.snapshots == 1 and machine.snapshot_taken_at == Position(1, 3) and out.getvalue() == b""
    feed(machine, [(T + 4, Set(b"a", b"changed")), (T + 4, Delete((b"b",)))], first=4)
    persist()                                          # later, on the snapshot thread
    restored = KVMachine()
    restored.restore(io.BytesIO(out.getvalue()))
    assert dict(restored.state.data) == {b"a": b"11", b"b": b"2", b"ttl": b"v"}   # expired "gone" left out
    assert restored.state.expires == {b"ttl": T + 1000}
    assert (restored.index, restored.stamp) == (4, T + 3)
    assert feed(restored, [(T + 5, IncrBy(b"a", 1))], first=4) == [12]


def test_restore_refuses_bytes_that_are_not_a_snapshot():
    out = io.BytesIO()
    machine = KVMachine()
    feed(machine, [(T, Set(b"k", b"v"))])
    machine.snapshot(out)()
    data = out.getvalue()
    for bad in (b"", b"\x09" + data[1:], data[:-1], data + b"x"):
        with pytest.raises(SnapshotFormatError):
            KVMachine().restore(io.BytesIO(bad))


def test_apply_waits_while_a_reader_holds_the_lock():
    machine = KVMachine()
    applied = threading.Event()

    def apply() -> None:
        feed(machine, [(T, Set(b"k", b"v"))])
        applied.set()
    with machine.lock:
        thread = threading.Thread(target=apply)
        thread.start()
        assert not applied.wait(0.2)                   # the apply thread is held at the lock
        assert machine.state.get(b"k", T) is None
    thread.join(10)
    assert applied.is_set() and machine.state.get(b"k", T) == b"v"
