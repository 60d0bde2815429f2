"""A bookie back on a new, empty disk, in one process: in-memory bookies and a real SQLite store (fast tier).

The writer, recovery, readers, the auditor and the replicator run over walkit.testing.memory's
bookies and the real wire codec (every answer names its disk). `revive(i, empty=True)` brings
a bookie back as a memory bookie restarts for real: empty, with a new disk id.
"""

from __future__ import annotations

import pytest

from walkit.autorecovery import Auditor, RecoveryConfig, Replicator, UnderReplication
from walkit.autorecovery.bookieio import BookieIO
from walkit.autorecovery.marks import NEW_DISK
from walkit.autorecovery.operations import format_and_rejoin
from walkit.bookie.identity import DiskIdentity, read_cookie, write_cookie
from walkit.core.distribution import write_set_bookies
from walkit.errors import WalkitError
from walkit.testing.memory import MemoryCluster

PASSWORD = b"pw"


@pytest.fixture
def cluster(tmp_path):
    with MemoryCluster(f"sqlite://{tmp_path}/meta.db", bookies=3) as cluster:
        yield cluster


def payloads(count: int, start: int = 0) -> list[bytes]:
    return [f"entry {i}".encode() for i in range(start, start + count)]


def test_new_ledgers_record_the_disks_of_their_bookies(cluster):
    client = cluster.client()
    writer = client.create_ledger(3, 2, 2, password=PASSWORD)
    metadata = client.ledger_metadata(writer.ledger_id)
    assert metadata.disks == {0: tuple(cluster.disks[cluster.addresses.index(b)] for b in metadata.ensembles[0])}


def test_a_writer_keeps_writing_through_a_bookie_emptied_under_it_and_loses_nothing(cluster):
    """E3/Qw3/Qa2 on three bookies: b1 restarts empty mid-stream. The writer counts none of the new
    disk's acknowledgements for the old fragment, takes b1 back in a fragment recording its new
    disk, and every entry reads back, with b1 holding the whole new fragment."""
    client = cluster.client()
    writer = client.create_ledger(3, 3, 2, password=PASSWORD)
    for future in [writer.append_async(p) for p in payloads(50)]:
        future.result()
    cluster.kill(1)
    cluster.revive(1, empty=True)
    for future in [writer.append_async(p) for p in payloads(50, 50)]:
        future.result(timeout=30)
    writer.close()
    metadata = client.ledger_metadata(writer.ledger_id)
    first_new = metadata.fragment_starts[-1]
    emptied = cluster.addresses[1]
    assert first_new > 0 and metadata.disk_of(first_new, emptied) == cluster.disks[1]
    assert metadata.disk_of(0, emptied) != cluster.disks[1]
    reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
    assert [e.payload for e in reader.read(0, 99)] == payloads(100)
    assert all(cluster.storages[1].get(writer.ledger_id, e) is not None for e in range(first_new, 100))


def test_recovery_refuses_to_guess_when_every_bookie_was_emptied(cluster):
    """No copy of the ledger is left: recovery fails (no disk it may count answers) instead of
    closing the ledger short of what was acknowledged."""
    client = cluster.client()
    writer = client.create_ledger(3, 2, 2, password=PASSWORD)
    for future in [writer.append_async(p) for p in payloads(300)]:
        future.result()
    for index in range(3):
        cluster.kill(index)
        cluster.revive(index, empty=True)
    with pytest.raises(WalkitError):
        cluster.client(timeout=3).open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert client.ledger_metadata(writer.ledger_id).state != "CLOSED"


def test_recovery_with_one_emptied_bookie_closes_at_the_last_acknowledged_entry(cluster):
    for emptied in range(3):
        client = cluster.client()
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        for future in [writer.append_async(p) for p in payloads(200)]:
            future.result()
        cluster.kill(emptied)
        cluster.revive(emptied, empty=True)
        reader = cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
        assert reader.last_add_confirmed == 199
        assert [e.payload for e in reader.read(0, 199)] == payloads(200)


