"""Issue 12's defects, each reproduced against in-process bookies (fast tier).

- A metadata write whose outcome is unknown (MetadataError: the answer was lost) no longer
  ends a writer: it is re-read, and the writer goes on from what the store holds.
- A rolled-over ledger whose close hit such an error is closed anyway, so a follower moves on.
- open_log recovers the tail without reading whole ledgers to size them.
- Appends queued when WriteHandle.close() runs all end: acknowledged ones are exactly the
  ledger's entries, the others fail.
"""

from __future__ import annotations

import threading
from concurrent.futures import wait

import walkit
from walkit.core.metadata import LEDGER_PREFIX, LedgerMetadata
from walkit.errors import MetadataError

from .helpers import wait_until


class LossyStore:
    """LossyStore wraps a metadata store and makes chosen ledger writes fail with an unknown outcome.

    `rule(old, new)` picks the writes (ledger metadata before and after); `applied` says whether
    such a write takes effect before its answer is lost. `lost` counts the answers lost.
    """

    def __init__(self, inner, rule, applied: bool, times: int = 1) -> None:
        self.inner = inner
        self.rule = rule
        self.applied = applied
        self.times = times
        self.lost = 0

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        if key.startswith(LEDGER_PREFIX) and self.lost < self.times:
            old = LedgerMetadata.from_bytes(self.inner.get(key)[0])
            if self.rule(old, LedgerMetadata.from_bytes(value)):
                self.lost += 1
                if self.applied:
                    self.inner.put(key, value, expected_version)
                raise MetadataError(f"put {key}: the connection dropped before the answer (outcome unknown)")
        return self.inner.put(key, value, expected_version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def lossy_client(cluster, rule, applied: bool, times: int = 1, **options):
    store = LossyStore(cluster.store, rule, applied, times)
    return store, walkit.Client(store, transport=cluster.network.transport(), add_timeout=2.0, request_timeout=2.0,
                                **options)


def test_an_ensemble_change_whose_answer_was_lost_does_not_end_the_writer(memory_cluster):
    memory_cluster.add_bookie()
    store, client = lossy_client(memory_cluster, lambda old, new: len(new.ensembles) > len(old.ensembles),
                                 applied=True)
    with client:
        writer = client.create_ledger(3, 3, 2, password=b"pw")
        writer.append(b"before")
        victim = memory_cluster.addresses.index(writer.metadata.current_ensemble[0])
        memory_cluster.kill(victim)                     # the next append replaces it by CAS ...
        assert writer.append(b"during") == 1            # ... whose answer is lost; the writer re-reads
        assert store.lost == 1
        assert len(client.ledger_metadata(writer.ledger_id).ensembles) == 2
        assert writer.append(b"after") == 2
        writer.close()
        assert [e.payload for e in client.open_ledger(writer.ledger_id, password=b"pw").read()] == [
            b"before", b"during", b"after"]


def test_a_close_whose_write_did_not_happen_is_retried_and_the_follower_moves_on(memory_cluster):
    store, client = lossy_client(memory_cluster, lambda old, new: new.state == "CLOSED", applied=False, times=2)
    with client, memory_cluster.client() as reader_client:
        writer = client.open_log("rolled")
        first = writer.append(b"in the first ledger")
        writer.roll()                                   # closing the first ledger loses its answer, twice
        writer.append(b"in the second ledger")
        records = []

        def follow() -> None:
            for record in reader_client.read_log("rolled", follow=True, poll=0.1):
                records.append(record.payload)
                if len(records) == 2:
                    return
        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        thread.join(20)
        assert records == [b"in the first ledger", b"in the second ledger"]
        assert store.lost == 2
        assert client.ledger_metadata(first.ledger_id).state == "CLOSED"
        writer.close()


def test_open_log_does_not_read_whole_ledgers_to_size_them(memory_cluster):
    reads = []
    for storage in memory_cluster.storages:
        get = storage.get

        def counting(ledger_id, entry_id, get=get):
            data = get(ledger_id, entry_id)
            if data is not None:                        # probes for absent entries read nothing
                reads.append((ledger_id, entry_id))
            return data
        storage.get = counting
    writer_client = memory_cluster.client()
    writer = writer_client.open_log("big")
    futures = [writer.append_async(b"x" * 100) for _ in range(500)]
    wait(futures)
    ledger_id = writer.ledger_id
    # The idle writer tells the bookies its LAC, so recovery reads nothing before it: what open
    # reads beyond that would be the sizing this test is about.
    wait_until(lambda: writer_client.open_ledger(ledger_id).last_add_confirmed == 499,
               message="the writer's explicit LAC did not reach the bookies")
    writer_client.close()                               # the writer dies: its ledger stays OPEN
    reads.clear()
    with memory_cluster.client() as client:
        successor = client.open_log("big")
        recovered = [s for s in successor.metadata.segments if s.ledger_id == ledger_id][0]
        assert recovered.entries == 500
        read_during_open = [r for r in reads if r[0] == ledger_id]
        assert len(read_during_open) < 50, f"open read {len(read_during_open)} entries of the recovered ledger"
        successor.close()


def test_appends_racing_close_all_end_and_the_acknowledged_ones_are_the_ledger(memory_cluster):
    client = memory_cluster.client()
    for _ in range(10):
        writer = client.create_ledger(3, 2, 2)
        futures = []

        def append_many() -> None:
            for _ in range(200):
                try:
                    futures.append(writer.append_async(b"x"))
                except walkit.errors.WalkitError:
                    return
        threads = [threading.Thread(target=append_many) for _ in range(3)]
        for thread in threads:
            thread.start()
        metadata = writer.close()
        for thread in threads:
            thread.join()
        done, not_done = wait(futures, timeout=10)
        assert not not_done, f"{len(not_done)} appends never ended"
        acked = sorted(f.result() for f in done if f.exception() is None)
        assert acked == list(range(metadata.last_entry_id + 1))
        failed = [f.exception() for f in done if f.exception() is not None]
        assert all(isinstance(e, walkit.errors.LedgerClosed) for e in failed), failed[:3]
