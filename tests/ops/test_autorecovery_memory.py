"""Auto-recovery in one process: in-memory bookies, a real SQLite metadata store (fast tier).

The auditor, the replication worker and the replicator run against walkit.testing.memory's
bookies through the same wire codec; storage is inspected directly to check every replica.
"""

from __future__ import annotations

import time

import pytest

from walkit.autorecovery import (
    DECOMMISSION, LOST, MISSING, Auditor, RecoveryConfig, ReplicationWorker, Replicator, UnderReplication,
)
from walkit.autorecovery.auditor import entries_on
from walkit.autorecovery.bookieio import BookieIO
from walkit.core.distribution import write_set_bookies
from walkit.core.metadata import CLOSED
from walkit.errors import LedgerFenced
from walkit.testing.memory import MemoryCluster

PASSWORD = b"pw"


@pytest.fixture
def cluster(tmp_path):
    with MemoryCluster(f"sqlite://{tmp_path}/meta.db", bookies=5) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    return cluster.client()


def write_ledger(client, entries: int, close: bool = True, password: bytes = PASSWORD):
    writer = client.create_ledger(3, 2, 2, password=password)
    for future in [writer.append_async(f"entry {i}".encode()) for i in range(entries)]:
        future.result()
    if close:
        writer.close()
    return writer


def storage_of(cluster, address: str):
    return cluster.storages[cluster.addresses.index(address)]


def assert_on_write_quorum(cluster, client, ledger_id: int, last: int, live: set[str]) -> None:
    """assert_on_write_quorum checks that entries 0..last sit on all Qw bookies of their write set, all live."""
    metadata = client.ledger_metadata(ledger_id)
    for entry_id in range(last + 1):
        for bookie in write_set_bookies(entry_id, metadata.ensemble_at(entry_id), metadata.write_quorum):
            assert bookie in live, f"entry {entry_id} of ledger {ledger_id} is placed on dead bookie {bookie}"
            assert storage_of(cluster, bookie).get(ledger_id, entry_id) is not None, \
                f"entry {entry_id} of ledger {ledger_id} missing on {bookie}"


def replicator_for(cluster, client, **options) -> Replicator:
    return Replicator(client, passwords=[PASSWORD], io=BookieIO(transport=cluster.network.transport()), **options)


def elected_auditor(cluster, tmp_path, **config) -> Auditor:
    from walkit.plugins import open_metadata
    store = open_metadata(cluster.metadata_url)
    auditor = Auditor(store, "auditor-under-test", RecoveryConfig(**config),
                      io=BookieIO(transport=cluster.network.transport()))
    auditor.election.campaign(timeout=5)
    return auditor


def test_audit_marks_exactly_the_ledgers_on_the_lost_bookie(cluster, client, tmp_path):
    ledgers = [write_ledger(client, 30).ledger_id for _ in range(6)]
    lost = min(client.ledger_metadata(ledgers[0]).bookies)    # on at least one ledger: the audit has work
    on_lost = {i for i in ledgers if lost in client.ledger_metadata(i).bookies}
    cluster.kill(cluster.addresses.index(lost))
    auditor = elected_auditor(cluster, tmp_path)
    try:
        assert auditor.audit({lost}) == len(on_lost)
        marks = UnderReplication(client.store).marks()
        assert set(marks) == on_lost
        for ledger_id, mark in marks.items():
            metadata = client.ledger_metadata(ledger_id)
            position = metadata.ensembles[0].index(lost)
            assert mark.bookies == {lost: LOST}
            assert mark.entries == entries_on(0, 29, position, 3, 2) == 20
            assert mark.bytes == 20 * len(b"entry 0")        # one sampled entry times the entries
        auditor.refresh_gauges()
        assert auditor.underreplicated_ledgers == len(on_lost)
        assert auditor.underreplicated_entries == 20 * len(on_lost)
    finally:
        auditor.election.resign()
        auditor.store.close()


