"""The files:// backend: the EntryStorage conformance suite plus journal, checkpoint and GC checks."""

from __future__ import annotations

import errno
import logging
import os
import struct
import tracemalloc

import pytest

from tests.unit.helpers import MASTER_KEY, make_entry
from walkit.bookie.service import BookieService
from walkit.core.bookie import TOMBSTONE, LedgerState
from walkit.core.messages import AddRequest, ForceRequest, Status
from walkit.errors import ConfigError, StorageError
from walkit.plugins import open_storage
from walkit.plugins.storage.files import FileStorage
from walkit.plugins.storage.files import checkpoint as checkpoint_format
from walkit.plugins.storage.files import index as index_module
from walkit.plugins.storage.files import journal as journal_format
from walkit.plugins.storage.files.disk import numbered_files
from walkit.plugins.storage.files.entrylog import log_path
from walkit.testing.crash import kill_self, run_in_child
from walkit.testing.storage import EntryStorageConformance, Workload, payload
from walkit.wire.codec import decode_responses, encode_requests


class TestFilesConformance(EntryStorageConformance):
    @pytest.fixture
    def storage_factory(self):
        """storage_factory opens ``files://<path>`` through the plugin registry, with small files."""
        return lambda path: open_storage(f"files://{path}?entrylog_max_mb=1&journal_max_mb=2")


def journal_of(path: str) -> str:
    """journal_of returns the end of a files storage's journal: its highest-numbered entry log."""
    files = numbered_files(os.path.join(path, "logs"), "log", 8)
    assert files, "no entry log"
    return files[-1][1]


def records_end(journal: str) -> int:
    """records_end is where an entry log's good records end (after a crash, its preallocated zeros follow)."""
    reader = journal_format.RecordFile(journal)
    for _ in reader.chunks():
        pass
    return reader.end


def write_after_records(journal: str, data: bytes) -> int:
    """write_after_records writes `data` where the log's records end, as a crash's torn group commit
    lands in the preallocated space; it returns that offset."""
    end = records_end(journal)
    with open(journal, "r+b") as f:
        f.seek(end)
        f.write(data)
    return end


def folder_bytes(path: str) -> int:
    """folder_bytes sums the sizes of the files under `path`."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def crash_after(path: str, workload: Workload, groups: int, **options) -> None:
    """crash_after writes and syncs `groups` groups in a child process that then exits without close."""
    reports, how = run_in_child(lambda report: workload.run(lambda p: FileStorage(p, **options), path, report,
                                                            groups=groups))
    assert how == "exit 0" and len(reports) == groups


def _put_record(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    buffer = bytearray()
    journal_format.encode_put(buffer, ledger_id, entry_id, data)
    return bytes(buffer)


def fail_index_writes(monkeypatch, ledger_id: int):
    """fail_index_writes makes every index write of `ledger_id` fail (EFBIG); it returns the real writer, to put back."""
    real = index_module.LedgerIndex._write_slots

    def failing(self, failing_ledger, slots):
        if failing_ledger == ledger_id:
            raise OSError(errno.EFBIG, "File too large")
        return real(self, failing_ledger, slots)
    monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", failing)
    return real


def service_round_trip(service: BookieService, *requests) -> dict:
    """service_round_trip hands `requests` to a bookie service in one frame and returns its answers by txn."""
    service.receive(b"peer", encode_requests(list(requests)))
    return {r.txn: r for _, frame in service.flush() for r in decode_responses(frame)}


_TORN_TAILS = {
    "half a header": lambda: _put_record(9, 0, b"x" * 100)[:4],
    "half a record": lambda: _put_record(9, 0, b"x" * 100)[:60],
    "garbage": lambda: b"\xde\xad\xbe\xef" * 8,
    "huge length": lambda: struct.pack("<IIB", 0xFFFFFFF0, 0, 1) + b"x" * 20,
    "zeroes": lambda: b"\0" * 64,
}


# -- preallocation of the active entry log -----------------------------------------------------
def test_the_active_entry_log_is_preallocated_and_cut_back_to_its_records_on_close(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path)
    for entry_id in range(50):
        storage.put(1, entry_id, payload(1, entry_id, 1024))
    storage.sync()
    journal = journal_of(path)
    assert os.path.getsize(journal) >= records_end(journal) + 1024 * 1024      # room for later groups
    storage.close()
    assert os.path.getsize(journal) == records_end(journal) > 50 * 1024


def test_a_crash_leaves_zeros_after_the_records_and_the_restart_cuts_them_without_a_warning(tmp_path, caplog):
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=5)
    journal = journal_of(path)
    end = records_end(journal)
    assert os.path.getsize(journal) > end                     # the crash left the preallocated space
    with caplog.at_level(logging.INFO, logger="walkit.storage"):
        storage = FileStorage(path)
    try:
        # Only the storage's records: a client thread another test of this worker left behind may log too.
        assert [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("walkit.storage")] == []
        assert any("preallocated" in r.getMessage() for r in caplog.records)
        workload.check(storage, 5)
        storage.put(7, 0, b"after the restart")               # appended after the records, not the zeros
        storage.sync()
    finally:
        storage.close()
    assert os.path.getsize(journal) == records_end(journal) > end
    storage = FileStorage(path)
    try:
        workload.check(storage, 5)
        assert storage.get(7, 0) == b"after the restart"
    finally:
        storage.close()


def test_a_finished_entry_log_holds_only_its_records(tmp_path):
    """A log is cut back to its records (durably) before the next one takes writes: only the last
    log can have a zero tail after a crash, where replay expects it."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9)
    try:
        for entry_id in range(800):
            storage.put(1, entry_id, payload(1, entry_id, 1024))
            if entry_id % 20 == 19:
                storage.sync()
        logs = numbered_files(os.path.join(path, "logs"), "log", 8)
        assert len(logs) >= 3
        for _, finished in logs[:-1]:
            assert os.path.getsize(finished) == records_end(finished)
        assert all(storage.get(1, e) == payload(1, e, 1024) for e in range(0, 800, 7))
    finally:
        storage.close()


def test_preallocate_mb_0_grows_the_active_log_by_appends(tmp_path):
    storage = open_storage(f"files://{tmp_path}/s?preallocate_mb=0")
    try:
        storage.put(1, 0, b"x" * 100)
        storage.sync()
        journal = journal_of(str(tmp_path / "s"))
        assert os.path.getsize(journal) == records_end(journal) > 100
    finally:
        storage.close()


def test_a_file_system_that_cannot_preallocate_gets_appends(tmp_path, monkeypatch):
    from walkit.plugins.storage.files import entrylog

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(entrylog.os, "posix_fallocate", unsupported)
    path = str(tmp_path / "s")
    storage = FileStorage(path)
    try:
        for entry_id in range(30):
            storage.put(1, entry_id, payload(1, entry_id, 512))
            storage.sync()
            journal = journal_of(path)
            assert os.path.getsize(journal) == records_end(journal)
        assert storage._logs.preallocate == 0
    finally:
        storage.close()
    storage = FileStorage(path)
    try:
        assert all(storage.get(1, e) == payload(1, e, 512) for e in range(30))
    finally:
        storage.close()


@pytest.mark.parametrize("tail", sorted(_TORN_TAILS))
def test_torn_journal_tail_is_truncated_with_a_warning(tmp_path, caplog, tail):
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=6)
    journal = journal_of(path)
    good = write_after_records(journal, _TORN_TAILS[tail]())
    assert good > 0
    with caplog.at_level(logging.INFO, logger="walkit.storage"):
        storage = FileStorage(path)
    try:
        warnings = [r.getMessage() for r in caplog.records if r.name == "walkit.storage" and r.levelno >= logging.WARNING]
        if tail == "zeroes":        # zeros are what the preallocated space holds anyway: nothing was torn
            assert warnings == []
            assert any("preallocated" in r.getMessage() and f"offset {good}" in r.getMessage() for r in caplog.records)
        else:
            assert len(warnings) == 1 and journal in warnings[0] and f"offset {good}" in warnings[0], warnings
        assert os.path.getsize(journal) == good
        assert storage.replayed_records > 0
        workload.check(storage, 6)
        assert storage.get(9, 0) is None
    finally:
        storage.close()


