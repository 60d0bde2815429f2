"""Fixtures for the metadata backends: real ZooKeeper and etcd servers, and a store factory per backend.

The servers are the Debian binaries, started once per test session on 127.0.0.1 (see
walkit.testing.servers); each test gets a fresh root in them. A missing binary fails the test
with a message that says to run scripts/test.sh, which installs them; nothing is skipped.
"""

from __future__ import annotations

import uuid

import pytest

from walkit.testing.metadata import StoreFactory
from walkit.testing.servers import EtcdServer, ZooKeeperServer, etcd_missing, zookeeper_missing

#: Short sessions, so that the registrations of killed processes expire quickly in tests.
ZK_SESSION_S = 1.5
ETCD_LEASE_S = 1
SQLITE_TTL_S = 1.0
TIMEOUT_S = 5.0


@pytest.fixture(scope="session")
def zk_server():
    """zk_server is a ZooKeeper server shared by the test session."""
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_server():
    """etcd_server is an etcd server shared by the test session."""
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with EtcdServer() as server:
        yield server


def fresh_root() -> str:
    """fresh_root is a root path no other test uses."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sqlite_factory(tmp_path):
    """sqlite_factory opens stores on a fresh SQLite file with a short heartbeat TTL."""
    factory = StoreFactory(f"sqlite://{tmp_path}/metadata.db?ttl={SQLITE_TTL_S}&timeout={TIMEOUT_S}",
                           expiry=SQLITE_TTL_S)
    yield factory
    factory.close_all()


@pytest.fixture
def zk_factory(zk_server):
    """zk_factory opens stores on a fresh root of the shared ZooKeeper server, with short sessions."""
    factory = StoreFactory(zk_server.url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=TIMEOUT_S),
                           expiry=ZK_SESSION_S)
    yield factory
    factory.close_all()


@pytest.fixture
def etcd_factory(etcd_server):
    """etcd_factory opens stores on a fresh root of the shared etcd server, with short leases."""
    factory = StoreFactory(etcd_server.url(fresh_root(), lease_ttl=ETCD_LEASE_S, timeout=TIMEOUT_S),
                           expiry=ETCD_LEASE_S)
    yield factory
    factory.close_all()