def closed_ledger(cluster, entries: int = 60) -> int:
    writer = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for future in [writer.append_async(p) for p in payloads(entries)]:
        future.result()
    writer.close()
    return writer.ledger_id


def test_the_auditor_marks_a_bookie_that_answers_from_a_new_disk(cluster, tmp_path):
    ledger_id = closed_ledger(cluster)
    cluster.kill(2)
    cluster.revive(2, empty=True)
    from walkit.plugins import open_metadata
    auditor = Auditor(open_metadata(cluster.metadata_url), "auditor", RecoveryConfig(),
                      io=BookieIO(transport=cluster.network.transport()))
    auditor.election.campaign(timeout=5)
    try:
        live = {a for a in cluster.addresses}
        assert auditor.check_all(live, {a: None for a in live}) == 1
        mark, _ = UnderReplication(cluster.store).get(ledger_id)
        assert mark.bookies == {cluster.addresses[2]: NEW_DISK}
    finally:
        auditor.stop()
        auditor.store.close()


def test_the_replicator_copies_a_new_disks_entries_back_and_records_the_disk(cluster):
    ledger_id = closed_ledger(cluster)
    client = cluster.client()
    emptied = cluster.addresses[0]
    cluster.kill(0)
    cluster.revive(0, empty=True)
    replicator = Replicator(client, passwords=[PASSWORD], io=BookieIO(transport=cluster.network.transport()))
    try:
        assert replicator.repair(ledger_id, {emptied: NEW_DISK}) == {}
    finally:
        replicator.close()
    metadata = client.ledger_metadata(ledger_id)
    assert metadata.disk_of(0, emptied) == cluster.disks[0] and metadata.bookies == set(cluster.addresses)
    held = [e for e in range(60) if emptied in write_set_bookies(e, metadata.ensembles[0], 2)]
    assert held and all(cluster.storages[0].get(ledger_id, e) is not None for e in held)


def test_format_and_rejoin_removes_the_cookie_and_marks_the_ledgers(cluster):
    ledgers = [closed_ledger(cluster, 10) for _ in range(3)]
    client = cluster.client()
    address = cluster.addresses[1]
    write_cookie(client.store, DiskIdentity(1234, "cluster", address))
    with pytest.raises(WalkitError, match="stop it first"):
        format_and_rejoin(client, address)               # it is registered: running
    cluster.kill(1)
    report = format_and_rejoin(client, address)
    assert report["old_disk"] == "4d2" and report["ledgers"] == sorted(ledgers)
    assert read_cookie(client.store, address) is None
    marks = UnderReplication(client.store)
    assert all(marks.get(i)[0].bookies == {address: NEW_DISK} for i in ledgers)


def test_format_and_rejoin_records_the_old_disk_in_fragments_written_before_disks_were(cluster):
    """A ledger from before disks were recorded names the bookie with no disk, and every answer would
    count for it: format-and-rejoin records the disk that held it (from the cookie), so the new disk's
    NO_SUCH_ENTRY answers never prove its entries absent."""
    from dataclasses import replace
    from walkit.core.metadata import LedgerMetadata, ledger_key
    client = cluster.client()
    ledger_id = closed_ledger(cluster)
    value, version = client.store.get(ledger_key(ledger_id))
    client.store.put(ledger_key(ledger_id), replace(LedgerMetadata.from_bytes(value), disks={}).to_bytes(), version)
    address = cluster.addresses[1]
    write_cookie(client.store, DiskIdentity(cluster.disks[1], "cluster", address))
    cluster.kill(1)
    format_and_rejoin(client, address)
    metadata = client.ledger_metadata(ledger_id)
    assert metadata.disk_of(0, address) == cluster.disks[1]
    assert all(metadata.disk_of(0, b) == 0 for b in metadata.ensembles[0] if b != address)   # only its slot
    cluster.revive(1, empty=True)
    assert not metadata.answer_counts(0, address, cluster.disks[1])
