"""Bookie ids (BookKeeper's BP-41), with real bookie processes on one machine.

Ledger metadata names bookies by id; the registration maps the id to the address clients
dial. 127.0.0.2 is this machine too (the loopback network is 127.0.0.0/8), which is enough to
move a bookie to another address: tests/network does the same across network namespaces.

- A bookie restarted on another address with its storage keeps its id, and clients read its
  ledgers there: one that dialled the old address before the move, and a new one.
- A bookie given `--bookie-id NAME` is named so in ledger metadata and `walkit bookies list`
  shows where it listens; restarted elsewhere with the same storage it serves its entries.
- A `--bookie-id` other than the one its storage was formatted with is refused, and so is a
  second bookie that claims the id of a live one.
- A lookup held up by the metadata store never holds up the client's I/O thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

import walkit
from walkit.core.messages import ReadLacRequest, Status
from walkit.local import LocalCluster, free_port, stop_process
from walkit.registry import BookieRegistry
from walkit.transport.zmq import ZmqTransport
from walkit.wire.codec import decode_responses, encode_requests

from .helpers import wait_until

pytestmark = pytest.mark.slow


def start_bookie(cluster: LocalCluster, storage: str, listen: str, *extra: str) -> subprocess.Popen:
    """start_bookie runs `walkit bookie --listen LISTEN` on `storage` in the cluster's store."""
    return subprocess.Popen([sys.executable, "-m", "walkit", "bookie", "--metadata", cluster.metadata_url,
                             "--storage", storage, "--listen", listen, "--no-autorecovery", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen) -> None:
    stop_process(process, 10)
    if process.stderr is not None:
        process.stderr.close()


def registered(cluster: LocalCluster, bookie_id: str):
    """registered is the registration of `bookie_id` (None if it has none), read from the store."""
    with walkit.Client(cluster.metadata_url) as client:
        return BookieRegistry(client.store).info(bookie_id)


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), bookie_args=("--no-autorecovery",)) as cluster:
        yield cluster


def test_a_bookie_restarted_on_another_address_keeps_its_id_and_serves_its_ledgers(cluster):
    moved_id = cluster.addresses[0]
    with walkit.Client(cluster.metadata_url) as reader:
        with walkit.Client(cluster.metadata_url) as writer:
            handle = writer.create_ledger(3, 3, 3, password=b"pw")
            for i in range(20):
                handle.append(f"entry-{i}".encode())
            handle.close()
        first = reader.open_ledger(handle.ledger_id, password=b"pw")
        assert [e.payload for e in first.read(0, 19)][:1] == [b"entry-0"]     # the reader dialled 127.0.0.1

        cluster.stop_bookie(0)
        endpoint = f"127.0.0.2:{free_port('127.0.0.2')}"
        moved = start_bookie(cluster, cluster.storages[0], endpoint)
        try:
            info = wait_until(lambda: registered(cluster, moved_id), timeout=30,
                              message=lambda: f"the moved bookie never registered: {moved.stderr}")
            assert (info.address, info.dial) == (moved_id, endpoint)
            cluster.stop_bookie(1)
            cluster.stop_bookie(2)                    # its entries now exist only on the moved bookie

            wanted = [f"entry-{i}".encode() for i in range(20)]
            assert [e.payload for e in first.read(0, 19)] == wanted              # the old reader follows it
            with walkit.Client(cluster.metadata_url) as fresh:
                reopened = fresh.open_ledger(handle.ledger_id, password=b"pw")
                assert reopened.metadata.bookies == set(cluster.addresses)       # still named by id
                assert [e.payload for e in reopened.read(0, 19)] == wanted
        finally:
            stop(moved)