def test_worker_copies_fragments_to_new_bookies_then_rewrites_the_metadata(cluster, client, tmp_path):
    ledgers = [write_ledger(client, 50).ledger_id for _ in range(5)]
    lost = min(client.ledger_metadata(ledgers[0]).bookies)    # on at least one ledger (placement is random: a
    cluster.kill(cluster.addresses.index(lost))                # fixed bookie was on none of the 5 about 1% of runs)
    marks = UnderReplication(client.store)
    for ledger_id in ledgers:
        if lost in client.ledger_metadata(ledger_id).bookies:
            marks.mark(ledger_id, {lost: LOST})
    marked = marks.ledger_ids()
    assert marked
    replicator = replicator_for(cluster, client)
    assert ReplicationWorker(marks, replicator, "w1").run_once() == len(marked)
    assert marks.ledger_ids() == []
    live = set(cluster.addresses) - {lost}
    for ledger_id in ledgers:
        assert lost not in client.ledger_metadata(ledger_id).bookies
        assert_on_write_quorum(cluster, client, ledger_id, 49, live)
        reader = client.open_ledger(ledger_id, password=PASSWORD)
        assert [e.payload for e in reader.read()] == [f"entry {i}".encode() for i in range(50)]
    assert replicator.stats.entries_copied > 0
    assert replicator.stats.remaining_entries == 0


def test_open_ledger_keeps_its_last_fragment_until_the_grace_period_then_is_recovered(cluster, client):
    writer = write_ledger(client, 20, close=False)
    lost = writer.metadata.current_ensemble[0]
    cluster.kill(cluster.addresses.index(lost))
    marks = UnderReplication(client.store)
    marks.mark(writer.ledger_id, {lost: LOST})
    patient = ReplicationWorker(marks, replicator_for(client=client, cluster=cluster, open_grace_s=3600), "w1")
    patient.run_once()
    mark = marks.get(writer.ledger_id)
    assert mark is not None and mark[0].bookies == {lost: LOST}          # left to the writer for now
    assert client.ledger_metadata(writer.ledger_id).state == "OPEN"
    hasty = ReplicationWorker(marks, replicator_for(client=client, cluster=cluster, open_grace_s=0), "w2")
    hasty.run_once()
    assert marks.ledger_ids() == []
    metadata = client.ledger_metadata(writer.ledger_id)
    assert metadata.state == CLOSED and metadata.last_entry_id == 19 and lost not in metadata.bookies
    assert_on_write_quorum(cluster, client, writer.ledger_id, 19, set(cluster.addresses) - {lost})
    with pytest.raises(LedgerFenced):
        writer.append(b"too late", timeout=10)


def test_earlier_fragments_of_an_open_ledger_move_while_its_writer_goes_on(cluster, client):
    writer = write_ledger(client, 20, close=False)
    lost = writer.metadata.current_ensemble[1]
    cluster.kill(cluster.addresses.index(lost))
    for i in range(20, 40):
        writer.append(f"entry {i}".encode(), timeout=20)     # the writer replaces the lost bookie itself
    assert len(client.ledger_metadata(writer.ledger_id).ensembles) == 2
    marks = UnderReplication(client.store)
    marks.mark(writer.ledger_id, {lost: LOST})
    replicator = replicator_for(cluster, client, open_grace_s=3600)
    ReplicationWorker(marks, replicator, "w1").run_once()
    assert marks.ledger_ids() == []
    metadata = client.ledger_metadata(writer.ledger_id)
    assert metadata.state == "OPEN" and lost not in metadata.bookies
    for i in range(40, 60):
        writer.append(f"entry {i}".encode(), timeout=20)
    closed = writer.close()                        # its CAS meets the worker's rewrite: it re-reads, then closes
    assert closed.state == CLOSED and closed.last_entry_id == 59
    assert client.ledger_metadata(writer.ledger_id).ensembles == metadata.ensembles
    assert_on_write_quorum(cluster, client, writer.ledger_id, 59, set(cluster.addresses) - {lost})
    assert [e.payload for e in client.open_ledger(writer.ledger_id, password=PASSWORD).read()] == \
        [f"entry {i}".encode() for i in range(60)]


