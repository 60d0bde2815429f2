"""The sqlite:// backend: the EntryStorage conformance suite plus its own checks."""

from __future__ import annotations

import os

import pytest

from walkit.errors import ConfigError
from walkit.plugins import open_storage
from walkit.plugins.storage.sqlite import SqliteStorage
from walkit.testing.storage import EntryStorageConformance, payload


class TestSqliteConformance(EntryStorageConformance):
    @pytest.fixture
    def storage_factory(self):
        """storage_factory opens ``sqlite://<path>/bookie.db`` through the plugin registry."""
        return lambda path: open_storage(f"sqlite://{path}/bookie.db")


def test_one_commit_per_sync(tmp_path):
    storage = SqliteStorage(str(tmp_path / "b.db"))
    for group in range(5):
        for entry_id in range(10):
            storage.put(1, group * 10 + entry_id, b"x")
        storage.sync()
        storage.sync()                           # nothing new: no commit
    assert storage.fsyncs == 5
    mode = storage._db.execute("PRAGMA journal_mode").fetchone()[0]
    synchronous = storage._db.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, synchronous) == ("wal", 2)     # 2 = FULL
    storage.close()


def test_compact_gives_space_back(tmp_path):
    path = str(tmp_path / "b.db")
    storage = SqliteStorage(path)
    for ledger_id in range(1, 5):
        for entry_id in range(300):
            storage.put(ledger_id, entry_id, payload(ledger_id, entry_id, 4096))
        storage.sync()
    storage.compact()
    before = os.path.getsize(path)
    for ledger_id in range(1, 4):
        storage.delete_ledger(ledger_id)
    freed = storage.compact()
    assert freed > 0 and os.path.getsize(path) < before / 2
    assert storage.get(4, 299) == payload(4, 299, 4096)
    storage.close()


@pytest.mark.parametrize("query", ["cache_mb=abc", "cache_mb=-1", "timeout=0", "bogus=1"])
def test_bad_options_are_config_errors(tmp_path, query):
    with pytest.raises(ConfigError):
        open_storage(f"sqlite://{tmp_path}/b.db?{query}")
