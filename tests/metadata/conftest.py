"""Fixtures for the metadata backends: real ZooKeeper and etcd servers, and a store factory per backend.

The servers are the Debian binaries, started once per test session on 127.0.0.1 (see
walkit.testing.servers); each test gets a fresh root in them. A missing binary fails the test
with a message that says to run scripts/test.sh, which installs them; nothing is skipped.
"""

from __future__ import annotations

import pytest

from walkit.testing.metadata import StoreFactory

from tests.conftest import fresh_root  # noqa: F401  (the servers are session fixtures in tests/conftest.py)

#: Short sessions, so that the registrations of killed processes expire quickly in tests.
ZK_SESSION_S = 1.5
ETCD_LEASE_S = 1
SQLITE_TTL_S = 1.0
TIMEOUT_S = 5.0


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
