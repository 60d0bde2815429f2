"""A running cluster on ZooKeeper and etcd: how bookies register, and metadata servers restarting.

Bookie registrations are ephemeral znodes in ZooKeeper and leased keys in etcd: a stopped bookie
disappears at once, a killed one once its session (lease) expires, and new ledgers never pick
it afterwards. A metadata server restarted under a running cluster: appends go on, an operation
that needs metadata while it is down fails with a clear error in bounded time, and once it is
back the cluster carries on.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import pytest

import walkit
from walkit.errors import MetadataError
from walkit.local import LocalCluster
from walkit.testing.servers import EtcdServer, ZooKeeperServer

from ..conftest import ETCD_LEASE_S, ZK_SESSION_S, fresh_root
from .helpers import wait_until

pytestmark = pytest.mark.slow


def registration_owner(url: str, address: str):
    """registration_owner returns the session (ZooKeeper) or lease (etcd) that holds a bookie's key."""
    parts = urlsplit(url)
    root = parts.path
    if parts.scheme == "zk":
        from kazoo.client import KazooClient
        client = KazooClient(hosts=parts.netloc)
        client.start(timeout=10)
        try:
            _, stat = client.get(f"{root}/bookies/{address}")
            return stat.ephemeralOwner
        finally:
            client.stop()
            client.close()
    from etcd3gw.client import Etcd3Client
    host, port = parts.netloc.split(":")
    client = Etcd3Client(host=host, port=int(port), api_path="/v3/")
    (_, meta), = client.get(f"{root}/bookies/{address}", metadata=True)
    return int(meta.get("lease", 0))


@pytest.fixture(params=["zk", "etcd"])
def coordinated_cluster(request, tmp_path):
    """coordinated_cluster is 4 bookies on a shared ZooKeeper or etcd server, with short sessions."""
    if request.param == "zk":
        url = request.getfixturevalue("zk_server").url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=10)
        expiry = ZK_SESSION_S
    else:
        url = request.getfixturevalue("etcd_server").url(fresh_root(), lease_ttl=ETCD_LEASE_S, timeout=10)
        expiry = ETCD_LEASE_S
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), metadata=url) as cluster:
        yield cluster, expiry


def test_registrations_are_ephemeral_and_expire_with_the_session(coordinated_cluster):
    cluster, expiry = coordinated_cluster
    url = cluster.metadata_url
    owners = {address: registration_owner(url, address) for address in cluster.addresses}
    assert all(owner != 0 for owner in owners.values()), owners          # ephemeral znodes / leased keys
    with walkit.Client(url) as client:
        stopped, killed = cluster.addresses[0], cluster.addresses[1]
        cluster.stop_bookie(0)
        assert stopped not in client.bookies()                             # a clean stop deregisters at once
        cluster.kill_bookie(1)
        killed_at = time.monotonic()
        assert killed in client.bookies()                                  # a kill leaves it until expiry
        wait_until(lambda: killed not in client.bookies(), timeout=expiry + 10)
        assert time.monotonic() - killed_at >= expiry * 0.5
        for _ in range(20):
            ledger = client.create_ledger(2, 2, 2)
            assert not {stopped, killed} & set(ledger.metadata.current_ensemble)
            ledger.close()


@pytest.mark.parametrize("kind", ["zk", "etcd"])
def test_metadata_server_restart_under_a_running_cluster(tmp_path, kind):
    server = ZooKeeperServer(data_dir=str(tmp_path / "zk")) if kind == "zk" else EtcdServer(data_dir=str(tmp_path / "etcd"))
    with server:
        options = {"session_timeout": 10} if kind == "zk" else {"lease_ttl": 10}
        url = server.url("/walkit", timeout=3, **options)
        with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), metadata=url) as cluster, \
                walkit.Client(url) as client:
            writer = client.create_ledger(3, 2, 2)
            for i in range(100):
                writer.append(f"before-{i}".encode())
            server.stop()
            appended = [writer.append(f"during-{i}".encode(), timeout=10) for i in range(100)]   # no metadata needed
            assert appended == list(range(100, 200))
            started = time.monotonic()
            with pytest.raises(MetadataError):
                client.create_ledger(3, 2, 2)                               # needs the metadata store: clear error
            assert time.monotonic() - started < 3 + 5                       # bounded by the store timeout, no hang
            server.start()
            wait_until(lambda: len(client.bookies()) == 3, timeout=30)      # bookies still (or again) registered
            writer.append(b"after")
            writer.close()
            other = client.create_ledger(3, 2, 2)                           # the cluster carries on
            other.append(b"new ledger")
            other.close()
            reader = client.open_ledger(writer.ledger_id)
            assert len(list(reader.read())) == 201
