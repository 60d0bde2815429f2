"""Durable bookies with real processes: crashes of every bookie, torn journals, fences, config, read-only mode."""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import sys
import threading

import pytest

import walkit
from walkit.core.messages import Status
from walkit.errors import WalkitError
from walkit.local import LocalCluster, free_port
from walkit.plugins.storage.files.journal import RecordFile

from .helpers import MASTER_KEY, RawBookie, wait_until

pytestmark = pytest.mark.slow


def pipelined_writer(client, payloads, acked: list[int], stop_after: int, reached: threading.Event):
    """pipelined_writer appends `payloads` (up to 500 in flight), records acked ids, never raises."""
    writer = client.create_ledger(3, 3, 3, password=b"pw")
    window = threading.Semaphore(500)
    lock = threading.Lock()

    def on_done(future) -> None:
        window.release()
        if future.exception() is None:
            with lock:
                acked.append(future.result())
                if len(acked) >= stop_after:
                    reached.set()

    def run() -> None:
        for payload in payloads:
            if not window.acquire(timeout=30):
                return
            try:
                writer.append_async(payload).add_done_callback(on_done)
            except WalkitError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return writer, thread


@pytest.mark.parametrize("storage", ["files", "sqlite"])
def test_every_bookie_killed_under_load_loses_no_acked_entry(tmp_path, storage):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage=storage) as cluster:
        rng = random.Random(7)
        payloads = [rng.randbytes(rng.randint(1, 2048)) for _ in range(20000)]
        acked: list[int] = []
        reached = threading.Event()
        with walkit.Client(cluster.metadata_url, add_timeout=1.0, request_timeout=1.0) as client:
            writer, thread = pipelined_writer(client, payloads, acked, 3000, reached)
            assert reached.wait(60), f"only {len(acked)} appends acknowledged"
            for i in range(3):                                # SIGKILL every bookie while adds are in flight
                cluster.kill_bookie(i)
            thread.join(60)
            snapshot = sorted(acked)
        assert snapshot == list(range(len(snapshot)))         # acknowledged in order, no gaps
        for i in range(3):
            cluster.start_bookie(i)                           # same ports, same data
        with walkit.Client(cluster.metadata_url) as reader_client:
            recovered = reader_client.open_ledger(writer.ledger_id, password=b"pw", recover=True)
            assert recovered.last_add_confirmed >= snapshot[-1]
            entries = list(recovered.read())
        assert [e.payload for e in entries] == payloads[:len(entries)]


