"""The bookie server itself: in-process on a random port, and `walkit bookie` start-up errors."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

import walkit
from walkit.bookie.server import BookieConfig, BookieServer
from walkit.core.messages import Status
from walkit.errors import ConfigError
from walkit.plugins import open_metadata
from walkit.registry import BookieRegistry

from .helpers import RawBookie, wait_until


def _live(metadata_url: str) -> set[str]:
    store = open_metadata(metadata_url)
    try:
        return set(BookieRegistry(store).live())
    finally:
        store.close()


@pytest.fixture
def servers(metadata_url):
    """servers starts in-process bookies on random ports (each on its own thread) and stops them."""
    started: list[tuple[BookieServer, threading.Thread]] = []

    def start(**options) -> BookieServer:
        server = BookieServer(BookieConfig(metadata=metadata_url, port=0, **{"storage": "memory://", **options}))
        thread = threading.Thread(target=server.serve, name=f"bookie-{server.address}", daemon=True)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.stop()
    for server, thread in started:
        thread.join(10)
        assert not thread.is_alive(), f"bookie {server.address} did not stop"


def test_in_process_bookies_on_random_ports_serve_a_ledger_and_deregister_on_stop(metadata_url, servers):
    bookies = [servers(gc_interval_s=0.2) for _ in range(3)]
    addresses = [b.address for b in bookies]
    assert all(a.startswith("127.0.0.1:") and int(a.rsplit(":", 1)[1]) > 0 for a in addresses)
    assert len(set(addresses)) == 3
    assert _live(metadata_url) == set(addresses)

    with walkit.Client(metadata_url) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        data = [b"entry %d" % i for i in range(100)]
        for future in [writer.append_async(p) for p in data]:
            future.result(10)
        writer.close()
        assert [e.payload for e in client.open_ledger(writer.ledger_id, password=b"pw").read()] == data
        for bookie in bookies:                    # Qw = E: every bookie stored every entry, once
            assert bookie.service.entries_stored == 100
            assert bookie.service.syncs >= 1

        client.delete_ledger(writer.ledger_id)
        for bookie in bookies:
            wait_until(lambda bookie=bookie: writer.ledger_id not in bookie.storage.ledgers(), timeout=10)

    bookies[0].stop()
    wait_until(lambda: addresses[0] not in _live(metadata_url), timeout=10)
    assert _live(metadata_url) == set(addresses[1:])


def test_server_refuses_bad_configuration(metadata_url):
    for options in ({"max_frame_bytes": 100}, {"port": 70000}, {"gc_interval_s": 0}, {"tick_ms": 0},
                    {"max_batch_frames": 0}, {"max_batch_bytes": 100}):
        with pytest.raises(ConfigError):
            BookieServer(BookieConfig(metadata=metadata_url, **{"storage": "memory://", **options}))
    assert _live(metadata_url) == set()


def test_server_on_a_busy_port_raises_config_error_and_registers_nothing(metadata_url):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot listen"):
            BookieServer(BookieConfig(metadata=metadata_url, port=port, storage="memory://"))
    assert _live(metadata_url) == set()


@pytest.mark.slow
def test_walkit_bookie_start_up_errors_are_one_line_messages(metadata_url, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, expected in (
            (["--port", str(port)], "cannot listen on 127.0.0.1"),
            (["--port", "0", "--max-frame-bytes", "10"], "max_frame_bytes"),
            (["--port", "0", "--storage", "nope://x"], "installed: "),
        ):
            result = subprocess.run([sys.executable, "-m", "walkit", "bookie", "--metadata", metadata_url, *args],
                                    capture_output=True, text=True, timeout=60,
                                    cwd=tmp_path)      # its default storage, ./walkit-data/..., lands there
            assert result.returncode == 1, result.stderr
            assert expected in result.stderr
            if expected == "installed: ":          # the message names the storage schemes there are
                assert "memory" in result.stderr.split(expected, 1)[1]
            assert "Traceback" not in result.stderr


def test_raw_requests_reach_an_in_process_bookie(servers):
    bookie = servers()
    with RawBookie(bookie.address) as raw:
        assert raw.read_lac(5).status == Status.NO_SUCH_LEDGER
        assert raw.add(5, 0, b"zero").status == Status.OK
        lac = raw.read_lac(5)
        assert (lac.status, lac.last_entry_id) == (Status.OK, 0)


def test_a_round_stops_taking_frames_at_max_batch_bytes_and_every_append_still_completes(metadata_url, servers):
    """Memory backpressure: a round takes frames until they hold max_batch_bytes (at least one frame)."""
    bookies = [servers(max_batch_bytes=16 * 1024) for _ in range(3)]
    rounds: list[list[int]] = []
    for bookie in bookies:
        service, receive, flush = bookie.service, bookie.service.receive, bookie.service.flush
        current: list[int] = []

        def counted_receive(peer, frame, principal=None, receive=receive, current=current):
            current.append(len(frame))
            receive(peer, frame, principal)

        def counted_flush(flush=flush, current=current):
            if current:
                rounds.append(list(current))
                current.clear()
            return flush()
        service.receive, service.flush = counted_receive, counted_flush
    with walkit.Client(metadata_url) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3)
        data = [b"%06d" % i + b"x" * 4090 for i in range(2000)]       # 8 MB to each bookie
        assert [f.result(60) for f in [writer.append_async(p) for p in data]] == list(range(2000))
        writer.close()
        assert [e.payload for e in client.open_ledger(writer.ledger_id).read()] == data
    assert rounds and all(sum(sizes[:-1]) < 16 * 1024 for sizes in rounds)
    assert max(len(sizes) for sizes in rounds) < 1024            # the frame cap was not what stopped them


def test_disk_rules_twice_the_free_minimum_to_write_again_and_a_decommission_ended_on_a_full_disk(
        metadata_url, tmp_path, monkeypatch):
    """The disk rules, with the disk's numbers set by the test instead of filling a disk.

    Read-only with less than `disk_min_free_mb` free; writable again only with twice that free
    (and below the lwm); a decommission that ends while the disk is full leaves the bookie
    read-only; a bookie that starts on a full disk registers read-only.
    """
    from types import SimpleNamespace

    mb = 1024 * 1024
    disk = {"free": 500 * mb}
    monkeypatch.setattr("walkit.bookie.server.shutil.disk_usage",
                        lambda path: SimpleNamespace(total=1000 * mb, free=disk["free"]))

    def registered_read_only(server: BookieServer) -> bool:
        with open_metadata(metadata_url) as store:
            return BookieRegistry(store).info(server.address).read_only

    server = BookieServer(BookieConfig(metadata=metadata_url, port=0, storage=f"files://{tmp_path}/a",
                                       disk_min_free_mb=64))
    try:
        assert not server.service.read_only and not registered_read_only(server)
        for free, read_only in ((60, True), (100, True), (130, False), (60, True)):
            disk["free"] = free * mb
            server._check_disk()
            assert server.service.read_only == read_only == registered_read_only(server), free
        server._drain(True)
        server._drain(False)                             # decommission over, the disk still full
        assert server.service.read_only and registered_read_only(server)
        disk["free"] = 130 * mb
        server._check_disk()
        assert not server.service.read_only and not registered_read_only(server)

        disk["free"] = 10 * mb
        full = BookieServer(BookieConfig(metadata=metadata_url, port=0, storage=f"files://{tmp_path}/b",
                                         disk_min_free_mb=64))
        try:
            assert full.service.read_only and registered_read_only(full)
        finally:
            full._shutdown()
    finally:
        server._shutdown()


def test_a_bookie_on_every_interface_registers_the_advertised_address_and_clients_use_it(metadata_url, servers):
    """--host 0.0.0.0 --advertise 127.0.0.1: the socket listens everywhere, the registry names the
    dialable address, and a client writes and reads through it."""
    bookies = [servers(host="0.0.0.0", advertise="127.0.0.1") for _ in range(3)]
    addresses = [b.address for b in bookies]
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    assert _live(metadata_url) == set(addresses)
    with walkit.Client(metadata_url) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for i in range(20):
            writer.append(b"entry %d" % i)
        writer.close()
        assert [e.payload for e in client.open_ledger(writer.ledger_id, password=b"pw").read(0, 19)] == \
            [b"entry %d" % i for i in range(20)]


def test_a_bookie_on_every_interface_with_a_local_store_registers_loopback(metadata_url, servers):
    bookie = servers(host="0.0.0.0")
    assert bookie.address.startswith("127.0.0.1:") and _live(metadata_url) == {bookie.address}


@pytest.mark.parametrize("host, advertise, metadata, says", [
    ("0.0.0.0", "", "zk://192.0.2.1:2181/walkit", "set --advertise"),
    ("127.0.0.1", "", "etcd://192.0.2.1:2379/walkit", "only this machine can dial"),
    ("0.0.0.0", "0.0.0.0:3181", "sqlite:///unused.db", "not a wildcard"),
])
@pytest.mark.processes
def test_an_address_nobody_could_dial_is_refused_before_the_bookie_touches_anything(tmp_path, host, advertise,
                                                                                   metadata, says):
    storage = tmp_path / "storage"
    result = subprocess.run([sys.executable, "-m", "walkit", "bookie", "--metadata", metadata, "--host", host,
                             "--port", "0", "--storage", f"files://{storage}", "--no-autorecovery",
                             *(["--advertise", advertise] if advertise else [])],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr
    assert not storage.exists(), "the refused bookie created its storage"
