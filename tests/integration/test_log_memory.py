"""Logs over in-process bookies (fast): positions, rolling, truncation seen by readers."""

from __future__ import annotations

import threading

import pytest

from walkit.client.log import _WriterDriver
from walkit.core.loglist import Position
from walkit.errors import LogTruncated, NoSuchLog, Timeout, WalkitError

from .helpers import wait_until


def test_positions_are_ordered_across_rolls(memory_cluster):
    client = memory_cluster.client()
    writer = client.open_log("rolls", roll_entries=4)
    positions = [writer.append(f"r{i}".encode()) for i in range(10)]
    writer.close()
    assert positions == sorted(positions)
    assert len({p.ledger_id for p in positions}) == 3
    assert [r.payload for r in client.read_log("rolls")] == [f"r{i}".encode() for i in range(10)]
    assert [r.position for r in client.read_log("rolls", start=positions[5])] == positions[5:]


def test_reader_overtaken_by_truncation_gets_log_truncated(memory_cluster):
    client = memory_cluster.client()
    writer = client.open_log("trim", roll_entries=5)
    positions = [writer.append(f"r{i}".encode()) for i in range(20)]
    reader = client.read_log("trim")
    assert next(reader).payload == b"r0"
    writer.truncate(before=positions[12])          # removes the ledgers of r0..r9 under the reader
    with pytest.raises(LogTruncated):
        list(reader)
    with pytest.raises(LogTruncated):
        list(client.read_log("trim", start=positions[3]))
    assert [r.payload for r in client.read_log("trim")][0] == b"r10"
    writer.close()


def test_unknown_log_is_no_such_log(memory_cluster):
    client = memory_cluster.client()
    with pytest.raises(NoSuchLog):
        client.log_metadata("nope")
    with pytest.raises(NoSuchLog):
        list(client.read_log("nope"))


def test_retention_by_size_drops_the_oldest_closed_ledgers(memory_cluster):
    client = memory_cluster.client()
    writer = client.open_log("kept", roll_entries=10, retention_bytes=250)
    for i in range(50):
        writer.append(b"x" * 10)                   # 100 bytes per ledger
    writer.close()
    segments = client.log_metadata("kept").segments
    assert sum(s.size or 0 for s in segments) <= 250 + 100
    assert len(segments) <= 4


def test_delete_log_removes_it_and_its_ledgers(memory_cluster):
    client = memory_cluster.client()
    writer = client.open_log("gone", roll_entries=3)
    for i in range(7):
        writer.append(b"r")
    writer.close()
    ledgers = client.log_metadata("gone").ledger_ids
    client.delete_log("gone")
    assert "gone" not in client.list_logs()
    assert not set(ledgers) & set(client.list_ledgers())
    assert Position(1, 2) < Position(2, 0)


def test_reopening_deletes_the_previous_writers_empty_ledger(memory_cluster):
    client = memory_cluster.client()
    first = client.open_log("idle")
    empty_ledger = first.ledger_id                     # the first writer appends nothing
    second = client.open_log("idle")                   # fences it; its ledger holds no entry
    assert client.log_metadata("idle").ledger_ids == [second.ledger_id]
    # The open deletes the empty ledger right after its CAS, without holding up the new writer.
    wait_until(lambda: empty_ledger not in client.list_ledgers(), 10, message="the empty ledger was not deleted")
    second.append(b"r")
    second.close()



def test_close_amid_rolls_and_truncations_answers_every_append_and_keeps_every_acknowledged_one(memory_cluster):
    # close races the rolls (roll_entries=2) and, every third round, a truncation, wherever they
    # happen to be. The orders that used to leave appends unanswered or a close unfinished are
    # forced step by step in tests/unit/test_log_machine.py and, with a stopped bookie, in
    # test_log_handover.py; this checks the same promises over whatever orders the cluster takes.
    client = memory_cluster.client()
    for round_ in range(25):
        name = f"race-{round_}"
        writer = client.open_log(name, roll_entries=2)
        first = writer.append(b"first")
        futures = [writer.append_async(f"r{i}".encode()) for i in range(round_ % 7 + 3)]
        truncation = None
        if round_ % 3 == 0:
            outcome: list = []

            def truncate(w=writer, before=first, out=outcome) -> None:
                try:
                    out.append(w.truncate(before=before, timeout=10))
                except WalkitError as exc:            # refused once the close came first
                    out.append(exc)
            truncation = threading.Thread(target=truncate)
            truncation.start()
        writer.close(timeout=10)
        if truncation is not None:
            truncation.join(10)
            assert outcome, f"round {round_}: the truncation was never answered"
        acknowledged = []
        for i, future in enumerate(futures):
            assert future.done(), f"round {round_}: append r{i} was never answered"
            if future.exception() is None:
                acknowledged.append((future.result(), f"r{i}".encode()))
        assert len(acknowledged) == len(futures), f"round {round_}: appends made before close failed"
        read = [(r.position, r.payload) for r in client.read_log(name)]
        assert read == [(first, b"first"), *acknowledged], f"round {round_}"


def test_an_open_that_timed_out_is_stopped_instead_of_ending_as_a_writer_nobody_holds(memory_cluster):
    client = memory_cluster.client()
    first = client.open_log("orphan")
    first.append(b"r0")                                # left unclosed: the next open must recover it
    listed = client.log_metadata("orphan").ledger_ids
    for i in range(3):
        memory_cluster.kill(i)                         # the recovery cannot finish while they are gone
    with pytest.raises(Timeout):
        client.open_log("orphan", timeout=0.5)
    for i in range(3):
        memory_cluster.revive(i)
    # The timed-out open was told to stop: it ends (its driver leaves the client's loop) without
    # ever adding a ledger of its own to the list, where readers would wait for it to close.
    wait_until(lambda: not any(isinstance(d, _WriterDriver) and d.machine is not first._machine
                               for d in client._loop._drivers), 20, message="the timed-out open went on")
    assert client.log_metadata("orphan").ledger_ids == listed
    second = client.open_log("orphan")
    second.append(b"r1")
    second.close()
    assert [r.payload for r in client.read_log("orphan")] == [b"r0", b"r1"]
