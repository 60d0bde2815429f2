"""Faults operators cause, with real bookie processes: an emptied disk, the wrong metadata store.

- A bookie whose storage was emptied (a replaced disk, a container without its volume) refuses
  to start, naming `walkit bookies format-and-rejoin`; after that command it starts as a new
  disk, and recovery of a ledger whose writer was SIGKILLed mid-stream keeps every entry the
  writer had acknowledged: each bookie in turn, several trials (issue 39 measured one trial
  in four closing short before disk identities).
- A memory bookie is a new disk at every restart: the same recovery holds without any command.
- A bookie pointed at an empty metadata store, or at another cluster's, refuses to start and
  deletes nothing; pointed back, it serves every entry.
- Garbage collection deletes only on a deletion marker: a ledger whose metadata vanished
  without one is kept, and a store that lost its cluster id makes every round a no-op.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

import walkit
from walkit.autorecovery.bookieio import BookieIO
from walkit.bookie.identity import CLUSTER_KEY
from walkit.core.messages import Status
from walkit.core.metadata import ledger_key
from walkit.errors import WalkitError
from walkit.local import LocalCluster
from walkit.plugins import path_of

from .helpers import wait_until

pytestmark = pytest.mark.slow

WRITER = os.path.join(os.path.dirname(__file__), "writer_process.py")


def run_writer_until(cluster: LocalCluster, acks: int, quorums=("3", "2", "2")) -> tuple[int, list[int]]:
    """run_writer_until runs tests/integration/writer_process.py until `acks` entries are acknowledged,
    SIGKILLs it mid-stream, and returns its ledger and the acknowledged entry ids."""
    process = subprocess.Popen([sys.executable, WRITER, cluster.metadata_url, "pw", *quorums],
                               stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    try:
        ledger_id = int(process.stdout.readline().split()[1])
        for line in process.stdout:
            assert not line.startswith("error"), f"the writer failed before the kill: {line}"
            acked.append(int(line))
            if len(acked) >= acks:
                break
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    assert acked == list(range(len(acked)))
    return ledger_id, acked


def empty_storage(cluster: LocalCluster, i: int) -> None:
    """empty_storage removes everything in bookie `i`'s storage directory, as a replaced disk would have."""
    folder = path_of(cluster.storages[i])
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def recover_and_read(cluster: LocalCluster, ledger_id: int) -> tuple[int, list[bytes]]:
    with walkit.Client(cluster.metadata_url) as client:
        handle = client.open_ledger(ledger_id, password=b"pw", recover=True)
        return handle.last_add_confirmed, [e.payload for e in handle.read()]


