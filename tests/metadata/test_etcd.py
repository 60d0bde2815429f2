"""The etcd:// metadata backend: the MetadataStore conformance suite on a real etcd, and its own checks."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from walkit.errors import ConfigError, MetadataError, NoSuchKey
from walkit.local import free_port
from walkit.plugins import open_metadata
from walkit.plugins.metadata.etcd import EtcdMetadataStore
from walkit.testing.metadata import MetadataStoreConformance


class TestEtcdConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, etcd_factory):
        """metadata_store_factory opens stores on a fresh root of a real etcd server."""
        return etcd_factory


def test_open_metadata_loads_the_etcd_plugin_through_the_v3_gateway(etcd_server, etcd_factory):
    store = etcd_factory()
    assert isinstance(store, EtcdMetadataStore)
    assert (store.lease_ttl, store.timeout) == (1, 5.0)
    with urllib.request.urlopen(f"http://{etcd_server.address}/version") as answer:
        assert json.load(answer)["etcdserver"].startswith("3.4.")
    assert store._client.api_path == "/v3/"


@pytest.mark.parametrize("uri", [
    "etcd://127.0.0.1:2379", "etcd:///walkit", "etcd://127.0.0.1:2379,127.0.0.1:2380/w",
    "etcd://127.0.0.1:2379/w?bogus=1", "etcd://127.0.0.1:2379/w?lease_ttl=-1", "etcd://127.0.0.1:2379/w?timeout=x",
])
def test_bad_uris_are_config_errors(uri):
    with pytest.raises(ConfigError):
        open_metadata(uri)


def test_an_unreachable_server_fails_within_the_timeout():
    started = time.monotonic()
    with pytest.raises(MetadataError, match="unreachable"):
        open_metadata(f"etcd://127.0.0.1:{free_port()}/w?timeout=1")
    assert time.monotonic() - started < 3


def test_lease_ttl_is_rounded_up_to_whole_seconds(etcd_server):
    store = open_metadata(etcd_server.url("/w", lease_ttl=0.2))
    try:
        assert store.lease_ttl == 1
    finally:
        store.close()


def test_versions_are_mod_revisions(etcd_factory):
    store = etcd_factory()
    first = store.create("a", b"")
    second = store.create("b", b"")
    assert second > first
    assert store.put("a", b"x", first) > second
    with pytest.raises(NoSuchKey):
        store.put("never-created", b"x", 0)                  # mod_revision 0 is no match for a missing key