def test_a_group_torn_in_its_middle_inside_the_preallocated_space_is_truncated_not_refused(tmp_path, caplog):
    """A power cut can write a group commit's later pages and not an earlier one: a hole with whole records after it.

    That group was never acknowledged (its fdatasync did not return), so it is the torn tail and
    is dropped. The zeros of the preallocated space after it are not "synced data after the
    damage": only the group itself counts against the torn-tail limit.
    """
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=6)
    journal = journal_of(path)
    size = len(_put_record(9, 0, bytes(8000)))
    group = b"".join(_put_record(9, entry_id, bytes([entry_id + 1]) * 8000) for entry_id in range(20))
    hole = size * 5 + 1000                                      # one page inside the 6th record's data
    torn = group[:hole] + bytes(4096) + group[hole + 4096:]
    start = write_after_records(journal, torn)
    # A 1 MiB write buffer makes the torn-tail limit 2 MiB, below the 16 MiB preallocated.
    assert os.path.getsize(journal) - start > 2 * 1024 * 1024 > len(torn)
    with caplog.at_level(logging.WARNING, logger="walkit.storage"):
        storage = FileStorage(path, write_buffer_mb=1)
    try:
        warnings = [r.getMessage() for r in caplog.records if r.name == "walkit.storage"]
        bad = start + size * 5
        assert len(warnings) == 1 and journal in warnings[0] and f"offset {bad}" in warnings[0], warnings
        assert os.path.getsize(journal) == bad
        workload.check(storage, 6)
        assert [storage.get(9, e) for e in range(5)] == [bytes([e + 1]) * 8000 for e in range(5)]
        assert storage.get(9, 5) is None and storage.get(9, 19) is None
    finally:
        storage.close()


@pytest.mark.parametrize("preallocate_mb", [16, 0], ids=["preallocated", "appended"])
@pytest.mark.parametrize("seed", range(12))
def test_any_damage_to_the_unsynced_last_group_leaves_every_synced_group_and_a_prefix_of_it(tmp_path, caplog, seed,
                                                                                           preallocate_mb):
    """A power cut can leave the last group commit's pages in any state: written, zero, or stale garbage.

    Whatever the mix, the restart must open (it never refuses a torn last group), keep every
    synced group, keep of the torn group only a prefix of whole records, and the next restart
    must be clean.
    """
    import random
    rng = random.Random(seed)
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=5, preallocate_mb=preallocate_mb)
    journal = journal_of(path)
    sizes = [rng.choice([100, 3000, 9000]) for _ in range(rng.randint(2, 30))]
    group = [_put_record(9, entry_id, bytes([entry_id % 250 + 1]) * size) for entry_id, size in enumerate(sizes)]
    data = bytearray(b"".join(group))
    start = records_end(journal)
    pages = range(start // 4096, (start + len(data) - 1) // 4096 + 1)
    for page in rng.sample(list(pages), rng.randint(1, len(pages))):      # the pages the power cut lost
        first, last = max(page * 4096, start) - start, min((page + 1) * 4096, start + len(data)) - start
        data[first:last] = bytes(last - first) if rng.random() < 0.5 else rng.randbytes(last - first)
    if rng.random() < 0.3:
        del data[rng.randrange(len(data)):]                               # and the file ends early
    write_after_records(journal, bytes(data))
    storage = FileStorage(path, write_buffer_mb=1)                        # a torn-tail limit of 2 MiB
    try:
        workload.check(storage, 5)
        kept = [storage.get(9, entry_id) for entry_id in range(len(sizes))]
        survivors = len(kept) - kept.count(None)
        assert kept[:survivors] == [bytes([e % 250 + 1]) * sizes[e] for e in range(survivors)], "not a prefix"
        assert os.path.getsize(journal) == start + sum(map(len, group[:survivors]))
    finally:
        storage.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="walkit.storage"):
        FileStorage(path, write_buffer_mb=1).close()
    assert [r.getMessage() for r in caplog.records if r.name == "walkit.storage"] == []


def test_a_put_that_would_overflow_the_write_buffer_syncs_what_was_buffered_first(tmp_path):
    """A group is at most write_buffer_mb or one batch: replay's torn-tail limit (twice write_buffer_mb) relies on it."""
    storage = FileStorage(str(tmp_path / "s"), write_buffer_mb=10 / 1024)        # 10 KiB
    groups = []                                                 # the bytes of each group commit
    commit = storage._logs.commit
    storage._logs.commit = lambda buffer: groups.append(len(buffer)) or commit(buffer)
    record = journal_format.HEADER.size + journal_format.PUT_IDS.size      # a PUT record's bytes besides its data
    try:
        storage.put(1, 0, b"a" * 6000)
        storage.put_many(1, [(1, b"b" * 3000), (2, b"c" * 3000), (3, b"d" * 3000)])   # 6 + 9 KiB > 10 KiB
        storage.put(1, 4, b"e" * 2000)                                                 # 9 + 2 KiB > 10 KiB
        storage.put(1, 5, b"f" * 20000)                             # larger than the buffer: alone
        storage.sync()
        assert groups == [record + 6000, 3 * (record + 3000), record + 2000, record + 20000]
        assert [len(storage.get(1, e)) for e in range(6)] == [6000, 3000, 3000, 3000, 2000, 20000]
    finally:
        storage.close()


def test_corrupt_crc_at_the_tail_drops_only_that_record(tmp_path, caplog):
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=4)
    journal = journal_of(path)
    record = bytearray(_put_record(2, 500, b"last record"))   # a last, complete record ...
    record[-1] ^= 0x01                                        # ... with one flipped payload byte
    start = write_after_records(journal, bytes(record))
    with caplog.at_level(logging.WARNING, logger="walkit.storage"):
        storage = FileStorage(path)
    try:
        message = caplog.records[-1].getMessage()
        assert "checksum" in message and journal in message and f"offset {start}" in message
        workload.check(storage, 4)
        assert storage.get(2, 500) is None
    finally:
        storage.close()


@pytest.mark.parametrize("ledger_id, entry_id", [(3, 1 << 40), (3, 1 << 62), (-5, 0)],
                         ids=["entry-2^40", "entry-2^62", "negative-ledger"])
def test_a_journal_record_no_index_can_hold_stops_the_open_instead_of_being_skipped(tmp_path, ledger_id, entry_id):
    """Issue 39: such a record verifies, so it may have been synced, and a bookie before issue 11 (which did not
    check ids) may have acknowledged it; skipping it, as issue 11 did, could drop an acknowledged
    entry. The open names the journal and the record's offset, and the checkpoint stays before it."""
    path, workload = str(tmp_path / "s"), Workload()
    crash_after(path, workload, groups=2)
    journal = journal_of(path)
    offset = write_after_records(journal, _put_record(ledger_id, entry_id, b"unindexable")
                                 + _put_record(2, 700, b"after it"))
    with open(os.path.join(path, "checkpoint"), "rb") as f:
        before = f.read()
    for _ in range(2):                                   # every open refuses it, none drops it
        with pytest.raises(StorageError) as caught:
            FileStorage(path)
        message = str(caught.value)
        assert f"replay stopped at journal {journal} offset {offset}: entry ({ledger_id}, {entry_id}) is out of " \
               f"the range an index holds" in message and "not skipped" in message
        with open(os.path.join(path, "checkpoint"), "rb") as f:
            assert f.read() == before


def test_put_refuses_ids_the_index_cannot_hold(tmp_path):
    storage = FileStorage(str(tmp_path / "s"))
    try:
        for ledger_id, entry_id in [(1, FileStorage.max_entry_id + 1), (-1, 0), (1, -1)]:
            with pytest.raises(ValueError):
                storage.put(ledger_id, entry_id, b"x")
        storage.put(1, FileStorage.max_entry_id, b"highest")
        storage.sync()
        assert storage.get(1, FileStorage.max_entry_id) == b"highest"
    finally:
        storage.close()


