"""The KV state machine: apply-time results at the record's stamp, transactions with watches,
snapshots opened between two records and written a chunk at a time while records go on, the lock."""

from __future__ import annotations

import io
import random
import threading

import pytest

from walkit import Position
from walkit.adapters.kv import machine as machine_module
from walkit.adapters.kv.machine import KVMachine, SnapshotFormatError
from walkit.adapters.kv.records import Record, RecordError, Watch, encode
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import Hash

T = 1_700_000_000_000


def Set(key, value, expire_at=0, *options):
    return (b"SET", key, value, *options, *((b"PXAT", b"%d" % expire_at) if expire_at else ()))


def IncrBy(key, delta):
    return (b"INCRBY", key, b"%d" % delta)


def feed(machine: KVMachine, records, first: int = 0) -> list:
    """feed applies (stamp, command) pairs as log entries first, first + 1, ... and returns the results."""
    return [machine.apply(encode(Record(stamp, (tuple(command),))), Position(1, first + i))
            for i, (stamp, command) in enumerate(records)]


def test_results_are_computed_when_a_record_is_applied_at_its_stamp():
    machine = KVMachine()
    assert feed(machine, [(T, Set(b"k", b"1")), (T, IncrBy(b"k", 1)), (T + 5, IncrBy(b"k", 5))]) == [OK, 2, 7]
    assert machine.index == 3 and machine.stamp == T + 5 and machine.position == Position(1, 2)
    error = feed(machine, [(T + 6, Set(b"t", b"text")), (T + 6, IncrBy(b"t", 1))], first=3)[1]
    assert isinstance(error, ReplyError) and "not an integer" in error.message      # a reply, on every node
    assert feed(machine, [(T + 1, Set(b"e", b"v", T + 10))], first=5) == [OK]
    assert machine.stamp == T + 6                                  # the largest stamp applied
    assert feed(machine, [(T + 10, Set(b"e", b"again", 0, b"XX"))], first=6) == [None]   # expired at T + 10


def test_a_record_that_does_not_decode_raises_on_every_node_and_changes_nothing():
    machine = KVMachine()
    feed(machine, [(T, Set(b"k", b"v"))])
    with pytest.raises(RecordError):
        machine.apply(b"\x02garbage", Position(1, 1))
    assert machine.index == 1 and machine.state.get_string(b"k", T) == b"v"


def test_nodes_applying_the_same_records_hold_the_same_state_expiry_included():
    rng = random.Random(7)
    records, stamp = [], T
    for _ in range(3000):
        stamp += rng.randrange(3)
        key = b"k%d" % rng.randrange(100)
        records.append((stamp, rng.choice([Set(key, b"v", stamp + rng.randrange(1, 40)), Set(key, b"w"),
                                           IncrBy(key, 1), (b"DEL", key), Set(key, b"x", 0, b"KEEPTTL", b"XX"),
                                           (b"MSET", key, b"m")])))
    records.append((stamp, (b"FLUSHALL",)))
    records += [(stamp + 1, Set(b"k%d" % i, b"z", stamp + 50)) for i in range(10)]
    a, b = KVMachine(), KVMachine()
    assert [repr(r) for r in feed(a, records)] == [repr(r) for r in feed(b, records)]
    assert a.state.data == b.state.data and a.state.expires == b.state.expires and a.index == b.index


def test_a_snapshot_holds_the_state_when_it_was_taken_even_if_written_later():
    machine = KVMachine()
    feed(machine, [(T, (b"MSET", b"a", b"1", b"b", b"2")), (T, Set(b"ttl", b"v", T + 1000)),
                   (T, Set(b"gone", b"v", T + 2)), (T + 3, IncrBy(b"a", 10))])
    out = io.BytesIO()
    persist = machine.snapshot(out)                    # on the apply thread: a view, nothing written yet
    assert machine.snapshots == 1 and machine.snapshot_taken_at == Position(1, 3) and out.getvalue() == b""
    feed(machine, [(T + 4, Set(b"a", b"changed")), (T + 4, (b"DEL", b"b"))], first=4)
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
        assert machine.state.lookup(b"k", T) is None
    thread.join(10)
    assert applied.is_set() and machine.state.lookup(b"k", T) == b"v"


def apply_transaction(machine: KVMachine, stamp: int, commands, watches=()):
    return machine.apply(encode(Record(stamp, tuple(map(tuple, commands)), True, tuple(watches))), Position(1, 0))


