"""Entries larger than a bookie frame carries: refused at once, before anything is sent; the writer goes on (issue 39).

Before, an append of a 100 MiB entry went out in a 100 MiB frame that every bookie refused
(the frame limit is 64 MiB), the writer replaced bookies until none was left, and the writer
failed for good: every later append raised NotEnoughBookies. Now the client checks the entry
against its `max_entry_bytes` before the append is queued.
"""

from __future__ import annotations

import threading
import time

import pytest

import walkit
from walkit.client.api import DEFAULT_MAX_ENTRY_BYTES, MAX_ENTRY_BYTES
from walkit.errors import ConfigError, RecordTooLarge
from walkit.wire.codec import DEFAULT_MAX_FRAME

HUNDRED_MIB = 100 * 1024 * 1024


def refused_at_once(append, size: int, limit: int) -> RecordTooLarge:
    """refused_at_once calls append(size bytes), which must raise RecordTooLarge itself (no Future), quickly."""
    data = b"x" * size
    started = time.monotonic()
    with pytest.raises(RecordTooLarge) as refused:
        append(data)
    assert time.monotonic() - started < 5.0
    error = refused.value
    assert (error.size, error.limit, error.setting) == (size, limit, "walkit.Client(max_entry_bytes=...)")
    assert str(size) in str(error) and str(limit) in str(error) and "max_entry_bytes" in str(error)
    return error


def test_the_default_entry_limit_leaves_room_in_a_bookie_frame():
    assert DEFAULT_MAX_ENTRY_BYTES == 60 * 1024 * 1024
    assert DEFAULT_MAX_ENTRY_BYTES < MAX_ENTRY_BYTES < DEFAULT_MAX_FRAME


def test_max_entry_bytes_above_a_frame_is_a_config_error(memory_cluster):
    with pytest.raises(ConfigError, match="max_entry_bytes"):
        memory_cluster.client(max_entry_bytes=DEFAULT_MAX_FRAME)
    with pytest.raises(ConfigError, match="max_entry_bytes"):
        memory_cluster.client(max_entry_bytes=0)
    assert memory_cluster.client(max_entry_bytes=MAX_ENTRY_BYTES).max_entry_bytes == MAX_ENTRY_BYTES


def test_a_100_mib_ledger_append_is_refused_at_once_and_the_writer_goes_on(memory_cluster):
    client = memory_cluster.client()
    writer = client.create_ledger(3, 2, 2)
    assert writer.append(b"before") == 0
    refused_at_once(writer.append_async, HUNDRED_MIB, client.max_entry_bytes)
    refused_at_once(writer.append, HUNDRED_MIB, client.max_entry_bytes)
    assert writer.append(b"after") == 1                    # the refused entry took no entry id
    with pytest.raises(RecordTooLarge):                     # one oversized record: none of the batch is appended
        writer.append_many([b"a", b"x" * HUNDRED_MIB, b"b"])
    assert writer.append_many([b"c", b"d"]) == range(2, 4)
    writer.close()
    reader = client.open_ledger(writer.ledger_id)
    assert [e.payload for e in reader.read(0, reader.last_add_confirmed)] == [b"before", b"after", b"c", b"d"]


def test_a_ledger_entry_over_a_lowered_limit_is_refused_and_one_at_it_is_written(memory_cluster):
    client = memory_cluster.client(max_entry_bytes=1000)
    writer = client.create_ledger(3, 2, 2)
    refused_at_once(writer.append, 1001, 1000)
    assert writer.append(b"y" * 1000) == 0
    writer.close()
    assert next(iter(client.open_ledger(writer.ledger_id).read(0, 0))).payload == b"y" * 1000


def test_a_100_mib_log_append_is_refused_at_once_and_the_log_goes_on_in_the_same_ledger(memory_cluster):
    client = memory_cluster.client()
    log = client.open_log("bulk")
    first = log.append(b"before")
    refused_at_once(log.append_async, HUNDRED_MIB, client.max_entry_bytes)
    refused_at_once(log.append, HUNDRED_MIB, client.max_entry_bytes)
    second = log.append(b"after")
    assert (second.ledger_id, second.entry_id) == (first.ledger_id, first.entry_id + 1)   # no roll, no gap
    assert client.log_metadata("bulk").ledger_ids == [first.ledger_id]
    log.close()
    assert [r.payload for r in client.read_log("bulk")] == [b"before", b"after"]