def test_periodic_check_finds_missing_entries_and_a_worker_copies_them_back_in_place(cluster, client, tmp_path):
    ledger_id = write_ledger(client, 40).ledger_id
    metadata = client.ledger_metadata(ledger_id)
    victim = metadata.ensembles[0][2]
    held = [e for e in range(40) if victim in write_set_bookies(e, metadata.ensembles[0], 2)]
    storage = storage_of(cluster, victim)
    for entry_id in (held[0], held[-1], held[5]):
        del storage._entries[ledger_id][entry_id]         # the bookie's disk lost these entries
    auditor = elected_auditor(cluster, tmp_path, verify_fraction=1.0)
    try:
        assert auditor.check_all(set(cluster.addresses), {a: None for a in cluster.addresses}) == 1
    finally:
        auditor.election.resign()
        auditor.store.close()
    marks = UnderReplication(client.store)
    assert marks.get(ledger_id)[0].bookies == {victim: MISSING}
    ReplicationWorker(marks, replicator_for(cluster, client), "w1").run_once()
    assert marks.ledger_ids() == []
    assert client.ledger_metadata(ledger_id).ensembles == metadata.ensembles      # repaired in place
    assert_on_write_quorum(cluster, client, ledger_id, 39, set(cluster.addresses))


def test_switched_off_workers_do_nothing_but_an_operators_worker_still_repairs(cluster, client):
    ledger_id = write_ledger(client, 10).ledger_id
    lost = client.ledger_metadata(ledger_id).ensembles[0][0]
    cluster.kill(cluster.addresses.index(lost))
    marks = UnderReplication(client.store)
    marks.mark(ledger_id, {lost: LOST})
    marks.set_enabled(False)
    assert not marks.enabled()
    assert ReplicationWorker(marks, replicator_for(cluster, client), "auto").run_once() == 0
    assert marks.ledger_ids() == [ledger_id]
    operator = ReplicationWorker(marks, replicator_for(cluster, client), "cli", respect_switch=False, only={lost})
    assert operator.run_once() == 1
    assert marks.ledger_ids() == [] and lost not in client.ledger_metadata(ledger_id).bookies
    marks.set_enabled(True)
    assert marks.enabled()


def test_a_ledger_whose_password_is_unknown_keeps_its_mark_with_the_reason(cluster, client):
    ledger_id = write_ledger(client, 10, password=b"secret").ledger_id
    lost = client.ledger_metadata(ledger_id).ensembles[0][0]
    cluster.kill(cluster.addresses.index(lost))
    marks = UnderReplication(client.store)
    marks.mark(ledger_id, {lost: LOST})
    replicator = replicator_for(cluster, client)
    assert ReplicationWorker(marks, replicator, "w").run_once() == 0
    mark = marks.get(ledger_id)[0]
    assert mark.bookies == {lost: LOST} and "recovery passwords" in mark.error
    assert replicator.stats.failures == 1


def test_a_lock_is_exclusive_and_marks_only_grow_until_settled(cluster, client):
    marks = UnderReplication(client.store)
    assert marks.mark(7, {"a:1": LOST})
    assert not marks.mark(7, {"a:1": LOST})                 # nothing new
    assert marks.mark(7, {"a:1": DECOMMISSION, "b:1": MISSING})
    mark, version = marks.get(7)
    assert mark.bookies == {"a:1": DECOMMISSION, "b:1": MISSING}
    marks.mark(7, {"c:1": LOST})                             # an auditor adds a bookie meanwhile
    assert not marks.settle(7, version, {})                  # so the worker's settle is refused
    from walkit.plugins import open_metadata
    other_store = open_metadata(cluster.metadata_url)          # another worker: another session
    try:
        lock = marks.lock(7, "w1")
        assert lock is not None and marks.lock_holder(7) == "w1"
        assert UnderReplication(other_store).lock(7, "w2") is None
        lock.close()
        assert marks.lock_holder(7) is None
        other = UnderReplication(other_store).lock(7, "w2")
        assert other is not None and marks.lock_holder(7) == "w2"
        other.close()
    finally:
        other_store.close()
    mark, version = marks.get(7)
    assert marks.settle(7, version, {}) and marks.get(7) is None


def test_the_audit_is_throttled_to_its_rate_of_metadata_reads(cluster, client, tmp_path):
    for _ in range(40):
        client.create_ledger(3, 2, 2, password=PASSWORD).close()
    auditor = elected_auditor(cluster, tmp_path, audit_rate=20)
    try:
        reads = auditor.metadata_reads
        started = time.monotonic()
        auditor.audit({"nobody:1"})
        elapsed = time.monotonic() - started
        assert auditor.metadata_reads - reads == 41           # one listing, one read per ledger
        assert elapsed >= (40 - 20) / 20 * 0.9                # a full bucket of 20, then 20 per second
    finally:
        auditor.election.resign()
        auditor.store.close()