def test_put_many_writes_the_same_journal_as_put_and_refuses_a_bad_batch_whole(tmp_path):
    one, many = FileStorage(str(tmp_path / "one")), FileStorage(str(tmp_path / "many"))
    entries = [(entry_id, payload(7, entry_id, 100 + entry_id)) for entry_id in range(50)]
    try:
        for entry_id, data in entries:
            one.put(7, entry_id, data)
        many.put_many(7, entries[:20])
        many.put_many(7, [(entry_id, bytearray(data)) for entry_id, data in entries[20:]])
        assert many.get(7, 30) == entries[30][1] and many.last_entry(7) == 49        # readable before the sync
        assert bytes(one._buffer) == bytes(many._buffer)
        for bad in ([(50, b"ok"), (FileStorage.max_entry_id + 1, b"too far")], [(50, b"ok"), (-1, b"negative")]):
            with pytest.raises(ValueError):
                many.put_many(7, bad)
            assert many.get(7, 50) is None and many.last_entry(7) == 49                # nothing of it stored
        with pytest.raises(ValueError):
            many.put_many(-3, [(0, b"x")])
        with pytest.raises(TypeError):                     # not bytes: refused, not stored as 5 zero bytes
            many.put_many(7, [(50, b"ok"), (51, 5)])
        assert many.get(7, 50) is None
        many.put_many(7, [])
        many.sync()
    finally:
        one.close()
        many.close()
    reopened = FileStorage(str(tmp_path / "many"))
    try:
        assert reopened.get_many(7, list(range(50))) == [data for _, data in entries]
    finally:
        reopened.close()


def test_an_index_write_failure_fails_that_ledger_only(tmp_path, monkeypatch):
    from walkit.errors import LedgerStorageError
    from walkit.plugins.storage.files import index as index_module
    storage = FileStorage(str(tmp_path / "s"))
    try:
        real = fail_index_writes(monkeypatch, 13)
        storage.put(12, 0, b"fine")
        storage.put(13, 0, b"doomed")
        with pytest.raises(LedgerStorageError) as caught:
            storage.sync()
        assert caught.value.ledgers == {13}
        monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", real)
        assert storage.get(12, 0) == b"fine"
        storage.put(12, 1, b"still working")
        storage.sync()                                    # the storage as a whole did not fail
        assert storage.get(12, 1) == b"still working"
    finally:
        storage.close()


def test_a_put_whose_early_sync_fails_another_ledger_stores_its_entries_and_names_that_ledger(tmp_path, monkeypatch):
    """The sync a put makes before its entries (to keep the group within the buffer) may fail some ledgers' indexes.

    The put still stores its own entries, so a bookie's view of its ledger matches storage, and
    then raises LedgerStorageError naming the ledgers that failed (the bookie fails their requests).
    """
    from walkit.errors import LedgerStorageError
    storage = FileStorage(str(tmp_path / "s"), write_buffer_mb=10 / 1024)
    try:
        real = fail_index_writes(monkeypatch, 13)
        storage.put(13, 0, b"doomed" * 1000)
        with pytest.raises(LedgerStorageError) as caught:
            storage.put_many(12, [(0, b"a" * 3000), (1, b"b" * 3000)])       # 6 + 6 KiB: 13's group goes first
        assert caught.value.ledgers == {13} and storage.fsyncs == 1
        monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", real)
        assert storage.get(12, 0) == b"a" * 3000                  # buffered, readable ...
        storage.sync()
        assert storage.fsyncs == 2 and storage.get(12, 1) == b"b" * 3000     # ... and durable
    finally:
        storage.close()
    storage = FileStorage(str(tmp_path / "s"))
    try:
        assert storage.get(12, 0) == b"a" * 3000 and storage.get(12, 1) == b"b" * 3000
    finally:
        storage.close()


def test_corruption_before_later_journal_data_is_refused(tmp_path):
    path = str(tmp_path / "s")
    crash_after(path, Workload(), groups=3)
    journal = journal_of(path)
    with open(journal, "r+b") as f:                          # flip a byte of the first record
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    last = numbered_files(os.path.join(path, "logs"), "log", 8)[-1][0]
    with open(log_path(os.path.join(path, "logs"), last + 1), "wb") as f:
        f.write(_put_record(1, 999, b"later"))
    with pytest.raises(StorageError, match="refusing to drop synced records"):
        FileStorage(path)


def test_group_commit_is_one_fdatasync_per_sync(tmp_path, monkeypatch):
    storage = FileStorage(str(tmp_path / "s"), checkpoint_s=1e9)
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    for group in range(10):
        for entry_id in range(group * 25, (group + 1) * 25):
            storage.put(group % 3, entry_id, b"e" * 100)
        storage.set_ledger_state(group % 3, LedgerState(explicit_lac=group))
        storage.sync()
        storage.sync()                                       # nothing new: no fdatasync
    assert len(calls) == 10 and storage.fsyncs == 10
    storage.close()


def test_checkpoints_run_by_bytes_written_and_by_time(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, journal_max_mb=0.05, checkpoint_s=1e9)
    for group in range(40):
        for entry_id in range(group * 20, (group + 1) * 20):
            storage.put(1, entry_id, payload(1, entry_id, 1000))
        storage.sync()
        storage.wait_for_checkpoint()                        # checkpoints run in the background
    assert storage.checkpoints >= 10                        # 800 KB of journal, one per 50 KB
    before = storage.checkpoints
    storage.put(1, 10_000, b"x")
    storage._last_checkpoint -= 1e10                         # as if checkpoint_s had passed
    storage.sync()
    storage.wait_for_checkpoint()
    assert storage.checkpoints == before + 1
    storage.close()


