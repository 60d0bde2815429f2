"""The files:// backend's delete_entries (issue 39): entry logs reclaimed after a trim, replay, crashes.

The conformance suite (walkit.testing.storage) checks what every backend must do; these check
how this one gives the space back: TRIM journal records, per-log accounting by highest entry
id, index slots punched out, and checkpoints of version 3 (version 2 is still read).
"""

from __future__ import annotations

import json
import os

import pytest
from crc32c import crc32c

from walkit.plugins.storage.files import FileStorage
from walkit.plugins.storage.files import checkpoint as checkpoint_format
from walkit.plugins.storage.files import index as index_module
from walkit.plugins.storage.files.index import index_path
from walkit.testing.crash import kill_self, run_in_child
from walkit.testing.storage import payload

SIZE = 1024


def folder_bytes(path: str) -> int:
    """folder_bytes is the disk space the files under `path` take (allocated blocks: holes are free)."""
    return sum(os.stat(os.path.join(root, name)).st_blocks * 512
               for root, _, names in os.walk(path) for name in names)


def log_count(path: str) -> int:
    return len(os.listdir(os.path.join(path, "logs")))


def fill(storage, entries: int, ledgers=(1, 2)) -> None:
    """fill writes `entries` entries of SIZE bytes to ledger 1 and one small entry per 20 to the others."""
    for entry_id in range(entries):
        storage.put(1, entry_id, payload(1, entry_id, SIZE))
        if entry_id % 20 == 0:
            for ledger_id in ledgers[1:]:
                storage.put(ledger_id, entry_id // 20, payload(ledger_id, entry_id // 20))
        if entry_id % 50 == 49:
            storage.sync()
    storage.sync()


def check(storage, first: int, entries: int, others: bool = True) -> None:
    """check reads ledger 1 (nothing below `first`, everything from it) and ledger 2 whole."""
    assert storage.get(1, first - 1) is None and storage.get(1, 0) is None
    assert storage.get_many(1, list(range(first, entries))) == [payload(1, e, SIZE) for e in range(first, entries)]
    assert not others or all(storage.get(2, e) == payload(2, e) for e in range(entries // 20))


def test_a_trim_lets_compaction_reclaim_the_entry_logs_and_the_directory_shrinks(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9)
    fill(storage, 3000)                                     # ~3 MB of ledger 1 in a dozen logs
    storage.checkpoint()
    before, logs = folder_bytes(path), log_count(path)
    storage.delete_entries(1, 2700)
    freed = storage.compact()                               # the bookie's GC calls it: it syncs the TRIM first
    after = folder_bytes(path)
    assert freed > 2 * 1024 * 1024 and after < 0.35 * before, (before, after, freed)
    assert log_count(path) <= logs // 3
    check(storage, 2700, 3000)
    storage.close()
    storage = FileStorage(path)
    try:
        check(storage, 2700, 3000)
        assert storage.last_entry(1) == 2999
    finally:
        storage.close()


def test_the_trimmed_index_slots_are_punched_out_of_the_index_file(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, checkpoint_s=1e9)
    for entry_id in range(100_000):
        storage.put(7, entry_id, b"x")
        if entry_id % 10_000 == 9_999:
            storage.sync()
    storage.checkpoint()
    index = index_path(os.path.join(path, "index"), 7)
    blocks = os.stat(index).st_blocks
    storage.delete_entries(7, 90_000)
    storage.sync()
    assert os.stat(index).st_blocks < blocks / 5 and os.path.getsize(index) == 100_000 * 16
    assert storage.get(7, 90_000) == b"x" and storage.get(7, 89_999) is None
    storage.close()


def test_a_log_holding_entries_on_both_sides_of_the_trim_stays_until_a_later_trim_passes_them(tmp_path):
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9)
    fill(storage, 1000, ledgers=(1,))
    storage.checkpoint()
    tops = {log_id: tops[1] for log_id, tops in storage._logs.tops.items() if 1 in tops}
    straddling = min(log_id for log_id, top in tops.items() if top >= 500)
    storage.delete_entries(1, 500)
    storage.compact()
    assert straddling in storage._logs.totals and min(storage._logs.totals) == straddling
    storage.delete_entries(1, tops[straddling] + 1)
    storage.compact()
    assert straddling not in storage._logs.totals
    check(storage, tops[straddling] + 1, 1000, others=False)
    storage.close()


def test_puts_and_a_trim_in_one_group_leave_nothing_below_it_live(tmp_path):
    """Entries put before a trim in the same group are dropped with it: neither indexed nor counted."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, checkpoint_s=1e9)
    for entry_id in range(40):
        storage.put(1, entry_id, payload(1, entry_id, SIZE))
    storage.delete_entries(1, 30)
    storage.sync()
    assert storage._logs.usage[storage._logs.active][1] == 10 * (9 + 16 + SIZE)
    storage.close()
    storage = FileStorage(path)
    try:
        assert storage.get(1, 29) is None and storage.get(1, 30) == payload(1, 30, SIZE)
    finally:
        storage.close()


@pytest.mark.parametrize("crash_point", ["synced", "copied", "saved"])
def test_a_crash_around_a_trim_and_its_compaction_loses_nothing_and_brings_nothing_back(tmp_path, crash_point):
    path = str(tmp_path / "s")

    def work(report):
        storage = FileStorage(path, entrylog_max_mb=0.1, checkpoint_s=1e9, compact_ratio=0.9)
        fill(storage, 800)
        storage.checkpoint()
        storage.delete_entries(1, 650)
        if crash_point == "synced":
            storage.sync()
            report(0)
            kill_self()
        owner, name = {"copied": (storage._index, "fsync"), "saved": (checkpoint_format, "save")}[crash_point]
        original = getattr(owner, name)

        def crash(*args):
            if crash_point == "saved":
                original(*args)
            kill_self()
        setattr(owner, name, crash)
        report(0)
        storage.compact()
    reports, how = run_in_child(work)
    assert how == "killed" and reports == [0]
    for _ in range(2):
        storage = FileStorage(path)
        try:
            check(storage, 650, 800)
            storage.put(1, 10, b"below the trim")
            storage.compact()
            assert storage.get(1, 10) is None
            check(storage, 650, 800)
        finally:
            storage.close()


def test_replay_applies_a_trim_where_index_slots_cannot_be_punched(tmp_path, monkeypatch):
    """On a file system without hole punching the slots stay: the replayed first entry hides them."""
    monkeypatch.setattr(index_module, "punch_hole", lambda *args: False)
    path = str(tmp_path / "s")

    def work(report):
        storage = FileStorage(path, checkpoint_s=1e9)
        fill(storage, 200)
        storage.checkpoint()
        storage.delete_entries(1, 120)
        storage.sync()
        report(0)
        kill_self()
    reports, how = run_in_child(work)
    assert how == "killed" and reports == [0]
    storage = FileStorage(path)
    try:
        assert storage._index.lookup(1, 5) is not None           # the slot is still there
        check(storage, 120, 200)
        assert storage.get_many(1, [5, 119, 120]) == [None, None, payload(1, 120, SIZE)]
    finally:
        storage.close()


def test_a_version_2_checkpoint_is_read_and_its_logs_are_never_found_dead_by_a_trim(tmp_path):
    """A storage written before version 3 has no highest entry ids per log: a trim keeps those logs."""
    path = str(tmp_path / "s")
    storage = FileStorage(path, entrylog_max_mb=0.25, checkpoint_s=1e9)
    fill(storage, 1000)
    storage.close()
    checkpoint = os.path.join(path, "checkpoint")
    with open(checkpoint, "rb") as f:
        header, _, body = f.read().partition(b"\n")
    doc = json.loads(body)
    doc["logs"] = {log_id: fields[:2] for log_id, fields in doc["logs"].items()}
    doc["ledgers"] = {ledger_id: fields[:7] for ledger_id, fields in doc["ledgers"].items()}
    body = json.dumps(doc, separators=(",", ":")).encode()
    with open(checkpoint, "wb") as f:
        f.write(f"walkit-files-checkpoint 2 {crc32c(body):08x}\n".encode() + body)
    storage = FileStorage(path, entrylog_max_mb=0.25)
    try:
        logs = log_count(path)
        storage.delete_entries(1, 900)
        storage.compact()
        assert log_count(path) == logs
        check(storage, 900, 1000)
        assert checkpoint_format.load(path).version == 3
    finally:
        storage.close()
