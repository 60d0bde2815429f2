"""Reads bounded by count and bytes with real bookie processes (issue 39, item 3; BookKeeper BP-62).

Before, a bookie packed every answer for one client into one frame per round: 4,500 entries of
48 KiB read in one go made a 67,158,216-byte frame, over the 64 MiB limit, which the client
dropped ("entry 0 could not be read (UNREACHABLE)"), and one frame of repeated ids could make a
bookie build an answer of any size. Now each answer stops at the client's `max_read_bytes`
(the rest is asked again), a round's answers go in as many frames as they need, and a read
of more ids than a bookie takes is refused before it reads anything.
"""

from __future__ import annotations

import struct

import pytest

import walkit
from walkit.core.messages import DEFAULT_MAX_READ_BYTES, MAX_READ_IDS, ReadRequest, Status
from walkit.local import LocalCluster

from .helpers import RawBookie
from .test_bookie_fuzz import rss_kb

pytestmark = pytest.mark.slow

KIB = 1024
ENTRIES = 5000
LEDGER = 8_000_000_002


def payload(i: int) -> bytes:
    """payload is entry i's 48 KiB: its number over and over, so any mix-up shows."""
    return struct.pack(">I", i) * (48 * KIB // 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, data_dir=str(tmp_path_factory.mktemp("bounded") / "cluster"),
                      storage="files") as local:
        yield local


def test_5000_entries_of_48_kib_read_back_whole_in_one_read(cluster):
    with walkit.Client(cluster.metadata_url, timeout=120) as client:
        writer = client.create_ledger(3, 2, 2)
        assert writer.append_many([payload(i) for i in range(ENTRIES)]) == range(ENTRIES)
        writer.close()
        reader = client.open_ledger(writer.ledger_id)
        read = 0
        for entry in reader.read(0, ENTRIES - 1):
            assert entry.entry_id == read and entry.payload == payload(read), f"entry {read} differs"
            read += 1
        assert read == ENTRIES


def test_5000_records_of_48_kib_read_back_through_a_log(cluster):
    with walkit.Client(cluster.metadata_url, timeout=120) as client:
        log = client.open_log("bounded")
        futures = [log.append_async(payload(i)) for i in range(ENTRIES)]
        positions = [future.result(120) for future in futures]
        log.close()
        records = list(client.read_log("bounded"))
        assert [r.position for r in records] == positions
        assert all(r.payload == payload(i) for i, r in enumerate(records))


def test_a_small_max_read_bytes_reads_the_same_entries_in_more_answers(cluster):
    with walkit.Client(cluster.metadata_url, timeout=120, max_read_bytes=100 * KIB) as client:
        writer = client.create_ledger(3, 3, 2)
        writer.append_many([payload(i) for i in range(300)])
        writer.close()
        reader = client.open_ledger(writer.ledger_id, recover=True)
        assert [e.payload for e in reader.read(0, 299)] == [payload(i) for i in range(300)]


def test_100000_repeated_ids_get_bad_request_and_the_bookie_stays_flat_and_serving(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), storage="files") as cluster, \
            RawBookie(cluster.addresses[0]) as raw:
        big = b"m" * (1024 * KIB)
        assert raw.add(LEDGER, 0, big).status == Status.OK
        pid = cluster.pid(0)
        assert raw.read(LEDGER, [0]).entries[0].payload == big          # warm: the entry was read once
        before = rss_kb(pid)
        for round_ in range(20):
            response = raw.request(ReadRequest(txn=raw.next_txn(), ledger_id=LEDGER, entry_ids=[0] * 100_000))
            assert response.status == Status.BAD_REQUEST, response
            assert "100000 entry ids" in response.message and f"limit of {MAX_READ_IDS}" in response.message
        after = rss_kb(pid)
        assert after - before < 16 * 1024, f"the bookie's RSS went from {before} to {after} KiB"
        # At the limit, repeated ids cost their bytes: an answer stops at max_bytes...
        response = raw.request(ReadRequest(txn=raw.next_txn(), ledger_id=LEDGER, entry_ids=[0] * MAX_READ_IDS,
                                           max_bytes=DEFAULT_MAX_READ_BYTES))
        assert response.status == Status.OK and len(response.entries) == 7
        assert response.unread == MAX_READ_IDS - 7
        # ... and a request without max_bytes (an older client) is refused once it would pass a frame.
        response = raw.request(ReadRequest(txn=raw.next_txn(), ledger_id=LEDGER, entry_ids=[0] * MAX_READ_IDS))
        assert response.status == Status.BAD_REQUEST and "max_bytes" in response.message
        assert raw.add(LEDGER, 1, b"still serving").status == Status.OK
        assert [e.payload for e in raw.read(LEDGER, [1]).entries] == [b"still serving"]
        assert cluster.is_running(0), cluster.log_tail(0)