def test_a_background_checkpoint_leaves_the_syncs_to_go_on_meanwhile(tmp_path, monkeypatch):
    """sync() only starts a checkpoint; the fsyncs of the index files happen on another thread."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, journal_max_mb=0.05, checkpoint_s=1e9)
    started, release = _hold_background_fsyncs(monkeypatch)
    before = storage.checkpoints                             # opening checkpoints once
    entry_id = _fill_until_a_checkpoint_starts(storage, started)
    for more in range(entry_id, entry_id + 200):             # 200 KB more while it is held
        storage.put(1, more, payload(1, more, 1000))
        storage.sync()
    assert storage.checkpoints == before
    release.set()
    storage.wait_for_checkpoint()
    assert storage.checkpoints == before + 1
    storage.close()
    storage = FileStorage(path)
    try:
        assert all(storage.get(1, e) == payload(1, e, 1000) for e in range(entry_id + 200))
    finally:
        storage.close()


@pytest.mark.parametrize("crash_point", ["fsynced", "saved", "log started"])
def test_a_crash_during_a_background_checkpoint_loses_no_synced_entry(tmp_path, crash_point):
    path = str(tmp_path / "s")

    def work(report):
        from walkit.plugins.storage.files import storage as storage_module
        storage = FileStorage(path, journal_max_mb=0.05, entrylog_max_mb=0.12, checkpoint_s=1e9)
        owner, name = {"fsynced": (storage_module, "fsync_all"), "saved": (checkpoint_format, "save"),
                       "log started": (storage._logs, "rotate")}[crash_point]
        original, calls = getattr(owner, name), [0]

        def crash(*args):
            result = original(*args)
            calls[0] += 1
            if calls[0] == 3:                                # in the third background checkpoint
                kill_self()
            return result
        setattr(owner, name, crash)
        for group in range(1000):
            for entry_id in range(group * 10, group * 10 + 10):
                storage.put(group % 3, entry_id, payload(group % 3, entry_id, 1000))
            storage.sync()
            report(group)
    reports, how = run_in_child(work)
    assert how == "killed" and reports
    storage = FileStorage(path)
    try:
        for group in range(max(reports) + 1):
            for entry_id in range(group * 10, group * 10 + 10):
                assert storage.get(group % 3, entry_id) == payload(group % 3, entry_id, 1000)
    finally:
        storage.close()


def test_restart_replays_only_the_journal_after_the_checkpoint(tmp_path):
    path = str(tmp_path / "s")

    def work(report):
        storage = FileStorage(path, checkpoint_s=1e9)
        for entry_id in range(500):
            storage.put(1, entry_id, payload(1, entry_id))
            if entry_id % 100 == 99:
                storage.sync()
        storage.checkpoint()
        for entry_id in range(500, 530):
            storage.put(2, entry_id, payload(2, entry_id))
            if entry_id % 10 == 9:
                storage.sync()
        storage.set_ledger_state(2, LedgerState(fenced=True, master_key=b"k"))
        storage.sync()
        report(len(numbered_files(os.path.join(path, "logs"), "log", 8)))
    reports, how = run_in_child(work)
    assert how == "exit 0" and reports == [1]
    storage = FileStorage(path)
    try:
        assert storage.replayed_records == 31                # 30 puts and a state after the checkpoint
        assert all(storage.get(1, e) == payload(1, e) for e in range(500))
        assert all(storage.get(2, e) == payload(2, e) for e in range(500, 530))
        assert storage.ledger_state(2) == LedgerState(fenced=True, master_key=b"k")
    finally:
        storage.close()
    storage = FileStorage(path)                              # close checkpointed: nothing to replay
    assert storage.replayed_records == 0 and storage.get(2, 529) == payload(2, 529)
    storage.close()


def test_delete_and_compaction_give_disk_space_back(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9)
    for entry_id in range(600):                              # four ledgers interleaved in every log
        for ledger_id in (1, 2, 3, 4):
            storage.put(ledger_id, entry_id, payload(ledger_id, entry_id, 1024))
        storage.sync()
    storage.checkpoint()
    before = folder_bytes(path)
    logs_before = len(os.listdir(os.path.join(path, "logs")))
    for ledger_id in (1, 2, 3):
        storage.delete_ledger(ledger_id)
    storage.sync()
    freed = storage.compact()
    after = folder_bytes(path)
    assert freed > 0 and after < 0.4 * before, (before, after)
    assert len(os.listdir(os.path.join(path, "logs"))) < logs_before / 2
    assert sorted(os.listdir(os.path.join(path, "index"))) == [f"{4:016x}.idx"]
    assert all(storage.get(4, e) == payload(4, e, 1024) for e in range(600))
    storage.close()
    storage = FileStorage(path)
    try:
        assert storage.ledgers() == [4] and storage.last_entry(4) == 599
        assert all(storage.get(4, e) == payload(4, e, 1024) for e in range(600))
    finally:
        storage.close()


def test_compaction_whose_copies_could_not_be_indexed_removes_no_log(tmp_path, monkeypatch):
    """Copies of live entries go through the journal in groups (synced inside put past the write buffer);
    if a group's index slots fail, the checkpoint fails and the old logs stay."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9, write_buffer_mb=0.02)
    for entry_id in range(300):
        for ledger_id in (1, 2, 3, 4):
            storage.put(ledger_id, entry_id, payload(ledger_id, entry_id, 1024))
        storage.sync()
    storage.checkpoint()
    for ledger_id in (1, 2, 3):
        storage.delete_ledger(ledger_id)
    storage.sync()
    logs = sorted(os.listdir(os.path.join(path, "logs")))
    real = index_module.LedgerIndex._write_slots
    written = []

    def failing_once(self, ledger_id, slots):   # the first group of copies cannot be indexed
        written.append(ledger_id)
        if len(written) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, ledger_id, slots)
    monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", failing_once)
    with pytest.raises(StorageError):
        storage.compact()
    assert written                                           # the copies were being indexed when it failed
    assert set(logs) <= set(os.listdir(os.path.join(path, "logs")))     # no log was removed
    monkeypatch.undo()
    storage._release()
    storage = FileStorage(path)
    try:
        assert all(storage.get(4, e) == payload(4, e, 1024) for e in range(300))
    finally:
        storage.close()


def test_logs_of_deleted_ledgers_are_removed_and_compaction_survives_a_crash(tmp_path):
    path = str(tmp_path / "s")

    def work(report):
        storage = FileStorage(path, entrylog_max_mb=0.1, checkpoint_s=1e9)
        for ledger_id in (1, 2):                             # ledger 1 fills the first logs alone
            for entry_id in range(300):
                storage.put(ledger_id, entry_id, payload(ledger_id, entry_id, 1024))
            storage.sync()
        storage.put(3, 0, b"small")
        storage.delete_ledger(1)
        storage.sync()
        report(storage.compact())
        storage.put(2, 300, b"after compaction")
        storage.sync()
        kill_self()
    reports, how = run_in_child(work)
    assert how == "killed" and reports[0] > 300 * 1024
    storage = FileStorage(path)
    try:
        assert storage.ledgers() == [2, 3] and storage.get(1, 0) is None
        assert all(storage.get(2, e) == payload(2, e, 1024) for e in range(300))
        assert storage.get(2, 300) == b"after compaction" and storage.get(3, 0) == b"small"
    finally:
        storage.close()


@pytest.mark.parametrize("crash_point", ["copied", "rotated", "saved"])
def test_a_crash_inside_a_compacting_checkpoint_loses_nothing(tmp_path, crash_point):
    path = str(tmp_path / "s")

    def work(report):
        storage = FileStorage(path, entrylog_max_mb=0.1, checkpoint_s=1e9)
        for entry_id in range(200):
            for ledger_id in (1, 2, 3):
                storage.put(ledger_id, entry_id, payload(ledger_id, entry_id, 1024))
            storage.sync()
        storage.checkpoint()                                 # the entries now live in the entry logs only
        storage.delete_ledger(1)
        storage.delete_ledger(2)
        storage.sync()
        owner, name = {"copied": (storage._index, "fsync"), "rotated": (storage._logs, "rotate"),
                       "saved": (checkpoint_format, "save")}[crash_point]
        original = getattr(owner, name)

        def crash(*args):
            if crash_point != "copied":
                original(*args)
            kill_self()
        setattr(owner, name, crash)
        report(0)
        storage.compact()
    reports, how = run_in_child(work)
    assert how == "killed" and reports == [0]
    storage = FileStorage(path)
    try:
        assert storage.ledgers() == [3] and storage.get(1, 0) is None and storage.last_entry(2) == -1
        assert all(storage.get(3, e) == payload(3, e, 1024) for e in range(200))
        storage.compact()
        assert all(storage.get(3, e) == payload(3, e, 1024) for e in range(200))
    finally:
        storage.close()


def test_a_corrupt_entry_log_record_is_an_error_not_garbage(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path)
    storage.put(1, 0, b"precious bytes")
    storage.close()
    log_file = os.path.join(path, "logs", os.listdir(os.path.join(path, "logs"))[0])
    with open(log_file, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"XYZ")
    storage = FileStorage(path)
    with pytest.raises(StorageError, match="missing or corrupt"):
        storage.get(1, 0)
    storage.close()


@pytest.mark.parametrize("damage", ["payload byte", "crc", "kind", "ledger id", "entry id", "length", "torn"])
def test_put_data_returns_only_the_intact_record_it_was_asked_for(damage):
    buffer = bytearray(b"x" * 5)                                   # records start anywhere in a read block
    journal_format.encode_put(buffer, 7, 42, b"entry bytes")
    length = len(buffer) - 5 - journal_format.HEADER.size
    assert journal_format.put_data(memoryview(bytes(buffer)), 5, length, 7, 42) == b"entry bytes"
    ledger_id, entry_id = 7, 42
    if damage == "payload byte":
        buffer[-1] ^= 1
    elif damage == "crc":
        buffer[5 + 4] ^= 1
    elif damage == "kind":
        buffer[5 + 8] = journal_format.STATE
    elif damage == "ledger id":
        ledger_id = 8                                              # the index points at another ledger's record
    elif damage == "entry id":
        entry_id = 41
    elif damage == "length":
        length -= 1
    else:
        del buffer[-1]
    assert journal_format.put_data(memoryview(bytes(buffer)), 5, length, ledger_id, entry_id) is None


def test_a_corrupt_record_in_a_batch_read_is_an_error_not_garbage(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path)
    storage.put_many(1, [(e, payload(1, e, 300)) for e in range(10)])
    storage.sync()
    storage.close()
    log_file = os.path.join(path, "logs", os.listdir(os.path.join(path, "logs"))[0])
    with open(log_file, "r+b") as f:
        data = f.read()
        at = data.index(payload(1, 5, 300)) + 100
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
    storage = FileStorage(path)
    try:
        assert storage.get_many(1, [0, 1, 2, 3, 4]) == [payload(1, e, 300) for e in range(5)]
        with pytest.raises(StorageError, match="ledger 1 entry 5 is missing or corrupt"):
            storage.get_many(1, list(range(10)))
    finally:
        storage.close()


