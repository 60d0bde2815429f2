"""walkit.bookie.identity: every row of the start-up decision table, over a real SQLite store and storage."""

from __future__ import annotations

import pytest

from walkit.bookie.identity import (
    DiskIdentity, IdentityError, bookie_id, check_identity, cluster_id, cookie_key, read_cookie, write_cookie,
)
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import ConfigError
from walkit.plugins import open_metadata
from walkit.plugins.storage.memory import MemoryStorage
from walkit.plugins.storage.sqlite import SqliteStorage

ADDRESS = "127.0.0.1:3181"


@pytest.fixture
def store(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/meta.db")
    yield store
    store.close()


@pytest.fixture
def other_store(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/other.db")
    yield store
    store.close()


@pytest.fixture
def storage_at(tmp_path):
    opened = []

    def storage_at(name: str = "bookie.db") -> SqliteStorage:
        storage = SqliteStorage(str(tmp_path / name))
        opened.append(storage)
        return storage
    yield storage_at
    for storage in opened:
        storage.close()


def check(storage, store, address: str = ADDRESS) -> DiskIdentity:
    return check_identity(storage, store, address, "sqlite:///bookie.db", "sqlite:///meta.db")


def test_a_new_bookie_on_an_empty_store_formats_its_disk_and_founds_the_cluster(store, storage_at):
    storage = storage_at()
    identity = check(storage, store)
    assert identity.cluster == cluster_id(store) and identity.address == ADDRESS and identity.disk
    assert DiskIdentity.from_bytes(storage.identity(), "test") == identity == read_cookie(store, ADDRESS)


def test_the_same_disk_starts_again_and_keeps_its_identity(store, storage_at):
    first = check(storage_at(), store)
    assert check(storage_at(), store) == first


def test_an_emptied_disk_is_refused_while_the_cluster_knows_the_address(store, storage_at):
    first = check(storage_at(), store)
    with pytest.raises(IdentityError, match=f"format-and-rejoin {ADDRESS}") as refused:
        check(storage_at("new-disk.db"), store)
    assert f"{first.disk:x}" in str(refused.value) and "is empty" in str(refused.value)
    assert read_cookie(store, ADDRESS) == first                   # nothing changed in the cluster


def test_after_the_cookie_is_removed_an_empty_disk_starts_as_a_new_disk(store, storage_at):
    first = check(storage_at(), store)
    store.delete(cookie_key(ADDRESS))
    second = check(storage_at("new-disk.db"), store)
    assert second.disk != first.disk and second.cluster == first.cluster
    assert read_cookie(store, ADDRESS) == second


def test_a_disk_of_another_cluster_or_an_empty_store_is_refused(store, other_store, storage_at):
    check(storage_at(), store)
    check(storage_at("elsewhere.db"), other_store)
    with pytest.raises(IdentityError, match="is cluster"):
        check(storage_at(), other_store)
    fresh = open_metadata(f"sqlite://{storage_at('x.db').path}.meta")
    try:
        with pytest.raises(IdentityError, match="holds no cluster at all"):
            check(storage_at(), fresh)
        assert cluster_id(fresh) is None                          # refusing wrote nothing there
    finally:
        fresh.close()


def test_two_disks_for_one_address_are_refused(store, storage_at):
    check(storage_at(), store)
    write_cookie(store, DiskIdentity(42, cluster_id(store), ADDRESS))
    with pytest.raises(IdentityError, match="two disks claim this address"):
        check(storage_at(), store)


def test_a_disk_formatted_for_another_bookie_id_is_refused(store, storage_at):
    check(storage_at(), store)
    with pytest.raises(IdentityError, match=f"formatted for bookie id {ADDRESS}, not 127.0.0.1:3999: start it "
                                            f"with --bookie-id {ADDRESS}"):
        check(storage_at(), store, "127.0.0.1:3999")


def test_a_bookie_keeps_the_id_its_storage_was_formatted_with_unless_one_is_configured(store, storage_at):
    assert bookie_id(storage_at(), "", "10.0.0.5:3181") == "10.0.0.5:3181"       # a new storage: its address
    check(storage_at(), store)
    assert bookie_id(storage_at(), "", "10.0.0.9:3181") == ADDRESS               # formatted: the id it has
    assert bookie_id(storage_at(), "bookie-7", "10.0.0.9:3181") == "bookie-7"    # configured: checked later


def test_a_missing_cookie_is_written_again_from_the_disk(store, storage_at):
    first = check(storage_at(), store)
    store.delete(cookie_key(ADDRESS))
    assert check(storage_at(), store) == first and read_cookie(store, ADDRESS) == first


def legacy_storage(storage_at, ledger_id: int) -> SqliteStorage:
    storage = storage_at("legacy.db")
    storage.put(ledger_id, 0, b"from before identities")
    storage.sync()
    return storage


def test_data_from_before_identities_is_adopted_when_the_store_knows_its_ledgers(store, storage_at):
    store.create(ledger_key(7), LedgerMetadata(ledger_id=7, ensemble_size=1, write_quorum=1, ack_quorum=1,
                                               ensembles={0: (ADDRESS,)}).to_bytes())
    storage = legacy_storage(storage_at, 7)
    identity = check(storage, store)
    assert read_cookie(store, ADDRESS) == identity and storage.get(7, 0) == b"from before identities"


def test_data_from_before_identities_is_refused_by_a_store_that_knows_none_of_it(store, storage_at):
    storage = legacy_storage(storage_at, 7)
    with pytest.raises(IdentityError, match="none of the ledgers"):
        check(storage, store)
    assert storage.identity() is None and cluster_id(store) is None and storage.get(7, 0) is not None


def test_data_from_before_identities_is_refused_by_another_clusters_store_with_the_same_ledger_ids(
        store, storage_at):
    """Ledger ids are small counters: another cluster's store holds a ledger 7 too, which does not
    name this bookie. Adopting it there would let garbage collection act on foreign metadata."""
    store.create(ledger_key(7), LedgerMetadata(ledger_id=7, ensemble_size=1, write_quorum=1, ack_quorum=1,
                                               ensembles={0: ("10.9.9.9:3181",)}).to_bytes())
    storage = legacy_storage(storage_at, 7)
    with pytest.raises(IdentityError, match="none of the ledgers"):
        check(storage, store)
    assert storage.identity() is None and cluster_id(store) is None


def test_two_new_disks_starting_on_one_address_at_once_cannot_both_pass(store, storage_at):
    """The cookie is created, not overwritten: the second start finds the first one's cookie and refuses."""
    from walkit.bookie import identity as module
    first, second = storage_at("a.db"), storage_at("b.db")
    check(first, store)
    real, calls = module.read_cookie, []

    def stale_once(*args):                           # the second read "no cookie" before the first wrote it
        calls.append(args)
        return None if len(calls) == 1 else real(*args)
    module.read_cookie = stale_once
    try:
        with pytest.raises(IdentityError, match="two disks claim this address"):
            check(second, store)
    finally:
        module.read_cookie = real
    assert len(calls) == 2                           # it found the cookie on its second look
    assert read_cookie(store, ADDRESS) == DiskIdentity.from_bytes(first.identity(), "test")


def test_a_storage_plugin_without_identities_and_a_foreign_cluster_key_are_clear_errors(store, storage_at):
    class OldPlugin:
        durable = True

        def ledgers(self):
            return []
    with pytest.raises(ConfigError, match="keeps no disk identity"):
        check(OldPlugin(), store)
    store.create("cluster", b"not walkit's")
    with pytest.raises(IdentityError, match="not a walkit cluster id"):
        check(storage_at(), store)


def test_a_memory_storage_is_a_new_disk_at_every_start(store):
    first = check(MemoryStorage(), store)
    second = check(MemoryStorage(), store)
    assert first.disk != second.disk and read_cookie(store, ADDRESS) == second


def test_an_unreadable_identity_is_refused(store, storage_at):
    storage = storage_at()
    storage.set_identity(b"not json")
    with pytest.raises(IdentityError, match="unreadable"):
        check(storage, store)
    assert cluster_id(store) is None                              # nothing was founded on it
