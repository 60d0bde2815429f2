"""The allow-list and the grants held by an operator user of their own in etcd (issue 47 item 1): with the
roles docs/operations/security.md gives, the cluster's user (every bookie and client) reads them and
cannot change them, through walkit or directly through etcd's gateway with its own token, while
the rest of the store stays its own. A real etcd with authentication enabled."""

from __future__ import annotations

import base64

import pytest
import requests

from walkit import security
from walkit.errors import MetadataError
from walkit.plugins import open_metadata
from walkit.testing.servers import SecuredEtcdServer, etcd_missing, with_user

from tests.metadata.conftest import ETCD_LEASE_S, TIMEOUT_S

ROOT = "/walkit"
P, Q = "a" * 64, "b" * 64


def _range(low: str, high: str) -> dict:
    return {"key": base64.b64encode(low.encode()).decode(), "range_end": base64.b64encode(high.encode()).decode()}


@pytest.fixture(scope="module")
def etcd():
    """etcd has users walkit (role walkit-cluster) and walkit-operator, with the guide's roles on /walkit/."""
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with SecuredEtcdServer() as server:
        token = server.root_token()
        grants = {"walkit-cluster": [(f"{ROOT}/", f"{ROOT}/security/", "READWRITE"),     # all but security/
                                     (f"{ROOT}/security0", f"{ROOT}0", "READWRITE"),
                                     (f"{ROOT}/security/", f"{ROOT}/security0", "READ")],
                  "walkit-operator": [(f"{ROOT}/", f"{ROOT}0", "READWRITE")]}
        for role, perms in grants.items():
            server.api("/auth/role/add", {"name": role}, token)
            for low, high, kind in perms:
                server.api("/auth/role/grant", {"name": role, "perm": {**_range(low, high), "permType": kind}}, token)
        for user, role in (("walkit", "walkit-cluster"), ("walkit-operator", "walkit-operator")):
            server.api("/auth/user/add", {"name": user, "password": f"{user}-s3cret"}, token)
            server.api("/auth/user/grant", {"user": user, "role": role}, token)
        yield server


def store_of(etcd, user: str):
    return open_metadata(with_user(etcd.url(ROOT, lease_ttl=ETCD_LEASE_S, timeout=TIMEOUT_S), user, f"{user}-s3cret"))


@pytest.mark.slow
def test_etcd_the_cluster_user_reads_but_cannot_change_the_operators_allow_list_and_grants(etcd):
    operator, cluster = store_of(etcd, "walkit-operator"), store_of(etcd, "walkit")
    try:
        security.allow(operator, P, "app")
        security.grant(operator, P, "read", "orders")
        assert P in security.allowed(cluster) and security.grants(cluster, "orders") == {P: "read"}
        for change in (lambda: security.allow(cluster, Q), lambda: security.disallow(cluster, P),
                       lambda: security.grant(cluster, P, "admin", "orders"),
                       lambda: security.revoke(cluster, P, "orders")):
            with pytest.raises(MetadataError, match="permission denied.*operator's user"):
                change()
        gateway = f"http://{etcd.address}/v3"
        token = requests.post(f"{gateway}/auth/authenticate", json={"name": "walkit", "password": "walkit-s3cret"},
                              timeout=10).json()["token"]
        for path, body in (("/kv/deleterange", _range(f"{ROOT}/security/", f"{ROOT}/security0")),
                           ("/kv/put", {"key": _range(f"{ROOT}/security/clients/{Q}", "x")["key"], "value": ""})):
            answer = requests.post(gateway + path, json=body, headers={"Authorization": token}, timeout=10)
            assert "permission denied" in answer.text, answer.text
        assert P in security.allowed(cluster) and security.grants(cluster, "orders") == {P: "read"}
        cluster.create("ledgers/00000000000000000001", b"{}")      # the rest of the store stays the cluster's
        assert cluster.next_id("ledger-ids") == 0
        security.disallow(operator, P)                              # the operator can
        assert P not in security.allowed(cluster)
    finally:
        operator.close()
        cluster.close()
