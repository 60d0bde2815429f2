"""Unbounded ledgers rotate fragments, and truncation frees disk on every bookie (issue 39, item 6).

Real bookie processes: a 3-bookie cluster (no spare bookie, so every fragment names all three),
an unbounded ledger or log written past several rotations, then truncated; each bookie's garbage
collection drops the entries below the new first entry and its storage directory shrinks.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

import walkit
from walkit.core.messages import Status
from walkit.errors import NoSuchEntry
from walkit.local import LocalCluster

from .helpers import RawBookie, wait_until

pytestmark = pytest.mark.slow

ENTRY = 4096
GC = ("--gc-interval", "0.5", "--no-autorecovery")


def disk_bytes(path: str) -> int:
    """disk_bytes is the space the files under `path` take on disk (allocated blocks)."""
    return sum(os.stat(os.path.join(root, name)).st_blocks * 512
               for root, _, names in os.walk(path) for name in names)


def bookie_folders(cluster: LocalCluster) -> list[str]:
    return [os.path.join(cluster.data_dir, f"bookie-{i}") for i in range(3)]


def hold(pid: int, seconds: float) -> threading.Timer:
    """hold stops process `pid` (SIGSTOP) and lets it go on (SIGCONT) `seconds` later."""
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    timer.start()
    return timer


def payload(i: int) -> bytes:
    return (b"%08d" % i) * (ENTRY // 8)


STORAGES = {
    # small entry logs, so the ~4 MB written spans many of them and whole logs can go
    "files": "files://{data}/bookie-{{i}}?entrylog_max_mb=0.25",
    "sqlite": "sqlite://{data}/bookie-{{i}}/entries.db",
}


@pytest.mark.parametrize("kind", sorted(STORAGES))
def test_truncating_a_rotated_unbounded_ledger_shrinks_every_bookie_s_storage(tmp_path, kind):
    data = str(tmp_path / "cluster")
    limit, batch = 256 * 1024 // ENTRY, 20                            # a fragment ends past 64 entries
    # A fragment rotates once its entries are on all Qw bookies, and the new one starts after the
    # LAFR. With Qa 2 of Qw 3 the slowest bookie may fall behind by max_bytes_in_flight (32 MB by
    # default) and stay there while the writer goes on (CI met a fragment of 2,020 entries): the
    # writer here lets one batch be in flight, so a rotation is passed by one batch at most.
    with LocalCluster(bookies=3, data_dir=data, storage=STORAGES[kind].format(data=data), bookie_args=GC) as cluster, \
            walkit.Client(cluster.metadata_url, max_bytes_in_flight=batch * ENTRY) as client:
        writer = client.create_ledger(3, 3, 2, password=b"pw", unbounded=True, fragment_max_bytes=256 * 1024)
        count = 0
        # ~4 MB and 10 fragments at least, stopping just after a rotation. A rotation put off is
        # tried again a second later: from then on one entry at a time, not thousands a second.
        while count < 10_000:
            size = 1 if writer.rotations_put_off[0] else batch
            if count == 400:                        # the slowest bookie, made so: held for a second
                held = hold(cluster.pid(2), 1.0)
            writer.append_many([payload(i) for i in range(count, count + size)])
            count += size
            starts = writer.metadata.fragment_starts
            if count >= 1000 and len(starts) >= 10 and count - starts[-1] <= 2 * batch:
                break
        held.join()
        metadata = writer.metadata
        put_off, because = writer.rotations_put_off
        assert len(starts) >= 10 and count - starts[-1] <= 2 * batch, (starts, count, put_off, because)
        assert set(metadata.ensembles.values()) == {metadata.current_ensemble}     # no spare: the same bookies
        sizes = [b - a for a, b in zip(starts, starts[1:])]
        assert all(size >= limit for size in sizes), starts        # a limit is a threshold: never ends early
        # Passed by what completes at once (a batch), unless a rotation was put off: then the
        # fragment holds what comes in the second until it is tried again.
        late = [size for size in sizes if size > limit + batch]
        assert len(late) <= put_off, (starts, put_off, because)

        folders = bookie_folders(cluster)
        full = [disk_bytes(f) for f in folders]
        assert all(size > 3 * 1024 * 1024 for size in full), full
        first = starts[-1] - 60                                        # inside the fragment before the last
        truncated = client.truncate_ledger(writer.ledger_id, first)
        assert truncated.first_entry_id == first and len(truncated.ensembles) <= 3

        def shrunk() -> bool:
            return all(disk_bytes(f) < 0.35 * size for f, size in zip(folders, full))
        wait_until(shrunk, 60, interval=0.2,
                   message=lambda: f"bookie storage did not shrink: {full} -> {[disk_bytes(f) for f in folders]}")
        for address in metadata.current_ensemble:                     # each bookie: nothing below `first` left
            with RawBookie(address) as raw:
                answer = raw.read(writer.ledger_id, [5, first - 1, first])   # absent ids are left out of an answer
                assert answer.status == Status.OK and [e.entry_id for e in answer.entries] == [first]
                assert answer.entries[0].payload == payload(first)

        for i in range(count, count + 20):                            # the writer goes on
            writer.append(payload(i))
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read(first)] == [payload(i) for i in range(first, reader.last_add_confirmed + 1)]
        assert reader.last_add_confirmed >= count + 18                 # (the last LAC travels with the next add)
        with pytest.raises(NoSuchEntry):
            list(reader.read(first - 1, first - 1))


def test_an_unbounded_log_rotates_by_its_roll_bytes_and_its_truncation_shrinks_every_bookie(tmp_path):
    data = str(tmp_path / "cluster")
    # A rotation the writer puts off is tried again a second later (WriteHandle.rotations_put_off):
    # each phase writes until what it waits for happened, one append at a time, within a bound.
    with LocalCluster(bookies=3, data_dir=data, storage=STORAGES["files"].format(data=data),
                      bookie_args=GC) as cluster, \
            walkit.Client(cluster.metadata_url, max_bytes_in_flight=64 * 1024) as client:
        log = client.open_log("events", unbounded=True, write_quorum=3, roll_bytes=256 * 1024)
        positions: list = []

        def starts() -> list[int]:
            return client.ledger_metadata(log.ledger_id).fragment_starts

        def append_until(done, most: int) -> None:
            while not done():
                assert len(positions) < most, (len(positions), starts(), log._handle.rotations_put_off)
                positions.append(log.append(payload(len(positions))))

        append_until(lambda: len(positions) >= 800 and len(starts()) >= 8, 6000)     # ~13 at 800
        log.close()
        log = client.open_log("events")                               # a takeover rotates with the log's config
        first = len(positions)
        append_until(lambda: len(positions) > first and starts()[-1] > positions[first].entry_id
                     and positions[-1].entry_id - starts()[-1] >= 40, first + 6000)
        cut = next(i for i, p in enumerate(positions) if p.entry_id >= starts()[-1])   # the last fragment's first

        folders = bookie_folders(cluster)
        full = [disk_bytes(f) for f in folders]
        log.truncate(positions[cut])
        wait_until(lambda: all(disk_bytes(f) < 0.4 * size for f, size in zip(folders, full)), 60, interval=0.2,
                   message=lambda: f"bookie storage did not shrink: {full} -> {[disk_bytes(f) for f in folders]}")
        records = [r.payload for r in client.read_log("events")]
        assert records == [payload(i) for i in range(cut, len(positions))]
        log.close()


def test_with_spare_bookies_rotation_moves_the_ledger_and_truncation_drops_it_from_the_old_ones(tmp_path):
    """Six bookies, ensembles of three: each rotation takes the three others, so after a truncation
    into the last fragment the old three drop the ledger and the current three their old entries."""
    data = str(tmp_path / "cluster")
    with LocalCluster(bookies=6, data_dir=data, storage=STORAGES["files"].format(data=data),
                      bookie_args=GC) as cluster, walkit.Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 3, 2, password=b"pw", unbounded=True, fragment_max_bytes=256 * 1024)
        for start in range(0, 600, 20):
            writer.append_many([payload(i) for i in range(start, start + 20)])
        metadata = writer.metadata
        ensembles = [set(metadata.ensembles[s]) for s in metadata.fragment_starts]
        # a rotation takes the three others; an ordinary change (an answer slow on a loaded machine)
        # replaces one bookie and keeps two; a rotation whose spares did not answer their cleaning
        # within add_timeout_ms keeps all three (the spares sit out CHOOSE_RETRY_MS): nothing else
        pairs = list(zip(ensembles, ensembles[1:]))
        assert len(ensembles) >= 6 and all(not a & b or len(a & b) == 2 or a == b for a, b in pairs), ensembles
        assert sum(1 for a, b in pairs if not a & b) >= len(pairs) // 2, f"few rotations: {ensembles}"
        current = set(metadata.current_ensemble)
        folders = {address: os.path.join(data, f"bookie-{i}") for i, address in enumerate(cluster.addresses)}
        full = {address: disk_bytes(folder) for address, folder in folders.items()}
        before = metadata.last_fragment_start + 1
        assert len(client.truncate_ledger(writer.ledger_id, before).ensembles) == 1

        def gone(address: str) -> bool:
            with RawBookie(address) as raw:
                return raw.read_lac(writer.ledger_id).status == Status.NO_SUCH_LEDGER
        for address in set(cluster.addresses) - current:
            wait_until(lambda: gone(address), 60, interval=0.2,
                       message=f"bookie {address}, outside every fragment left, kept the ledger")
        wait_until(lambda: all(disk_bytes(folders[a]) < 0.5 * full[a] for a in current), 60, interval=0.2,
                   message=lambda: f"{[(full[a], disk_bytes(folders[a])) for a in current]}")
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read(before)] == [payload(i)
                                                            for i in range(before, reader.last_add_confirmed + 1)]