def test_torn_journal_tail_is_repaired_on_start(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        with walkit.Client(cluster.metadata_url) as client:
            writer = client.create_ledger(3, 3, 3, password=b"pw")
            payloads = [f"entry-{i}".encode() for i in range(300)]
            for future in [writer.append_async(p) for p in payloads]:
                future.result(30)
        cluster.kill_bookie(0)
        journal = max(glob.glob(os.path.join(cluster.data_dir, "bookie-0", "logs", "*.log")))   # the journal's end
        reader = RecordFile(journal)               # its records end where the preallocated zeros start
        for _ in reader.chunks():
            pass
        good_size = reader.end
        assert os.path.getsize(journal) > good_size
        with open(journal, "r+b") as f:                        # a torn record, then garbage, where the
            f.seek(good_size)                                  # next group commit would have gone
            f.write(b"\x40\x00\x00\x00\xde\xad\xbe\xef\x01" + os.urandom(37))
        cluster.start_bookie(0)
        with open(os.path.join(cluster.data_dir, "bookie-0.log")) as f:
            log = f.read()
        assert f"journal {journal}:" in log                       # the warning names the file,
        assert f"at offset {good_size}; truncating the journal there" in log    # and where it cut
        with RawBookie(cluster.addresses[0]) as raw:              # the repaired bookie serves every entry
            response = raw.read(writer.ledger_id, list(range(300)))
            assert response.status == Status.OK
            assert [e.payload for e in response.entries] == payloads


def test_fence_set_before_a_kill_holds_after_restart(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        with walkit.Client(cluster.metadata_url, add_timeout=2.0) as client, \
                walkit.Client(cluster.metadata_url) as recoverer:
            writer = client.create_ledger(3, 3, 2, password=b"pw")
            for i in range(20):
                writer.append(f"e{i}".encode())
            recoverer.open_ledger(writer.ledger_id, password=b"pw", recover=True)

            def late_add(address: str) -> Status:
                with RawBookie(address) as raw:
                    return raw.add(writer.ledger_id, 100, b"late", master_key=writer._machine.master_key).status
            # Recovery needs the fence on enough bookies, not all: wait until the last one has it
            # (a FENCED answer goes out after the sync that made its fence durable).
            for address in cluster.addresses:
                wait_until(lambda: late_add(address) == Status.FENCED, timeout=30, message=address)
            for i in range(3):
                cluster.kill_bookie(i)
            for i in range(3):
                cluster.start_bookie(i)
            for address in cluster.addresses:
                assert late_add(address) == Status.FENCED, address


def run_bookie_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "walkit", "bookie", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_bookie_reads_a_toml_config_and_flags_override_it(tmp_path, metadata_url):
    config = tmp_path / "bookie.toml"
    port = free_port()
    config.write_text(f'[bookie]\nmetadata = "{metadata_url}"\nstorage = "files://{tmp_path}/data"\n'
                      f'port = 1\ngroup_wait_ms = 0.5\n')
    process = subprocess.Popen([sys.executable, "-m", "walkit", "bookie", "--config", str(config),
                                "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        with walkit.Client(metadata_url) as client:
            wait_until(lambda: f"127.0.0.1:{port}" in client.bookies(), timeout=20)
            assert client.bookies()[f"127.0.0.1:{port}"].storage == f"files://{tmp_path}/data"
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("content, complaint", [
    ('metadata = "sqlite:///x.db"\nport = 70000\n', "port must be a TCP port"),
    ('metadata = "sqlite:///x.db"\ngroup_wait_ms = "soon"\n', "group_wait_ms must be"),
    ('metadata = "sqlite:///x.db"\ndisk_usage_threshold = 0.5\ndisk_usage_lwm = 0.8\n', "disk_usage_lwm"),
    ('metadata = "sqlite:///x.db"\ndisk_min_free_mb = -1\n', "disk_min_free_mb must be zero or more megabytes"),
    ('metadata = "sqlite:///x.db"\nportt = 3181\n', "unknown key(s) portt"),
    ('metadata = [broken\n', "not valid TOML"),
])
def test_bad_bookie_config_is_a_clear_error_at_start_up(tmp_path, content, complaint):
    config = tmp_path / "bookie.toml"
    config.write_text(content)
    result = run_bookie_cli("--config", str(config))
    assert result.returncode != 0
    assert complaint in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_bookie_flag_is_a_clear_error(tmp_path, metadata_url):
    result = run_bookie_cli("--metadata", metadata_url, "--storage", "nope://x", "--port", str(free_port()))
    assert result.returncode != 0 and "storage" in result.stderr and "Traceback" not in result.stderr
    result = run_bookie_cli("--metadata", metadata_url, "--group-wait-ms", "-1")
    assert result.returncode != 0 and "group_wait_ms must be" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only); CI runs as root")
def test_a_disk_that_fills_between_checks_stops_the_bookie_and_it_restarts_read_only(tmp_path):
    """A real file system runs out of space (ENOSPC) under a bookie faster than its disk checks.

    Bookie 0's data is on a 24 MB tmpfs and the disk is checked once an hour, so 64 MB of
    entries fill it between two checks: the journal's write fails, the bookie stops (a storage
    failure), the writer replaces it and no acknowledged entry is lost. Restarted on the full
    disk, the bookie registers read-only before anyone can pick it, and serves what it stored.
    A 1 MB file kept on the tmpfs is deleted before the restart, as an operator would free a
    little room first: the files storage writes a checkpoint when it opens.
    """
    mount = tmp_path / "cluster" / "bookie-0"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        reserve = mount / "reserve"
        with open(reserve, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 1 << 20)
        with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files",
                          bookie_args=("--disk-min-free-mb", "4", "--disk-check-interval", "3600")) as cluster, \
                walkit.Client(cluster.metadata_url, add_timeout=30.0) as client:
            address = cluster.addresses[0]
            writer = None
            while writer is None:                          # a ledger whose ensemble includes bookie 0
                candidate = client.create_ledger(3, 3, 2, password=b"pw")
                if address in candidate.metadata.current_ensemble:
                    writer = candidate
                else:
                    candidate.close()
            payloads = [os.urandom(16 * 1024) for _ in range(4000)]
            for start in range(0, len(payloads), 200):
                futures = [writer.append_async(p) for p in payloads[start:start + 200]]
                assert [f.result(60) for f in futures] == list(range(start, start + len(futures)))
            writer.close()
            assert cluster._bookies[0].process.wait(30) != 0
            assert "No space left on device" in cluster.log_tail(0, lines=50)
            assert address not in client.ledger_metadata(writer.ledger_id).current_ensemble
            reader = client.open_ledger(writer.ledger_id, password=b"pw")
            assert [e.payload for e in reader.read(0, len(payloads) - 1)] == payloads

            reserve.unlink()
            cluster.start_bookie(0)
            assert client.bookies()[address].read_only           # registered read-only, not turned later
            assert "read-only from the start" in cluster.log_tail(0, lines=50)
            with RawBookie(address) as raw:
                assert raw.add(999_999, 0, master_key=MASTER_KEY).status == Status.READ_ONLY
                reads = raw.read(writer.ledger_id, list(range(10)))      # synced long before the disk filled
                assert reads.status == Status.OK
                assert [e.payload for e in reads.entries] == payloads[:10]
            for _ in range(10):                                       # never chosen for new ledgers
                ledger = client.create_ledger(3, 3, 2)
                assert address not in ledger.metadata.current_ensemble
                ledger.close()
    finally:
        if subprocess.run(["umount", str(mount)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)])          # busy: detach it now, freed when let go


def test_full_disk_turns_a_bookie_read_only_and_back(tmp_path):
    usage = shutil.disk_usage(tmp_path)
    filler_bytes = 2 << 30
    used = (usage.total - usage.free) / usage.total
    share = filler_bytes / usage.total
    threshold, lwm = used + share / 2, used + share / 4
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files") as cluster, \
            walkit.Client(cluster.metadata_url, add_timeout=2.0) as client:
        port = free_port()
        address = f"127.0.0.1:{port}"
        special = subprocess.Popen(
            [sys.executable, "-m", "walkit", "bookie", "--metadata", cluster.metadata_url, "--port", str(port),
             "--storage", f"files://{tmp_path}/special", "--disk-usage-threshold", f"{threshold:.9f}",
             "--disk-usage-lwm", f"{lwm:.9f}", "--disk-check-interval", "0.1"],
            stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: address in client.bookies(), timeout=20)
            writer = None
            for _ in range(200):                              # a ledger whose ensemble includes the bookie
                candidate = client.create_ledger(3, 2, 2, password=b"pw")
                if address in candidate.metadata.current_ensemble:
                    writer = candidate
                    break
                candidate.close()
            assert writer is not None
            first = [writer.append(f"e{i}".encode()) for i in range(30)]
            filler = tmp_path / "filler"
            with open(filler, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, filler_bytes)
            try:
                wait_until(lambda: client.bookies()[address].read_only, timeout=20)
                with RawBookie(address) as raw:
                    assert raw.add(999_999, 0, master_key=MASTER_KEY).status == Status.READ_ONLY
                    stored = [e for e in first if address in
                              walkit.core.distribution.write_set_bookies(e, writer.metadata.ensembles[0], 2)]
                    reads = raw.read(writer.ledger_id, stored)
                    assert reads.status == Status.OK and len(reads.entries) == len(stored)   # reads still served
                more = [writer.append(f"f{i}".encode(), timeout=30) for i in range(30)]
                assert more == list(range(30, 60))                    # replaced like a failed bookie
                assert address not in client.ledger_metadata(writer.ledger_id).current_ensemble
                for _ in range(20):                                   # never chosen for new ledgers
                    ledger = client.create_ledger(3, 2, 2)
                    assert address not in ledger.metadata.current_ensemble
                    ledger.close()
            finally:
                filler.unlink()
            wait_until(lambda: not client.bookies()[address].read_only, timeout=20)
            with RawBookie(address) as raw:
                assert raw.add(999_999, 0, master_key=MASTER_KEY).status == Status.OK
        finally:
            special.terminate()
            special.wait(10)