def format_and_rejoin(cluster: LocalCluster, i: int) -> str:
    done = subprocess.run([sys.executable, "-m", "walkit", "bookies", "format-and-rejoin", cluster.addresses[i],
                           "--metadata", cluster.metadata_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("trial", range(2))
def test_an_emptied_bookie_refuses_to_start_and_recovery_keeps_every_acknowledged_entry(tmp_path, trial):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        for victim in range(3):                     # each bookie of the E3/Qw2/Qa2 ensemble in turn
            ledger_id, acked = run_writer_until(cluster, 1500 + 700 * victim + 350 * trial)
            cluster.kill_bookie(victim)
            empty_storage(cluster, victim)
            with pytest.raises(WalkitError) as refused:
                cluster.start_bookie(victim)
            assert "IdentityError" in str(refused.value) and "format-and-rejoin" in str(refused.value)
            assert "is empty" in str(refused.value)
            report = format_and_rejoin(cluster, victim)
            assert "may start on a new disk" in report
            cluster.start_bookie(victim)
            last, payloads = recover_and_read(cluster, ledger_id)
            assert last >= acked[-1], f"bookie {victim} emptied: closed at {last}, acknowledged {acked[-1]}"
            assert payloads == [f"payload-{i}".encode() for i in range(last + 1)]


def test_memory_bookies_restart_as_new_disks_and_recovery_keeps_every_acknowledged_entry(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        for victim in range(3):
            ledger_id, acked = run_writer_until(cluster, 1500 + 600 * victim)
            cluster.kill_bookie(victim)
            cluster.start_bookie(victim)            # empty: memory keeps nothing across restarts
            last, payloads = recover_and_read(cluster, ledger_id)
            assert last >= acked[-1], f"bookie {victim} restarted empty: closed at {last}, acknowledged {acked[-1]}"
            assert payloads == [f"payload-{i}".encode() for i in range(last + 1)]


def start_by_hand(cluster: LocalCluster, i: int, metadata_url: str, log_path: str) -> subprocess.CompletedProcess:
    """start_by_hand runs `walkit bookie` on bookie `i`'s storage and port against `metadata_url`, to its exit."""
    port = cluster.addresses[i].rsplit(":", 1)[1]
    with open(log_path, "wb") as log:
        return subprocess.run([sys.executable, "-m", "walkit", "bookie", "--metadata", metadata_url,
                               "--storage", cluster.storages[i], "--port", port, "--gc-interval", "0.2"],
                              stdout=log, stderr=subprocess.STDOUT, timeout=60)


def read_from(address: str, ledger_id: int, count: int):
    """read_from asks the bookie at `address` itself for entries 0..count-1 of a ledger."""
    io = BookieIO()
    try:
        return io.read(address, ledger_id, list(range(count)))
    finally:
        io.close()


def entries_on(address: str, ledger_id: int, count: int) -> list[bytes]:
    response = read_from(address, ledger_id, count)
    assert response.status == Status.OK, response
    return [e.payload for e in response.entries]


def test_a_bookie_pointed_at_the_wrong_metadata_store_refuses_and_deletes_nothing(tmp_path):
    payloads = [f"entry {i}".encode() for i in range(200)]
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster, \
            LocalCluster(bookies=1, data_dir=str(tmp_path / "other")) as other:
        with walkit.Client(cluster.metadata_url) as client:
            writer = client.create_ledger(3, 3, 3, password=b"pw")      # every entry on every bookie
            for future in [writer.append_async(p) for p in payloads]:
                future.result()
            writer.close()
        cluster.stop_bookie(0)
        wrong = {"an empty store": f"sqlite://{tmp_path}/typo.db", "another cluster's store": other.metadata_url}
        for what, url in wrong.items():
            log_path = str(tmp_path / "by-hand.log")
            done = start_by_hand(cluster, 0, url, log_path)
            text = open(log_path).read()
            assert done.returncode != 0, f"the bookie started against {what}:\n{text}"
            assert "IdentityError" in text and "deleting nothing" in text, text
            assert "garbage collection" not in text
        cluster.start_bookie(0)
        assert entries_on(cluster.addresses[0], writer.ledger_id, 200) == payloads


def test_garbage_collection_deletes_only_on_a_deletion_marker(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), bookie_args=("--gc-interval", "0.2")) as cluster, \
            walkit.Client(cluster.metadata_url) as client:
        ledgers = []
        for _ in range(3):
            writer = client.create_ledger(3, 3, 3, password=b"pw")
            writer.append(b"kept?")
            writer.close()
            ledgers.append(writer.ledger_id)
        unmarked, marked, late = ledgers
        address = cluster.addresses[0]
        client.store.delete(ledger_key(unmarked))                    # gone without a marker
        wait_until(lambda: f"ledger {unmarked} has no metadata and no deletion marker" in cluster.log_tail(0, 200),
                   timeout=20, message=lambda: cluster.log_tail(0))
        client.delete_ledger(marked)                                 # with a marker: dropped
        wait_until(lambda: read_from(address, marked, 1).status == Status.NO_SUCH_LEDGER, timeout=20)
        assert entries_on(address, unmarked, 1) == [b"kept?"]         # later rounds kept it still

        # The store loses its cluster id (emptied, or replaced under the running bookie): no round deletes.
        value, _ = client.store.get(CLUSTER_KEY)
        client.store.delete(CLUSTER_KEY)
        client.delete_ledger(late)
        wait_until(lambda: cluster.log_tail(0, 400).count("garbage collection skipped") >= 3, timeout=20)
        assert entries_on(address, late, 1) == [b"kept?"]
        client.store.create(CLUSTER_KEY, value)
        wait_until(lambda: read_from(address, late, 1).status == Status.NO_SUCH_LEDGER, timeout=20)
        assert entries_on(address, unmarked, 1) == [b"kept?"]