def test_a_100_mib_append_to_an_unbounded_log_is_refused_at_once_and_the_log_goes_on(memory_cluster):
    client = memory_cluster.client()
    log = client.open_log("bulk-unbounded", unbounded=True)
    first = log.append(b"before")
    refused_at_once(log.append_async, HUNDRED_MIB, client.max_entry_bytes)
    second = log.append(b"after")
    assert second.ledger_id == first.ledger_id and second.entry_id == first.entry_id + 1
    log.append(b"last")                      # its add carries the LAC that makes "after" readable
    log.close()                              # (the ledger stays open: readers stop at its LAC)
    assert [r.payload for r in client.read_log("bulk-unbounded")][:2] == [b"before", b"after"]


@pytest.mark.slow
def test_an_entry_of_the_default_limit_crosses_real_bookie_processes_and_one_byte_more_is_refused(local_cluster):
    """The default is no promise on paper: an entry of exactly max_entry_bytes crosses ZeroMQ to bookie processes."""
    with walkit.Client(local_cluster.metadata_url) as client:
        limit = client.max_entry_bytes
        writer = client.create_ledger(3, 2, 2)
        largest = b"L" * limit
        assert writer.append(largest, timeout=120) == 0
        refused_at_once(writer.append, limit + 1, limit)
        assert writer.append(b"after") == 1
        writer.close()
        reader = client.open_ledger(writer.ledger_id)
        entries = [e.payload for e in reader.read(0, 1, timeout=120)]
        assert entries == [largest, b"after"]



def test_one_round_of_large_adds_from_two_writers_goes_in_frames_the_bookies_take(memory_cluster):
    """Two ledgers of one client on the same three bookies, a 40 MiB entry on each, sent in one
    round of the client's I/O thread: each bookie is sent 80 MiB, which goes in two frames below
    its 64 MiB limit. In one frame the bookie refused it whole, and both writers lost the bookie."""
    client = memory_cluster.client(add_timeout=3.0, request_timeout=10.0)     # the defaults' order
    writers = [client.create_ledger(3, 3, 2) for _ in range(2)]
    payloads = [bytes([i]) * (40 * 1024 * 1024) for i in range(2)]
    gate = threading.Event()
    client._loop._post(lambda: gate.wait(10))           # holds the I/O thread: both appends join one round
    futures = [w.append_async(p) for w, p in zip(writers, payloads)]
    gate.set()
    assert [f.result(30) for f in futures] == [0, 0]
    for writer, payload in zip(writers, payloads):
        assert client.ledger_metadata(writer.ledger_id).fragment_starts == [0]     # no bookie was lost
        writer.close()
        assert [e.payload for e in client.open_ledger(writer.ledger_id).read(0, 0)] == [payload]



def test_an_add_larger_than_a_frame_goes_to_each_bookie_in_requests_it_takes(memory_cluster):
    """With max_bytes_in_flight above a frame, one append_many of 100 x 1 MiB is pushed at once:
    100 MiB for each bookie, which the dispatcher splits into requests that each fit a frame.
    In one request every bookie refused it, and the writer lost them all (NotEnoughBookies)."""
    client = memory_cluster.client(add_timeout=30.0, request_timeout=60.0, max_bytes_in_flight=256 << 20)
    writer = client.create_ledger(3, 3, 2)
    payloads = [bytes([i]) * (1 << 20) for i in range(100)]
    assert writer.append_many(payloads, timeout=120) == range(100)
    assert client.ledger_metadata(writer.ledger_id).fragment_starts == [0]      # no bookie refused a frame
    writer.close()
    assert [e.payload for e in client.open_ledger(writer.ledger_id).read(0, 99)] == payloads