def _cached_bytes(path: str) -> int:
    """_cached_bytes is how much of a file the page cache holds (util-linux's fincore)."""
    import subprocess
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", path],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


@pytest.mark.processes
def test_a_finished_entry_log_leaves_the_page_cache_and_stays_readable(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25)
    try:
        for group in range(12):
            storage.put_many(1, [(e, payload(1, e, 1000)) for e in range(group * 50, group * 50 + 50)])
            storage.sync()
        folder = os.path.join(path, "logs")
        paths = [os.path.join(folder, name) for name in sorted(os.listdir(folder))]   # fixed-width hex names
        assert len(paths) >= 3
        assert all(_cached_bytes(p) == 0 for p in paths[:-1])           # finished: dropped
        assert _cached_bytes(paths[-1]) > 0                             # active: still cached for tailing reads
        assert storage.get_many(1, list(range(600))) == [payload(1, e, 1000) for e in range(600)]
    finally:
        storage.close()


def _footprint(path: str, entries: int) -> tuple[int, int]:
    """_footprint stores `entries` small entries; returns (Python memory retained, peak) in bytes."""
    tracemalloc.start()
    try:
        storage = FileStorage(path, journal_max_mb=4, checkpoint_s=1e9)
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        data = b"m" * 40
        for group in range(entries // 1000):
            for n in range(group * 1000, (group + 1) * 1000):
                storage.put(1 + n % 8, n // 8, data)
            storage.sync()
        assert storage.get(3, entries // 8 - 1) == data and storage.last_entry(3) == entries // 8 - 1
        current, peak = tracemalloc.get_traced_memory()
        storage.close()
        return current - base, peak - base
    finally:
        tracemalloc.stop()


def test_memory_stays_flat_as_entries_grow(tmp_path):
    small = _footprint(str(tmp_path / "small"), 10_000)
    large = _footprint(str(tmp_path / "large"), 100_000)
    assert large[0] < 2 * small[0] + 64 * 1024, (small, large)     # retained after the last sync
    assert large[1] < 2 * small[1] + 256 * 1024, (small, large)    # peak while writing


@pytest.mark.parametrize("query", ["journal_max_mb=0", "journal_max_mb=-5", "checkpoint_s=soon",
                                   "entrylog_max_mb=nan", "compact_ratio=1.5", "open_files=2.5",
                                   "open_files=0", "fsync=always", "preallocate_mb=-1", "preallocate_mb=4096"])
def test_bad_options_are_config_errors(tmp_path, query):
    with pytest.raises(ConfigError) as error:
        open_storage(f"files://{tmp_path}/s?{query}")
    assert query.split("=")[0] in str(error.value)


def test_options_from_the_uri_and_keywords(tmp_path):
    storage = FileStorage.from_uri(f"files://{tmp_path}/s?journal_max_mb=8&compact_ratio=0.25",
                                   checkpoint_s=5)
    assert (storage.journal_max, storage.compact_ratio, storage.checkpoint_s) == (8 << 20, 0.25, 5.0)
    storage.close()


def test_one_storage_per_directory(tmp_path):
    storage = FileStorage(str(tmp_path / "s"))
    with pytest.raises(ConfigError, match="already open"):
        FileStorage(str(tmp_path / "s"))
    storage.close()
    FileStorage(str(tmp_path / "s")).close()


def test_a_bookie_whose_storage_syncs_inside_put_and_fails_a_ledger_says_so_to_deferred_writers(tmp_path, monkeypatch):
    """files:// syncs inside put() past write_buffer_mb: if that sync fails ledger 13's index, the
    bookie fails the request being stored and takes a new instance, so a deferred-sync writer of
    ledger 13 (whose acknowledged entries are lost) learns of it from its next force."""
    service = BookieService(FileStorage(str(tmp_path / "s"), write_buffer_mb=0.05))

    def round_trip(*requests):
        return service_round_trip(service, *requests)

    def add(ledger_id, entry_id, txn, deferred=False, payload=None):
        return AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY, deferred_sync=deferred,
                          entries=[make_entry(entry_id, payload, ledger_id=ledger_id)])
    round_trip(add(13, 0, 1), add(12, 0, 2))
    instance = round_trip(add(13, 1, 3, deferred=True))[3].instance
    real = fail_index_writes(monkeypatch, 13)
    big = round_trip(add(12, 1, 4, deferred=True, payload=b"x" * 60_000))[4]      # put() syncs by itself
    assert big.status == Status.IO_ERROR and "13" in big.message
    monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", real)
    forced = round_trip(ForceRequest(txn=5, ledger_id=13, master_key=MASTER_KEY))[5]
    assert forced.status == Status.OK and forced.instance != instance
    service.storage.close()


def test_a_truncating_add_whose_put_fails_another_ledger_still_truncates(tmp_path, monkeypatch):
    """A put that syncs by itself may fail another ledger's index (LedgerStorageError). The step's later
    commands, a truncation's tombstones and mark here, must still be stored: the bookie's view of the
    ledger already moved, and a retried add is answered from that view."""
    from walkit.core.messages import ReadLacRequest, ReadRequest
    path = str(tmp_path / "s")

    def open_service():
        return BookieService(FileStorage(path, write_buffer_mb=0.05, checkpoint_s=1e9))     # ~51 KiB

    def add(txn, ledger_id, *ids, term=0, truncate=False, recovery=False, data=None):
        return AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY, term=term, truncate=truncate,
                          recovery=recovery, entries=[make_entry(i, data, lac=i - 1, ledger_id=ledger_id) for i in ids])
    service = open_service()
    assert service_round_trip(service, add(1, 1, 0, 1, 2, 3, term=1))[1].status == Status.OK
    assert service_round_trip(service, add(2, 13, 0))[2].status == Status.OK
    real = fail_index_writes(monkeypatch, 13)
    truncating = add(4, 1, 1, term=2, truncate=True, recovery=True, data=b"n" * 30_000)
    replies = service_round_trip(service, add(3, 13, 1, data=b"x" * 30_000), truncating)
    assert replies[3].status == Status.IO_ERROR and replies[4].status == Status.IO_ERROR
    monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", real)
    assert service_round_trip(service, truncating)[4].status == Status.OK           # the writer retries
    storage = service.storage
    assert storage.get(1, 2) == TOMBSTONE and storage.get(1, 3) == TOMBSTONE
    assert storage.ledger_state(1).truncated == (2, 2)
    storage.close()
    restarted = open_service()
    try:
        assert service_round_trip(restarted, ReadLacRequest(txn=5, ledger_id=1))[5].last_entry_id == 1
        read = service_round_trip(restarted, ReadRequest(txn=6, ledger_id=1, entry_ids=[2, 3]))[6]
        assert not (read.status == Status.OK and read.entries)       # the old term's entries 2 and 3 stay gone
    finally:
        restarted.storage.close()


def test_a_storage_without_put_many_stores_every_entry_of_an_add_whose_first_put_failed_another_ledger(
        tmp_path, monkeypatch):
    """put_many is optional: a bookie then puts entry by entry, and a put that synced by itself and failed
    another ledger's index must not leave the add's later entries unstored while the bookie counts them."""
    from walkit.core.messages import ReadLacRequest, ReadRequest

    class PutOnly:                      # the files storage as a plugin without the optional put_many
        def __init__(self, storage):
            self._storage = storage

        def __getattr__(self, name):
            if name == "put_many":
                raise AttributeError(name)
            return getattr(self._storage, name)

    inner = FileStorage(str(tmp_path / "s"), write_buffer_mb=0.05, checkpoint_s=1e9)     # ~51 KiB
    service = BookieService(PutOnly(inner))
    assert service._put_many is None

    def round_trip(*requests):
        return service_round_trip(service, *requests)

    def add(txn, ledger_id, *ids, data=None):
        return AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY,
                          entries=[make_entry(i, data, lac=i - 1, ledger_id=ledger_id) for i in ids])
    try:
        assert round_trip(add(1, 13, 0))[1].status == Status.OK
        real = fail_index_writes(monkeypatch, 13)
        # 40 KB of ledger 13 is buffered; the first 15 KB put of ledger 1 syncs it first and raises for 13
        replies = round_trip(add(2, 13, 1, data=b"x" * 40_000), add(3, 1, 0, 1, 2, data=b"y" * 15_000))
        assert replies[2].status == replies[3].status == Status.IO_ERROR
        monkeypatch.setattr(index_module.LedgerIndex, "_write_slots", real)
        lac = round_trip(ReadLacRequest(txn=4, ledger_id=1))[4]
        read = round_trip(ReadRequest(txn=5, ledger_id=1, entry_ids=[0, 1, 2]))[5]
        assert inner.last_entry(1) == lac.last_entry_id == 2          # storage matches the bookie's view
        assert [e.entry_id for e in read.entries] == [0, 1, 2]
    finally:
        inner.close()


