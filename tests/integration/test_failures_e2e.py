"""Failure handling with real bookie processes: ensemble change, fencing, recovery, tailing.

Every test runs on each metadata backend: SQLite, a real ZooKeeper and a real etcd server.

These are the failures issue's end-to-end checks: a bookie SIGKILLed under pipelined appends is
replaced; a recovering reader fences a live writer; a writer process killed mid-stream leaves a
ledger that concurrent recoverers close at the same entry, keeping every acknowledged one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import walkit
from walkit.errors import LedgerFenced
from walkit.local import LocalCluster

pytestmark = pytest.mark.slow

WRITER = os.path.join(os.path.dirname(__file__), "writer_process.py")


@pytest.fixture
def five_bookies(tmp_path, backend_metadata_url):
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "cluster"), metadata=backend_metadata_url) as cluster:
        yield cluster


@pytest.fixture
def local_cluster(tmp_path, backend_metadata_url):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), metadata=backend_metadata_url) as cluster:
        yield cluster


def test_killed_bookie_is_replaced_and_appends_go_on(five_bookies):
    cluster = five_bookies
    with walkit.Client(cluster.metadata_url) as client, walkit.Client(cluster.metadata_url) as reader_client:
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        payloads = [os.urandom(1024) for _ in range(3000)]
        first = [writer.append_async(p) for p in payloads[:1000]]
        assert [f.result(30) for f in first] == list(range(1000))
        victim = writer.metadata.ensembles[0][0]
        in_flight = [writer.append_async(p) for p in payloads[1000:2000]]
        cluster.kill_bookie(cluster.addresses.index(victim))
        rest = [writer.append_async(p) for p in payloads[2000:]]
        assert [f.result(30) for f in in_flight + rest] == list(range(1000, 3000))

        metadata = client.ledger_metadata(writer.ledger_id)
        assert len(metadata.ensembles) >= 2
        assert victim not in metadata.current_ensemble
        assert victim in metadata.ensembles[0]
        writer.close()

        reader = reader_client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read()] == payloads


def test_recovering_reader_fences_a_live_writer(five_bookies):
    with walkit.Client(five_bookies.metadata_url) as client, walkit.Client(five_bookies.metadata_url) as other:
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        acked = [writer.append_async(f"entry-{i}".encode()) for i in range(500)]
        acked_ids = [f.result(30) for f in acked]

        recovered = other.open_ledger(writer.ledger_id, password=b"pw", recover=True)

        assert recovered.metadata.state == walkit.CLOSED
        with pytest.raises(LedgerFenced):
            writer.append(b"after the fence", timeout=30)
        assert recovered.last_add_confirmed >= max(acked_ids)
        payloads = [e.payload for e in recovered.read(0, max(acked_ids))]
        assert payloads == [f"entry-{i}".encode() for i in acked_ids]


def test_killed_writer_concurrent_recoveries_agree(five_bookies):
    cluster = five_bookies
    process = subprocess.Popen([sys.executable, WRITER, cluster.metadata_url, "pw"],
                               stdout=subprocess.PIPE, text=True)
    try:
        ledger_id = int(process.stdout.readline().split()[1])
        acked = []
        for line in process.stdout:
            if line.startswith("error"):
                pytest.fail(f"the writer failed before the kill: {line}")
            acked.append(int(line))
            if len(acked) >= 3000:
                break
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    assert acked == list(range(len(acked)))           # acknowledged strictly in order

    barrier = threading.Barrier(2)

    def recover() -> tuple[int, list[bytes]]:
        with walkit.Client(cluster.metadata_url) as client:
            barrier.wait()
            handle = client.open_ledger(ledger_id, password=b"pw", recover=True)
            return handle.last_add_confirmed, [e.payload for e in handle.read()]

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: recover(), range(2)))
    (last_a, entries_a), (last_b, entries_b) = outcomes
    assert last_a == last_b
    assert last_a >= acked[-1]
    assert entries_a == entries_b == [f"payload-{i}".encode() for i in range(last_a + 1)]
    with walkit.Client(cluster.metadata_url) as client:
        assert client.ledger_metadata(ledger_id).last_entry_id == last_a


def test_tailing_reader_long_polls_and_sees_the_idle_writers_last_entry(local_cluster):
    with walkit.Client(local_cluster.metadata_url) as client, walkit.Client(local_cluster.metadata_url) as tail:
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(10):
            writer.append(f"e{i}".encode())
        reader = tail.open_ledger(writer.ledger_id, password=b"pw")
        # Entry 9 carries LAC 8; the idle writer's explicit LAC tells the bookies about 9.
        assert reader.wait_for_lac(above=8, timeout=10) == 9
        assert [e.payload for e in reader.read(0, 9)] == [f"e{i}".encode() for i in range(10)]

        appended = threading.Event()

        def append_later() -> None:
            appended.wait(10)
            writer.append(b"e10")

        thread = threading.Thread(target=append_later)
        thread.start()
        appended.set()
        lac = reader.wait_for_lac(above=9, timeout=10)
        thread.join()
        assert lac == 10
        assert [e.payload for e in reader.read(10, 10)] == [b"e10"]
        assert reader.wait_for_lac(above=10, timeout=0.3) == 10      # nothing new: times out unchanged