def test_a_named_bookie_is_listed_with_its_endpoint_and_serves_its_entries_from_a_new_address(tmp_path):
    with LocalCluster(bookies=0, data_dir=str(tmp_path / "cluster")) as cluster:
        storage = f"files://{tmp_path / 'named'}"
        first = f"127.0.0.1:{free_port()}"
        bookie = start_bookie(cluster, storage, first, "--bookie-id", "bookie-a")
        try:
            wait_until(lambda: registered(cluster, "bookie-a"), timeout=30)
            with walkit.Client(cluster.metadata_url) as client:
                handle = client.create_ledger(1, 1, 1, password=b"pw")
                handle.append(b"kept")
                handle.close()
                assert handle.metadata.ensembles[0] == ("bookie-a",)
            listed = subprocess.run([sys.executable, "-m", "walkit", "bookies", "list", "--metadata",
                                     cluster.metadata_url], capture_output=True, text=True, check=True).stdout
            assert listed.split("\t")[0] == "bookie-a" and listed.rstrip("\n").endswith(f"\t{first}")
            as_json = json.loads(subprocess.run([sys.executable, "-m", "walkit", "bookies", "list", "--json",
                                                 "--metadata", cluster.metadata_url],
                                                capture_output=True, text=True, check=True).stdout)
            assert [(d["address"], d["endpoint"]) for d in as_json] == [("bookie-a", first)]
        finally:
            stop(bookie)

        second = f"127.0.0.2:{free_port('127.0.0.2')}"
        bookie = start_bookie(cluster, storage, second)          # no --bookie-id: the storage's id
        try:
            info = wait_until(lambda: registered(cluster, "bookie-a"), timeout=30)
            assert info.dial == second
            with walkit.Client(cluster.metadata_url) as client:
                reopened = client.open_ledger(handle.ledger_id, password=b"pw")
                assert [e.payload for e in reopened.read()] == [b"kept"]
        finally:
            stop(bookie)


def test_a_bookie_id_other_than_its_storages_and_a_second_claim_of_a_live_id_are_refused(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), bookie_args=("--no-autorecovery",)) as cluster:
        cluster.stop_bookie(0)
        wrong = subprocess.run([sys.executable, "-m", "walkit", "bookie", "--metadata", cluster.metadata_url,
                                "--storage", cluster.storages[0], "--listen", f"127.0.0.2:{free_port('127.0.0.2')}",
                                "--bookie-id", "someone-else"], capture_output=True, text=True, timeout=60)
        assert wrong.returncode != 0
        assert f"formatted for bookie id {cluster.addresses[0]}, not someone-else" in wrong.stderr
        assert "Traceback" not in wrong.stderr

        cluster.start_bookie(0)
        other = f"files://{tmp_path / 'other'}"
        claim = subprocess.run([sys.executable, "-m", "walkit", "bookie", "--metadata", cluster.metadata_url,
                                "--storage", other, "--listen", f"127.0.0.2:{free_port('127.0.0.2')}",
                                "--bookie-id", cluster.addresses[0]], capture_output=True, text=True, timeout=60)
        assert claim.returncode != 0, claim.stderr
        assert "Traceback" not in claim.stderr
        assert f"bookie id {cluster.addresses[0]} is registered by another bookie, at {cluster.addresses[0]}" \
            in claim.stderr
        assert registered(cluster, cluster.addresses[0]).dial == cluster.addresses[0]   # the live one is untouched


def test_a_lookup_held_up_by_the_metadata_store_never_holds_up_the_io_thread(cluster):
    """A client dials a bookie id at the address its registration names, looked up on a thread of
    its own: while the lookup hangs (a metadata store cut off), poll() keeps returning, and the
    frame sent meanwhile waits and then reaches the bookie."""
    bookie_id = cluster.addresses[0]
    release = threading.Event()
    with walkit.Client(cluster.metadata_url) as client:
        registry = BookieRegistry(client.store)

        def lookup(bookie):
            release.wait(30)
            return registry.info(bookie)
        transport = ZmqTransport(lookup=lookup)
        try:
            assert transport.send(bookie_id, encode_requests([ReadLacRequest(txn=7, ledger_id=12345)]))
            for _ in range(5):
                started = time.monotonic()
                assert transport.poll(20) == ([], [])
                assert time.monotonic() - started < 2, "poll waited for the lookup"
            release.set()
            answers = []
            deadline = time.monotonic() + 30
            while not answers and time.monotonic() < deadline:
                frames, down = transport.poll(100)
                assert down == []
                answers += [r for _, frame in frames for r in decode_responses(frame)]
            assert [(a.txn, a.status) for a in answers] == [(7, Status.NO_SUCH_LEDGER)]
        finally:
            transport.close()
        transport.wake()                # after close: a no-op, never a write to a reused descriptor