def _random_groups(seed: int, groups: int = 40):
    """_random_groups yields group commits of random puts, put_manys, states and deletes over 3 ledgers.

    Deletes land in the middle of groups, between puts of the same ledger, and entries are
    written again (tombstones, recovery) inside one group: the cases where applying a group's
    journal records per ledger must keep their order.
    """
    import random
    rng = random.Random(seed)
    next_id = {1: 0, 2: 0, 3: 0}
    for _ in range(groups):
        ops = []
        for _ in range(rng.randint(1, 12)):
            ledger_id = rng.choice((1, 2, 3))
            roll = rng.random()
            if roll < 0.1:
                ops.append(("delete", ledger_id))
                next_id[ledger_id] = 0
            elif roll < 0.2:
                ops.append(("state", ledger_id, LedgerState(fenced=rng.random() < 0.5, master_key=b"k%d" % seed,
                                                            explicit_lac=rng.randint(-1, 50))))
            elif roll < 0.3 and next_id[ledger_id]:
                entry_id = rng.randrange(next_id[ledger_id])         # written again
                ops.append(("put", ledger_id, entry_id, b"again-%d-%d" % (seed, rng.getrandbits(32))))
            else:
                first, count = next_id[ledger_id], rng.randint(1, 30)
                ops.append(("many", ledger_id, [(e, payload(ledger_id, e) + bytes([rng.getrandbits(8)]))
                                                for e in range(first, first + count)]))
                next_id[ledger_id] = first + count
        yield ops


def _write_group(storage, ops) -> None:
    """_write_group applies one group of `_random_groups` to the storage and syncs it."""
    for op in ops:
        if op[0] == "delete":
            storage.delete_ledger(op[1])
        elif op[0] == "state":
            storage.set_ledger_state(op[1], op[2])
        elif op[0] == "put":
            storage.put(op[1], op[2], op[3])
        else:
            storage.put_many(op[1], op[2])
    storage.sync()


def _model_after(groups) -> tuple[dict, dict]:
    entries: dict[int, dict[int, bytes]] = {}
    states: dict[int, LedgerState] = {}
    for ops in groups:
        for op in ops:
            if op[0] == "delete":
                entries.pop(op[1], None)
                states.pop(op[1], None)
            elif op[0] == "state":
                states[op[1]] = op[2]
            elif op[0] == "put":
                entries.setdefault(op[1], {})[op[2]] = op[3]
            else:
                entries.setdefault(op[1], {}).update(op[2])
    return entries, states


def _matches(storage, entries: dict, states: dict) -> None:
    for ledger_id in (1, 2, 3):
        want = entries.get(ledger_id, {})
        for entry_id in range(max(want, default=-1) + 5):
            assert storage.get(ledger_id, entry_id) == want.get(entry_id), (ledger_id, entry_id)
        if ledger_id in states:
            assert storage.ledger_state(ledger_id) == states[ledger_id]


@pytest.mark.parametrize("seed", range(6))
def test_random_groups_with_deletes_read_back_live_and_after_a_crash(tmp_path, seed):
    path = str(tmp_path / "s")
    groups = list(_random_groups(seed))

    def work(report):
        storage = FileStorage(path, checkpoint_s=1e9, entrylog_max_mb=1)
        for done, ops in enumerate(groups, 1):
            _write_group(storage, ops)
            _matches(storage, *_model_after(groups[:done]))          # applied: read from the entry logs
            if done == len(groups) // 2:
                storage.checkpoint()
        report(len(groups))                                           # then exits without close
    reports, how = run_in_child(work)
    assert how == "exit 0" and reports == [len(groups)]
    storage = FileStorage(path)                                       # replays the second half
    try:
        assert storage.replayed_records > 0
        _matches(storage, *_model_after(groups))
    finally:
        storage.close()


@pytest.mark.parametrize("seed", range(4))
def test_random_kills_amid_log_rotations_checkpoints_and_compaction_lose_no_synced_group(tmp_path, seed):
    """SIGKILL at a random moment, three times over one directory, with logs of 50 KB that are the journal.

    Background checkpoints run every 20 KB and compaction every 7 groups, so kills land in
    rotations, checkpoints and compactions alike. After each restart the storage must hold
    exactly what some prefix of the groups wrote, at least every group the child reported synced.
    """
    path = str(tmp_path / "s")
    groups = list(_random_groups(100 + seed, groups=100))
    done = 0
    for cycle in range(3):
        start = done

        def work(report, start=start):
            storage = FileStorage(path, checkpoint_s=1e9, entrylog_max_mb=0.05, journal_max_mb=0.02)
            for n in range(start, len(groups)):
                _write_group(storage, groups[n])
                if n % 7 == 6:
                    storage.compact()
                report(n)
        reports, how = run_in_child(work, kill_after=20 + 3 * cycle + seed)
        assert how == "killed" and reports[:20] == list(range(start, start + 20)), (how, reports)
        storage = FileStorage(path)
        try:
            first = start + len(reports)                     # groups after the reported ones may have synced too
            held = [n for n in range(first, len(groups) + 1) if _holds(storage, groups[:n])]
            assert held, f"after kill {cycle + 1} the storage holds no prefix of {first} or more groups"
            done = held[0]
        finally:
            storage.close()
    assert done >= 60


def _holds(storage, groups) -> bool:
    """_holds tells whether the storage reads back exactly what `groups` wrote."""
    try:
        _matches(storage, *_model_after(groups))
    except AssertionError:
        return False
    return True


def test_every_entry_byte_is_written_to_disk_once(tmp_path, monkeypatch):
    """Issue 20: the entry logs are the journal, so a synced entry is not copied a second time."""
    storage = FileStorage(str(tmp_path / "s"), checkpoint_s=1e9)
    written = [0]
    real_write, real_pwrite = os.write, os.pwrite
    monkeypatch.setattr(os, "write", lambda fd, data: (written.__setitem__(0, written[0] + len(data)),
                                                       real_write(fd, data))[1])
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: (written.__setitem__(0, written[0] + len(data)),
                                                            real_pwrite(fd, data, at))[1])
    entries = 0
    for group in range(40):
        storage.put_many(group % 4, [(e, payload(group % 4, e, 1024)) for e in range(group * 50, group * 50 + 50)])
        storage.sync()
        entries += 50
    monkeypatch.undo()
    record = 1024 + 9 + 16                                   # a PUT record: header, ids, data
    # The records once, plus index slots read-patch-written per group (16 bytes a slot).
    assert entries * record <= written[0] <= entries * (record + 16) * 1.1
    assert not os.path.exists(os.path.join(str(tmp_path / "s"), "journal"))
    storage.close()


def _legacy_data(ledger_id: int, entry_id: int) -> bytes:
    """_legacy_data is what tests/storage/data/files-v1-crashed.tar.gz stores as (ledger, entry)."""
    return (f"ledger {ledger_id} entry {entry_id} ".encode() * 20)[:100 + (ledger_id * 7 + entry_id * 13) % 300]


def _unpack_legacy(tmp_path) -> str:
    """_unpack_legacy unpacks a version 1 storage copied from a running bookie (a crash image).

    It was written before the entry logs became the journal: ledgers 1-4 with 30 entries each,
    states for ledgers 2 and 3, ledger 4 deleted, a checkpoint; then entries 30-49 of ledgers
    1-3, entries 0-9 of ledger 5 and a state for ledger 1, synced to the journal only.
    """
    import tarfile
    with tarfile.open(os.path.join(os.path.dirname(__file__), "data", "files-v1-crashed.tar.gz")) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "bookie")


