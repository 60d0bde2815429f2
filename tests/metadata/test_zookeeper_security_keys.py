"""The allow-list and the grants held by an operator user of their own in ZooKeeper (issue 47 item 1):
the cluster's user, which every bookie and client shares, reads them and cannot change them, through
walkit or directly with its own credentials. A real ZooKeeper server."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from walkit import security
from walkit.errors import ConfigError, MetadataError
from walkit.plugins import open_metadata
from walkit.testing.servers import with_user

from tests.conftest import fresh_root
from tests.metadata.conftest import TIMEOUT_S

USER, PASSWORD = "walkit", "cluster-s3cret"
OPERATOR, OPERATOR_PASSWORD = "walkit-operator", "operator-s3cret"
P, Q = "a" * 64, "b" * 64


@pytest.fixture
def urls(zk_server, tmp_path):
    """urls are (the operator's URI, the cluster user's URI) of a fresh root."""
    (tmp_path / "operator").write_text(OPERATOR_PASSWORD + "\n")
    cluster = with_user(zk_server.url(fresh_root(), timeout=TIMEOUT_S), USER, PASSWORD)
    return f"{cluster}&security_user={OPERATOR}&security_password_file={tmp_path / 'operator'}", cluster


@pytest.fixture
def stores(urls):
    opened = []

    def store(url):
        opened.append(open_metadata(url))
        return opened[-1]
    yield store
    for store in opened:
        store.close()


def cluster_kazoo(zk_server) -> KazooClient:
    client = KazooClient(hosts=zk_server.address, auth_data=[("digest", f"{USER}:{PASSWORD}")])
    client.start(timeout=TIMEOUT_S)
    return client


def refused_changes(store, root: str, zk_server) -> None:
    """refused_changes checks that `store` (the cluster's user) and a raw kazoo client with its credentials
    can change neither the allow-list nor the grants, and still read both."""
    assert P in security.allowed(store) and security.grants(store, "orders") == {P: "read"}
    for change in (lambda: security.allow(store, Q), lambda: security.disallow(store, P),
                   lambda: security.grant(store, P, "admin", "orders"), lambda: security.revoke(store, P, "orders"),
                   lambda: security.grant(store, Q, "admin", "other-log")):
        with pytest.raises(MetadataError, match="not authorized.*operator's user"):
            change()
    raw = cluster_kazoo(zk_server)
    try:
        for change in (lambda: raw.delete(f"{root}/security/clients/{P}"),
                       lambda: raw.set(f"{root}/security/acl/logs/orders/{P}", b"admin"),
                       lambda: raw.create(f"{root}/security/clients/{Q}", b"{}"),
                       lambda: raw.set_acls(f"{root}/security/clients", OPEN_ACL_UNSAFE)):
            with pytest.raises(NoAuthError):
                change()
    finally:
        raw.stop()
        raw.close()
    assert P in security.allowed(store) and security.grants(store, "orders") == {P: "read"}


@pytest.mark.slow
def test_zk_the_cluster_user_reads_but_cannot_change_the_operators_allow_list_and_grants(urls, stores, zk_server):
    operator_url, cluster_url = urls
    operator = stores(operator_url)
    security.allow(operator, P, "app")
    security.grant(operator, P, "read", "orders")
    cluster = stores(cluster_url)
    refused_changes(cluster, operator.root, zk_server)
    cluster.create("ledgers/00000000000000000001", b"{}")          # the rest of the store stays the cluster's
    security.disallow(operator, P)                                  # the operator can
    assert P not in security.allowed(cluster)


@pytest.mark.slow
def test_zk_an_operator_store_protects_the_security_keys_made_before_it(urls, stores, zk_server):
    operator_url, cluster_url = urls
    cluster = stores(cluster_url)
    security.allow(cluster, P, "app")                               # an existing cluster: all the cluster's
    security.grant(cluster, P, "read", "orders")
    stores(operator_url)                                            # one operator command protects them
    refused_changes(cluster, cluster.root, zk_server)


@pytest.mark.parametrize("options, message", [
    ("&security_user=op", "together"),
    ("&security_password_file=/nonexistent", "together"),
    (f"&security_user={USER}&security_password_file=PW", "of its own"),
])
def test_zk_a_security_user_that_does_not_add_up_is_refused(zk_server, tmp_path, options, message):
    (tmp_path / "pw").write_text("x\n")
    url = with_user(zk_server.url(fresh_root(), timeout=TIMEOUT_S), USER, PASSWORD)
    with pytest.raises(ConfigError, match=message):
        open_metadata(url + options.replace("PW", str(tmp_path / "pw")))
    with pytest.raises(ConfigError, match="of its own"):
        open_metadata(zk_server.url(fresh_root(), timeout=TIMEOUT_S)
                      + f"&security_user=op&security_password_file={tmp_path / 'pw'}")
