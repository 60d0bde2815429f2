"""append_many and bytes-in-flight backpressure with real bookie processes (issue 20).

Before backpressure, a window of a thousand 256 KiB appends sent 256 MiB at once: every bookie
passed the add timeout and the writer failed with NotEnoughBookies. Now at most
`max_bytes_in_flight` bytes are in flight and the rest wait in the client.
"""

from __future__ import annotations

import os
import threading

import pytest

import walkit
from walkit.errors import LedgerFenced
from walkit.local import LocalCluster

from .test_log_handover import stopped


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, data_dir=str(tmp_path_factory.mktemp("many") / "cluster"), storage="files") as local:
        yield local


def test_append_many_returns_the_range_of_ids_in_order_with_single_appends_between(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2)
        first = writer.append_async(b"single 0")
        many = writer.append_many_async([b"many %d" % i for i in range(500)])
        last = writer.append_async(b"single 501")
        assert first.result(30) == 0
        assert many.result(30) == range(1, 501)
        assert last.result(30) == 501
        assert writer.append_many([]) == range(0)
        assert writer.append_many([b"a", bytearray(b"b"), memoryview(b"c")]) == range(502, 505)
        with pytest.raises(TypeError):
            writer.append_many([b"ok", "not bytes"])
        writer.close()
        reader = client.open_ledger(writer.ledger_id)
        values = [entry.payload for entry in reader.read(0, 504)]
        assert values == [b"single 0", *(b"many %d" % i for i in range(500)), b"single 501", b"a", b"b", b"c"]


def test_concurrent_append_many_callers_each_get_contiguous_ids(cluster):
    with walkit.Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2)
        results: dict[int, range] = {}

        def caller(k: int) -> None:
            for round_ in range(20):
                ids = writer.append_many([b"%d:%d:%d" % (k, round_, i) for i in range(50)])
                results[(k, round_)] = ids
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        writer.close()
        reader = client.open_ledger(writer.ledger_id)
        entries = {entry.entry_id: entry.payload for entry in reader.read(0, reader.last_add_confirmed)}
        assert len(entries) == 4 * 20 * 50
        for (k, round_), ids in results.items():
            assert len(ids) == 50
            assert [entries[i] for i in ids] == [b"%d:%d:%d" % (k, round_, i) for i in range(50)]


def test_a_fenced_writer_fails_a_pending_batch_whole(cluster):
    with walkit.Client(cluster.metadata_url) as client, walkit.Client(cluster.metadata_url) as other:
        writer = client.create_ledger(3, 2, 2)
        writer.append_many([b"before"] * 10)
        other.open_ledger(writer.ledger_id, recover=True)         # fences the writer
        with pytest.raises(LedgerFenced):
            writer.append_many([b"after"] * 10, timeout=30)
        assert writer.last_add_confirmed == 9


@pytest.mark.slow
def test_a_window_of_a_thousand_256_kib_appends_completes_under_backpressure(cluster):
    """With a 1 s add timeout: 256 MiB sent at once cannot be journaled by every bookie in time
    (without backpressure this fails with NotEnoughBookies); 16 MiB at a time can."""
    payload = os.urandom(256 * 1024)
    with walkit.Client(cluster.metadata_url, add_timeout=1.0, max_bytes_in_flight=16 * 1024 * 1024) as client:
        writer = client.create_ledger(3, 2, 2)
        futures = [writer.append_async(payload[:-4] + i.to_bytes(4, "big")) for i in range(1000)]
        assert [f.result(300) for f in futures] == list(range(1000))
        metadata = writer.close()
        assert len(metadata.ensembles) == 1                    # no bookie was replaced for being slow
        reader = client.open_ledger(writer.ledger_id)
        for entry in reader.read(990, 999):
            assert entry.payload == payload[:-4] + entry.entry_id.to_bytes(4, "big")


def test_max_bytes_in_flight_must_be_a_positive_integer(cluster):
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(walkit.errors.ConfigError, match="max_bytes_in_flight"):
            walkit.Client(cluster.metadata_url, max_bytes_in_flight=bad)


@pytest.mark.slow
def test_queued_appends_survive_a_bookie_held_with_sigstop_in_order_and_once(tmp_path):
    """Most appends wait in the client (64 KiB in flight) while one ensemble bookie is frozen: the
    writer replaces it and every append, queued or sent, is acknowledged once, in order."""
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url, add_timeout=1.0, max_bytes_in_flight=64 * 1024) as client:
        writer = client.create_ledger(3, 2, 2)              # Qa = Qw: the frozen bookie's write sets stall
        frozen = writer.metadata.current_ensemble[0]
        payloads = [b"%05d" % i + os.urandom(1019) for i in range(3000)]
        futures = [writer.append_async(p) for p in payloads[:1000]]
        futures[200].result(60)                                 # the queue is draining
        with stopped(local, frozen):
            many = writer.append_many_async(payloads[1000:2000])
            futures += [writer.append_async(p) for p in payloads[2000:]]
            assert [f.result(120) for f in futures] == list(range(1000)) + list(range(2000, 3000))
            assert many.result(0) == range(1000, 2000)
            metadata = writer.close()
        assert frozen not in metadata.current_ensemble and metadata.last_entry_id == 2999
        reader = client.open_ledger(writer.ledger_id)
        assert [e.payload for e in reader.read(0, 2999)] == payloads


@pytest.mark.slow
def test_a_recovery_racing_a_writer_with_queued_appends_keeps_every_acknowledged_one(tmp_path):
    """A second client recovers the ledger while the first still has appends queued: the writer
    is fenced, the queued appends fail, and the closed ledger holds exactly the acknowledged ones."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as local, \
            walkit.Client(local.metadata_url, max_bytes_in_flight=16 * 1024) as client, \
            walkit.Client(local.metadata_url) as other:
        writer = client.create_ledger(3, 2, 2)
        futures = [writer.append_async(b"%05d" % i + b"x" * 2043) for i in range(3000)]
        futures[100].result(60)
        closed = other.open_ledger(writer.ledger_id, recover=True)
        acked = []
        for future in futures:
            try:
                acked.append(future.result(60))
            except LedgerFenced:
                break
        assert acked == list(range(len(acked))) and len(acked) < 3000
        assert all(isinstance(f.exception(60), LedgerFenced) for f in futures[len(acked):])
        last = closed.last_add_confirmed
        assert last >= len(acked) - 1                       # nothing acknowledged was lost
        assert [e.payload[:5] for e in closed.read(0, last)] == [b"%05d" % i for i in range(last + 1)]