def _check_legacy(storage) -> None:
    assert storage.ledgers() == [1, 2, 3, 5]
    for ledger_id, last in ((1, 49), (2, 49), (3, 49), (5, 9)):
        assert storage.last_entry(ledger_id) >= last
        assert storage.get_many(ledger_id, list(range(last + 1))) == [_legacy_data(ledger_id, e)
                                                                       for e in range(last + 1)]
    assert storage.get(4, 0) is None
    assert storage.ledger_state(1) == LedgerState(fenced=True, master_key=b"k1")
    assert storage.ledger_state(2) == LedgerState(fenced=True, master_key=b"k2", explicit_lac=7)
    assert storage.ledger_state(3) == LedgerState(master_key=b"k3", term=5)


def test_a_version_1_storage_is_carried_over_with_everything_its_journal_held(tmp_path, caplog):
    path = _unpack_legacy(tmp_path)
    with caplog.at_level(logging.INFO, logger="walkit.storage"):
        storage = FileStorage(path)
    try:
        assert any("carried over from version 1" in r.getMessage() for r in caplog.records)
        assert not os.path.exists(os.path.join(path, "journal"))
        assert checkpoint_format.load(path).version == checkpoint_format.VERSION
        _check_legacy(storage)
        assert storage.last_entry(5) == 9
        active = log_path(os.path.join(path, "logs"), storage._logs.active)
        assert storage._logs.allocated == os.path.getsize(active) > storage._logs.size    # preallocated again
        storage.put(5, 10, b"after the upgrade")
        storage.sync()
    finally:
        storage.close()
    storage = FileStorage(path)
    try:
        _check_legacy(storage)
        assert storage.get(5, 10) == b"after the upgrade" and storage.last_entry(5) == 10
    finally:
        storage.close()


@pytest.mark.parametrize("kill_at", [1, 2])
def test_a_crash_while_carrying_a_version_1_storage_over_loses_nothing(tmp_path, kill_at):
    """A kill after the first journal chunk is copied, or after the version 2 checkpoint is saved."""
    path = _unpack_legacy(tmp_path)

    def work(report):
        from walkit.plugins.storage.files import entrylog
        owner, name = (entrylog.EntryLogs, "commit") if kill_at == 1 else (checkpoint_format, "save")
        original = getattr(owner, name)

        def crash(*args):
            result = original(*args)
            kill_self()
            return result
        setattr(owner, name, crash)
        report(0)
        FileStorage(path)
    reports, how = run_in_child(work)
    assert how == "killed" and reports == [0]
    assert os.listdir(os.path.join(path, "journal"))          # killed before the old journal was deleted
    storage = FileStorage(path)
    try:
        _check_legacy(storage)
        assert not os.path.exists(os.path.join(path, "journal"))
    finally:
        storage.close()


@pytest.mark.parametrize("kill_at", ["first save", "compacting save", "after it"])
def test_a_crash_in_the_carry_over_s_compaction_loses_nothing(tmp_path, kill_at):
    """The carry-over checkpoints as version 2 before it compacts: a later crash recovers from the logs.

    With compact_ratio 0.9 the first log of the image (a quarter of it the deleted ledger 4's)
    is compacted by the checkpoint that ends the carry-over. Carrying over again after a crash
    there would cut the logs back to the version 1 checkpoint, and with them the copies.
    """
    path = _unpack_legacy(tmp_path)

    def work(report):
        original, saves = checkpoint_format.save, [0]

        def save(*args):
            saves[0] += 1
            if (kill_at, saves[0]) in (("first save", 1), ("compacting save", 2)):
                kill_self()
            original(*args)
            if (kill_at, saves[0]) == ("after it", 2):
                kill_self()
        checkpoint_format.save = save
        report(0)
        FileStorage(path, compact_ratio=0.9)
    reports, how = run_in_child(work)
    assert how == "killed" and reports == [0]
    for _ in range(2):
        storage = FileStorage(path, compact_ratio=0.9)
        try:
            _check_legacy(storage)
        finally:
            storage.close()


def test_a_background_checkpoint_saves_the_accounting_of_its_own_position(tmp_path, monkeypatch):
    """New ledgers written while a background checkpoint is held neither fail it nor leak into what it saves."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, journal_max_mb=0.05, checkpoint_s=1e9)
    started, release = _hold_background_fsyncs(monkeypatch)
    _fill_until_a_checkpoint_starts(storage, started)
    for ledger_id in range(100, 400):                         # new ledgers while it is held
        storage.put(ledger_id, 0, payload(ledger_id, 0, 100))
        storage.sync()
    release.set()
    storage.wait_for_checkpoint()                             # raises if it failed
    saved = checkpoint_format.load(path)
    assert saved.ledgers.keys() == {1}
    for log_id, total in saved.log_totals.items():
        assert sum(saved.log_usage.get(log_id, {}).values()) <= total, log_id
    assert saved.log_totals[saved.replay_log] == saved.replay_offset
    storage.close()


def _hold_background_fsyncs(monkeypatch):
    """_hold_background_fsyncs makes background checkpoints wait before their fsyncs; returns (started, release) events."""
    import threading
    from walkit.plugins.storage.files import storage as storage_module
    started, release = threading.Event(), threading.Event()
    original = storage_module.fsync_all

    def held(paths, folders):
        started.set()
        assert release.wait(30)
        original(paths, folders)
    monkeypatch.setattr(storage_module, "fsync_all", held)
    return started, release


def _fill_until_a_checkpoint_starts(storage, started) -> int:
    """_fill_until_a_checkpoint_starts syncs 1 KB entries of ledger 1 until `started` is set; returns the next id."""
    entry_id = 0
    while not started.is_set():
        storage.put(1, entry_id, payload(1, entry_id, 1000))
        entry_id += 1
        storage.sync()
    return entry_id


def _replay_position(path: str) -> tuple[int, int]:
    saved = checkpoint_format.load(path)
    return saved.replay_log, saved.replay_offset


def test_no_checkpoint_starts_after_a_background_one_failed_during_a_sync(tmp_path, monkeypatch):
    """The background fsync fails while a sync writes: that sync must not start the next checkpoint."""
    import threading
    from walkit.plugins.storage.files import entrylog
    from walkit.plugins.storage.files import storage as storage_module
    path = str(tmp_path / "s")
    storage = FileStorage(path, journal_max_mb=0.05, checkpoint_s=1e9)
    started, failed, in_commit = threading.Event(), threading.Event(), threading.Event()
    real_fsync_all, real_commit = storage_module.fsync_all, entrylog.EntryLogs.commit

    def failing(paths, folders):
        started.set()
        assert in_commit.wait(30)
        failed.set()
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(storage_module, "fsync_all", failing)
    entry_id = _fill_until_a_checkpoint_starts(storage, started)
    before = _replay_position(path)

    def commit(self, buffer):
        in_commit.set()
        assert failed.wait(30)
        return real_commit(self, buffer)
    monkeypatch.setattr(entrylog.EntryLogs, "commit", commit)
    monkeypatch.setattr(storage_module, "fsync_all", real_fsync_all)
    storage._last_checkpoint -= 1e10                          # the next checkpoint is due
    storage.put(1, entry_id, b"during the failure")
    with pytest.raises(StorageError, match="Input/output error"):
        storage.sync()
    storage._join_checkpoint()
    assert _replay_position(path) == before
    storage._release()


def test_a_background_checkpoint_saves_nothing_after_a_sync_failed_meanwhile(tmp_path, monkeypatch):
    from walkit.plugins.storage.files import entrylog
    path = str(tmp_path / "s")
    storage = FileStorage(path, journal_max_mb=0.05, checkpoint_s=1e9)
    started, release = _hold_background_fsyncs(monkeypatch)
    entry_id = _fill_until_a_checkpoint_starts(storage, started)
    before = _replay_position(path)

    def failing_commit(self, buffer):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(entrylog.EntryLogs, "commit", failing_commit)
    storage.put(1, entry_id, b"no room")
    with pytest.raises(StorageError, match="No space left"):
        storage.sync()
    release.set()
    storage._join_checkpoint()
    assert _replay_position(path) == before
    storage._release()
    monkeypatch.undo()
    storage = FileStorage(path)                               # every synced entry is in the journal
    try:
        assert storage.last_entry(1) == entry_id - 1
        assert all(storage.get(1, e) == payload(1, e, 1000) for e in range(entry_id))
    finally:
        storage.close()


def test_a_damaged_record_with_synced_groups_after_it_is_refused(tmp_path):
    """A flipped bit in a log's first record is not a torn tail: dropping the groups after it would lose them."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, write_buffer_mb=0.001, checkpoint_s=1e9)
    for entry_id in range(20):
        storage.put(1, entry_id, payload(1, entry_id, 1000))
        storage.sync()
    log = journal_of(path)
    storage._release()                                        # a crash: no closing checkpoint
    with open(log, "r+b") as f:
        f.seek(100)                                           # inside the first entry's data
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(StorageError, match="the record after it verifies"):
        FileStorage(path, write_buffer_mb=0.001)