def test_a_transaction_runs_every_command_and_answers_each():
    machine = KVMachine()
    replies = apply_transaction(machine, T, [(b"SET", b"a", b"1"), (b"INCR", b"a"), (b"HSET", b"a", b"f", b"v"),
                                             (b"GET", b"a"), (b"NOSUCH",)])
    assert replies[:2] == [OK, 2] and replies[3] == b"2"
    assert isinstance(replies[2], ReplyError) and replies[2].message.startswith("WRONGTYPE")     # the rest still runs
    assert isinstance(replies[4], ReplyError) and machine.index == 1


def test_a_watched_key_changed_after_its_index_aborts_the_transaction_on_every_node():
    a, b = KVMachine(), KVMachine()
    for machine in (a, b):
        feed(machine, [(T, Set(b"w", b"1")), (T, Set(b"x", b"1"))])                 # indexes 1 and 2
        watch_index = machine.index
        feed(machine, [(T, Set(b"x", b"2"))], first=2)                              # x changes after the watch
        assert apply_transaction(machine, T, [(b"SET", b"w", b"2")], [Watch(b"w", watch_index, True)]) == [OK]
        assert apply_transaction(machine, T, [(b"SET", b"w", b"3")], [Watch(b"x", watch_index, True)]) is None
        assert machine.state.get_string(b"w", T) == b"2"
    assert a.state.data == b.state.data


def test_a_watched_key_that_expired_since_it_was_watched_aborts_the_transaction():
    machine = KVMachine()
    feed(machine, [(T, Set(b"t", b"v", T + 10))])
    watches = [Watch(b"t", machine.index, True)]
    assert apply_transaction(machine, T + 5, [(b"SET", b"y", b"1")], watches) == [OK]
    assert apply_transaction(machine, T + 10, [(b"SET", b"y", b"2")], watches) is None
    # a key absent when watched and still absent does not abort
    assert apply_transaction(machine, T + 10, [(b"SET", b"y", b"3")], [Watch(b"absent", 1, False)]) == [OK]


def test_a_snapshot_is_written_in_chunks_while_records_are_applied_and_holds_its_moment(monkeypatch):
    monkeypatch.setattr(machine_module, "SNAPSHOT_CHUNK", 10)
    machine = KVMachine()
    feed(machine, [(T, Set(b"k%03d" % i, b"v%d" % i, T + 10_000 if i % 3 == 0 else 0)) for i in range(100)])
    machine.state.store(b"h", Hash({b"f": b"1"}))
    out = io.BytesIO()
    persist = machine.snapshot(out)
    chunks = machine._chunks(machine.state, machine.state.views[0], machine.stamp)
    original_chunks = machine._chunks

    def interleaved(state, view, stamp):
        """Between two chunks, records change keys on both sides of the snapshot's cursor."""
        for n, chunk in enumerate(original_chunks(state, view, stamp)):
            yield chunk
            feed(machine, [(T + 1, Set(b"k%03d" % ((n * 37) % 100), b"changed")), (T + 1, (b"DEL", b"k%03d" % (n * 11 % 100))),
                           (T + 1, Set(b"new%d" % n, b"x"))], first=100 + 3 * n)
            machine.state.writable(b"h", T, Hash)[b"f"] = b"changed"
    del chunks
    monkeypatch.setattr(machine, "_chunks", interleaved)
    persist()
    assert not machine.state.views                     # the view was closed
    restored = KVMachine()
    restored.restore(io.BytesIO(out.getvalue()))
    assert restored.index == 100 and restored.state.get_typed(b"h", T, Hash) == {b"f": b"1"}
    assert {k: v for k, v in restored.state.data.items() if k != b"h"} == {b"k%03d" % i: b"v%d" % i for i in range(100)}
    assert restored.state.expires == {b"k%03d" % i: T + 10_000 for i in range(0, 100, 3)}
    assert restored.state.touch_window()[1][-2:] == [(b"k099", 100), (b"h", 100)]


def test_a_format_1_snapshot_of_an_older_walkit_restores():
    import struct
    items = [(b"a", b"1", 0), (b"b", b"2", T + 5)]
    data = struct.pack(">BQQQ", 1, 42, T, len(items)) + b"".join(
        struct.pack(">I", len(k)) + k + struct.pack(">I", len(v)) + v + struct.pack(">q", at) for k, v, at in items)
    machine = KVMachine()
    machine.restore(io.BytesIO(data))
    assert (machine.index, machine.stamp) == (42, T) and machine.state.expires == {b"b": T + 5}
    assert machine.state.changed_since(b"a", 41) and not machine.state.changed_since(b"a", 42)
