"""A process paused inside a write to the sqlite metadata file: the cluster stalls, then heals.

The sqlite store's writers take turns on the file's write lock. A process stopped (SIGSTOP, a
debugger) inside its transaction keeps that lock, so nobody else can write metadata or refresh
a registration until it resumes. These tests pin down what users then see: clear errors and
working reads while it lasts, and a cluster that serves again, with nothing lost, once it ends.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

import walkit
from walkit.errors import MetadataError, NoSuchKey, Timeout
from walkit.local import LocalCluster
from walkit.plugins import open_metadata
from walkit.registry import BookieRegistry

from .helpers import pid_state, wait_until

pytestmark = pytest.mark.slow

#: Takes the write lock of the file in argv[1] and stops itself inside the transaction.
HOLDER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO nodes (key, value, version) VALUES ('held/by-the-holder', x'00', 0)")
os.kill(os.getpid(), signal.SIGSTOP)
db.execute("COMMIT")
"""


def test_a_process_paused_inside_a_metadata_write_stalls_the_cluster_only_until_it_resumes(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        path = cluster.metadata_url[len("sqlite://"):]
        with walkit.Client(cluster.metadata_url + "?timeout=1") as client:
            writer = client.create_ledger(3, 3, 2, password=b"pw")
            payloads = [f"before-{i}".encode() for i in range(50)]
            for payload in payloads:
                writer.append(payload)
            writer.close()

            holder = subprocess.Popen([sys.executable, "-c", HOLDER, path])
            try:
                wait_until(lambda: pid_state(holder.pid) == "T", message="the holder never stopped in its transaction")
                # Writes fail after the store's timeout with an error that says why.
                with pytest.raises(MetadataError, match="locked"):
                    client.create_ledger(3, 3, 2, password=b"pw")
                # Reads go on: the ledger's metadata and its entries on the bookies.
                reader = client.open_ledger(writer.ledger_id, password=b"pw")
                assert [e.payload for e in reader.read(0, 49)] == payloads
                # No registration can be refreshed, so every bookie's lapses (ttl 3 s).
                with open_metadata(cluster.metadata_url) as store:
                    wait_until(lambda: not BookieRegistry(store).live(), timeout=15,
                               message="registrations did not lapse while the lock was held")
            finally:
                os.kill(holder.pid, signal.SIGCONT)
                try:
                    code = holder.wait(10)
                except subprocess.TimeoutExpired:      # it stopped itself after the SIGCONT
                    holder.kill()
                    holder.wait()
                    raise
            assert code == 0

            # Once it resumes: every bookie registers again, and the cluster takes writes.
            with open_metadata(cluster.metadata_url) as store:
                wait_until(lambda: set(BookieRegistry(store).live()) == set(cluster.addresses), timeout=30,
                           message="the bookies did not register again")
            second = client.create_ledger(3, 3, 2, password=b"pw")
            for i in range(20):
                second.append(f"after-{i}".encode())
            second.close()
            reader = client.open_ledger(writer.ledger_id, password=b"pw")
            assert [e.payload for e in reader.read(0, 49)] == payloads
            for i in range(3):
                assert "registrations of this process lapsed" in cluster.log_tail(i, lines=200)


def test_a_process_killed_inside_a_metadata_write_leaves_nothing_half_done_and_holds_nothing(tmp_path):
    """SIGKILL inside the transaction: its write is rolled back, and the others write at once."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        path = cluster.metadata_url[len("sqlite://"):]
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, path])
        try:
            wait_until(lambda: pid_state(holder.pid) == "T", message="the holder never stopped in its transaction")
        finally:
            holder.kill()
            holder.wait()
        with walkit.Client(cluster.metadata_url + "?timeout=1") as client:
            writer = client.create_ledger(3, 3, 2, password=b"pw")      # within the 1 s timeout
            writer.append(b"after the kill")
            writer.close()
        with open_metadata(cluster.metadata_url) as store:
            with pytest.raises(NoSuchKey):
                store.get("held/by-the-holder")
            assert set(BookieRegistry(store).live()) == set(cluster.addresses)


def test_a_roll_held_up_by_the_locked_file_says_why_in_the_client_log(tmp_path, caplog):
    """A log roll retries its ledger id until the file is free: the client logs why it waits."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        path = cluster.metadata_url[len("sqlite://"):]
        with walkit.Client(cluster.metadata_url + "?timeout=0.5") as client:
            log_writer = client.open_log("held-up", ensemble=3, write_quorum=2, ack_quorum=2)
            first = log_writer.append(b"before")
            holder = subprocess.Popen([sys.executable, "-c", HOLDER, path])
            try:
                wait_until(lambda: pid_state(holder.pid) == "T", message="the holder never stopped in its transaction")
                with caplog.at_level(logging.WARNING, logger="walkit.client"):
                    with pytest.raises(Timeout):
                        log_writer.roll(timeout=3)
                said = [r.getMessage() for r in caplog.records if r.name == "walkit.client"]
                assert any("metadata store call next_id failed" in m and "locked" in m for m in said), said
            finally:
                os.kill(holder.pid, signal.SIGCONT)
                assert holder.wait(10) == 0
            # Once the file is free the roll that waited goes through, and the log takes appends.
            with open_metadata(cluster.metadata_url) as store:
                wait_until(lambda: set(BookieRegistry(store).live()) == set(cluster.addresses), timeout=30,
                           message="the bookies did not register again")
            wait_until(lambda: len(client.log_metadata("held-up").ledger_ids) == 2, timeout=30,
                       message="the roll did not go through once the file was free")
            second = log_writer.append(b"after")
            assert second.ledger_id != first.ledger_id
            log_writer.close()
            assert [r.payload for r in client.read_log("held-up")] == [b"before", b"after"]
