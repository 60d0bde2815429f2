"""The zk:// metadata backend: the MetadataStore conformance suite on a real ZooKeeper, and its own checks."""

from __future__ import annotations

import time

import pytest

from walkit.errors import ConfigError, MetadataError
from walkit.local import free_port
from walkit.plugins import open_metadata
from walkit.plugins.metadata.zookeeper import ZooKeeperMetadataStore
from walkit.testing.metadata import MetadataStoreConformance


class TestZooKeeperConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, zk_factory):
        """metadata_store_factory opens stores on a fresh root of a real ZooKeeper server."""
        return zk_factory


def test_open_metadata_loads_the_zk_plugin_with_the_uri_options(zk_factory):
    store = zk_factory()
    assert isinstance(store, ZooKeeperMetadataStore)
    assert (store.session_timeout, store.timeout) == (1.5, 5.0)
    assert store.root.startswith("/t-")


@pytest.mark.parametrize("uri", [
    "zk://127.0.0.1:2181", "zk://127.0.0.1:2181/", "zk:///walkit", "zk://localhost/walkit",
    "zk://127.0.0.1:2181/w?bogus=1", "zk://127.0.0.1:2181/w?timeout=abc", "zk://127.0.0.1:2181/w?session_timeout=0",
])
def test_bad_uris_are_config_errors(uri):
    with pytest.raises(ConfigError):
        open_metadata(uri)


def test_an_unreachable_server_fails_within_the_timeout():
    started = time.monotonic()
    with pytest.raises(MetadataError, match="cannot connect to ZooKeeper"):
        open_metadata(f"zk://127.0.0.1:{free_port()}/w?timeout=1")
    assert time.monotonic() - started < 3


def test_versions_are_znode_versions(zk_factory):
    store = zk_factory()
    assert store.create("a", b"") == 0
    assert store.put("a", b"x", 0) == 1
    assert store.next_id("ids") == 0
    assert store.get(".counters/ids")[0] == b"1"          # the counter znode holds the next value


def test_intermediate_paths_are_empty_znodes(zk_factory):
    """In ZooKeeper a key's parents exist (empty), and a key with keys under it cannot be deleted."""
    store = zk_factory()
    store.create("a/b/c", b"deep")
    assert store.get("a/b") == (b"", 0)
    with pytest.raises(MetadataError, match="holds keys under it"):
        store.delete("a/b")
    store.delete("a/b/c")
    store.delete("a/b")
