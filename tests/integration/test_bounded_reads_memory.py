"""Reads bounded by bytes through the whole client, in one process (issue 39, item 3; BP-62; fast tier).

In-memory bookies whose answers hold one entry each (BookieLimits.max_read_bytes = 1), or a
client asking for one-byte answers: range reads, recovery, log readers and auto-recovery's
copies and checks must ask again for what an answer left unread, never take it for absent.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from walkit.autorecovery import LOST, Auditor, RecoveryConfig, ReplicationWorker, Replicator, UnderReplication
from walkit.autorecovery.bookieio import BookieIO
from walkit.core.distribution import write_set_bookies
from walkit.testing.memory import MemoryCluster

PASSWORD = b"pw"


def one_entry_answers(cluster: MemoryCluster) -> None:
    """one_entry_answers makes every bookie of `cluster` stop each read answer after one entry."""
    for service in cluster.network.bookies.values():
        service.handler.limits = replace(service.handler.limits, max_read_bytes=1)


@pytest.fixture
def cluster(tmp_path):
    with MemoryCluster(f"sqlite://{tmp_path}/meta.db", bookies=5, add_timeout=2.0, request_timeout=2.0) as cluster:
        one_entry_answers(cluster)
        yield cluster


def written(client, entries: int, close: bool = True):
    writer = client.create_ledger(3, 2, 2, password=PASSWORD)
    writer.append_many([f"entry {i}".encode() for i in range(entries)])
    if close:
        writer.close()
    return writer


def payloads(entries: int) -> list[bytes]:
    return [f"entry {i}".encode() for i in range(entries)]


def test_a_read_goes_one_entry_an_answer_and_gets_every_entry(cluster):
    client = cluster.client()
    writer = written(client, 300)
    reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
    assert [e.payload for e in reader.read(0, 299)] == payloads(300)


def test_recovery_with_one_entry_answers_closes_at_the_last_acknowledged_entry(cluster):
    client = cluster.client()
    writer = written(client, 120, close=False)              # the writer stays, as if it had died
    recovered = cluster.client().open_ledger(writer.ledger_id, password=PASSWORD, recover=True)
    assert recovered.last_add_confirmed == 119
    assert client.ledger_metadata(writer.ledger_id).last_entry_id == 119
    assert [e.payload for e in recovered.read(0, 119)] == payloads(120)


def test_a_log_reads_back_with_one_entry_answers(cluster):
    client = cluster.client()
    log = client.open_log("bounded")
    positions = [f.result(10) for f in [log.append_async(p) for p in payloads(150)]]
    log.roll()
    positions += [log.append(b"after the roll")]
    log.close()
    records = list(cluster.client().read_log("bounded"))
    assert [r.position for r in records] == positions
    assert [r.payload for r in records] == payloads(150) + [b"after the roll"]


def test_a_client_asking_for_one_byte_answers_reads_everything(tmp_path):
    with MemoryCluster(f"sqlite://{tmp_path}/meta.db", bookies=3) as cluster:
        client = cluster.client(max_read_bytes=1)
        assert client.max_read_bytes == 1
        writer = written(client, 80)
        assert [e.payload for e in client.open_ledger(writer.ledger_id, password=PASSWORD).read()] == payloads(80)


def test_bookieio_read_gathers_every_part_of_a_cut_answer(cluster):
    client = cluster.client()
    writer = written(client, 30)
    bookie = client.ledger_metadata(writer.ledger_id).ensembles[0][0]
    io = BookieIO(transport=cluster.network.transport())
    try:
        held = [e for e in range(30) if bookie in write_set_bookies(e, client.ledger_metadata(writer.ledger_id)
                                                                    .ensembles[0], 2)]
        response = io.read(bookie, writer.ledger_id, held + [1000])
        assert [e.entry_id for e in response.entries] == held and response.unread == 0
        parts = list(io.reads([(bookie, io.read_request(writer.ledger_id, held))]))
        assert len(parts) == len(held)                       # one entry an answer
        assert all(io.looked_at(request, answer) for _, request, answer in parts)
    finally:
        io.close()


def test_auto_recovery_checks_and_copies_with_one_entry_answers(cluster, tmp_path):
    client = cluster.client()
    ledgers = [written(client, 40).ledger_id for _ in range(3)]
    from walkit.plugins import open_metadata
    auditor = Auditor(open_metadata(cluster.metadata_url), "auditor", RecoveryConfig(verify_fraction=1.0),
                      io=BookieIO(transport=cluster.network.transport()))
    auditor.election.campaign(timeout=5)
    try:           # every bookie holds every entry it should: ids left unread are not "missing"
        assert auditor.check_all(set(cluster.addresses), {a: None for a in cluster.addresses}) == 0
    finally:
        auditor.election.resign()
        auditor.store.close()
    lost = client.ledger_metadata(ledgers[0]).ensembles[0][0]
    cluster.kill(cluster.addresses.index(lost))
    marks = UnderReplication(client.store)
    for ledger_id in ledgers:
        if lost in client.ledger_metadata(ledger_id).bookies:
            marks.mark(ledger_id, {lost: LOST})
    marked = marks.ledger_ids()
    assert marked
    replicator = Replicator(client, passwords=[PASSWORD], io=BookieIO(transport=cluster.network.transport()))
    assert ReplicationWorker(marks, replicator, "w1").run_once() == len(marked)
    assert marks.ledger_ids() == []
    for ledger_id in ledgers:
        metadata = client.ledger_metadata(ledger_id)
        assert lost not in metadata.bookies
        for entry_id in range(40):
            for bookie in write_set_bookies(entry_id, metadata.ensemble_at(entry_id), 2):
                assert cluster.storages[cluster.addresses.index(bookie)].get(ledger_id, entry_id) is not None
        assert [e.payload for e in client.open_ledger(ledger_id, password=PASSWORD).read()] == payloads(40)