@pytest.mark.parametrize("last", ["random", "zeros"])
def test_damage_with_more_synced_records_after_it_than_a_group_is_refused_even_when_they_end_in_zeros(tmp_path,
                                                                                                         last):
    """An entry of zeros is data, not preallocated space: the records after the damage are followed, not guessed."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, write_buffer_mb=1, checkpoint_s=1e9)
    for entry_id in range(20):
        storage.put(1, entry_id, payload(1, entry_id, 64 * 1024))
        storage.sync()
    storage.put(1, 20, os.urandom(3 << 19) if last == "random" else bytes(3 << 19))    # 1.5 MiB, synced
    storage.sync()
    log = journal_of(path)
    storage._release()                                        # a crash: no closing checkpoint
    with open(log, "r+b") as f:
        f.seek(100)                                           # inside the first entry's data, synced long ago
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(StorageError, match="the record after it verifies"):
        FileStorage(path, write_buffer_mb=1)                  # 2.75 MiB of records follow: more than 2 x 1 MiB


def test_a_put_of_an_id_or_size_no_record_can_hold_is_refused_before_anything_is_synced(tmp_path):
    storage = FileStorage(str(tmp_path / "s"), write_buffer_mb=10 / 1024)
    try:
        storage.put(13, 0, b"a" * 6000)
        with pytest.raises(ValueError, match="out of range"):
            storage.put(1 << 63, 0, b"x" * 6000)
        with pytest.raises(ValueError, match="out of range"):
            storage.put_many(1 << 63, [(0, b"x" * 6000)])
        assert storage.fsyncs == 0                            # refused before the early sync, not after it
        storage.sync()
        assert storage.get(13, 0) == b"a" * 6000
    finally:
        storage.close()


def test_a_log_that_cannot_be_started_fails_the_storage_and_closes_cleanly(tmp_path, monkeypatch, caplog):
    from walkit.plugins.storage.files import entrylog
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.01, checkpoint_s=1e9)
    real_open = os.open

    def no_more_files(name, *args, **kwargs):
        if name.endswith(".log"):
            raise OSError(24, "Too many open files")
        return real_open(name, *args, **kwargs)
    monkeypatch.setattr(entrylog.os, "open", no_more_files)
    with pytest.raises(StorageError, match="Too many open files"):
        for entry_id in range(100):
            storage.put(1, entry_id, payload(1, entry_id, 1000))
            storage.sync()
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="walkit.storage"):
        storage.close()
    assert not [r for r in caplog.records if "closing failed" in r.getMessage()]
    storage = FileStorage(path)
    try:
        assert all(storage.get(1, e) == payload(1, e, 1000) for e in range(storage.last_entry(1) + 1))
    finally:
        storage.close()


def test_a_checkpoint_from_a_newer_version_is_named_so(tmp_path):
    path = str(tmp_path / "s")
    FileStorage(path).close()
    checkpoint = os.path.join(path, "checkpoint")
    with open(checkpoint, "rb") as f:
        raw = f.read()
    with open(checkpoint, "wb") as f:
        f.write(raw.replace(b"walkit-files-checkpoint 3 ", b"walkit-files-checkpoint 4 ", 1))
    with pytest.raises(StorageError, match="version 4, written by a newer walkit"):
        FileStorage(path)


def test_checkpoints_of_thousands_of_ledgers_stay_within_a_low_open_files_limit(tmp_path):
    """Index files are fsynced one descriptor at a time: 3,000 dirty ledgers under a limit of 200 open files."""
    path = str(tmp_path / "s")

    def work(report):
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
        storage = FileStorage(path, open_files=64, journal_max_mb=0.5, checkpoint_s=1e9)
        for ledger_id in range(3000):
            storage.put(ledger_id, 0, payload(ledger_id, 0, 200))
            if ledger_id % 100 == 99:
                storage.sync()                               # background checkpoints every 0.5 MB
        storage.wait_for_checkpoint()
        report(storage.checkpoints)
        storage.checkpoint()
        storage.close()
        report(0)
    reports, how = run_in_child(work)
    assert how == "exit 0" and reports[0] >= 2 and reports[1:] == [0]
    storage = FileStorage(path)
    try:
        assert storage.get_many(2999, [0]) == [payload(2999, 0, 200)] and len(storage.ledgers()) == 3000
    finally:
        storage.close()


PAGE = 4096


def _record_spans(log: str) -> list[tuple[int, int, bytes]]:
    """(offset, record size, payload) of each good record of `log`, in order."""
    out, reader = [], journal_format.RecordFile(log)
    for view, at in reader.chunks():
        for pos, _, length in journal_format.records(view):
            head = journal_format.HEADER.size
            out.append((at + pos, head + length, bytes(view[pos + head:pos + head + length])))
    return out


def test_a_power_cut_tearing_a_truncating_adds_tombstone_group_lets_the_bookie_start(tmp_path, caplog):
    """A truncating add writes one tombstone per dropped entry (up to MAX_TRUNCATE_SPAN, 4M of them) as
    ONE put_many batch: one group, made on the bookie, not bounded by max_frame_bytes. Here the frames
    obey the docs' advice (write_buffer_mb >= max_frame_bytes / 2) and the group is still > 2 x
    write_buffer_mb. A power cut that leaves one page of it unwritten (zeros) while later pages reached
    the disk is an ordinary crash of a never-acknowledged group: it must be cut, not refused (the bookie
    would not start). A scan for records past a damaged length field (tried, reverted) refused it."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, write_buffer_mb=0.25, checkpoint_s=1e9)           # torn_max = 512 KiB
    service = BookieService(storage, max_frame=64 * 1024)                           # <= 2 x write_buffer

    def add(txn, *ids, term, truncate=False):
        return AddRequest(txn=txn, ledger_id=1, master_key=MASTER_KEY, term=term, truncate=truncate,
                          recovery=truncate, entries=[make_entry(i, b"d", lac=i - 1, ledger_id=1) for i in ids])
    assert service_round_trip(service, add(1, 0, term=1))[1].status == Status.OK
    assert service_round_trip(service, add(2, 30_000, term=1))[2].status == Status.OK
    log = journal_of(path)
    before = {offset for offset, _, _ in _record_spans(log)}
    assert service_round_trip(service, add(3, 0, term=2, truncate=True))[3].status == Status.OK
    storage._release()                                                              # a crash
    tombstones = [(o, n) for o, n, p in _record_spans(log) if o not in before and p.endswith(TOMBSTONE)]
    group_start, group_end = tombstones[0][0], tombstones[-1][0] + tombstones[-1][1]
    assert len(tombstones) == 30_000 and group_end - group_start > 2 * (256 << 10)  # ~1 MB > torn_max
    # The power cut: this group's 2nd page and everything after the group never reached the disk.
    hole = (group_start // PAGE + 1) * PAGE
    with open(log, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(hole)
        f.write(bytes(PAGE))
        f.seek(group_end)
        f.write(bytes(size - group_end))
    with caplog.at_level(logging.WARNING):
        reopened = FileStorage(path, write_buffer_mb=0.25, checkpoint_s=1e9)
    try:
        assert "truncating the journal there" in caplog.text
    finally:
        reopened.close()
