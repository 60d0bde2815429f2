"""ZooKeeper's principal mode: which znode is whose resource, and the digest identities (no server needed)."""

from __future__ import annotations

import pytest
from kazoo.security import make_digest_acl

from walkit.plugins.metadata.principals import is_principal, resource_of
from walkit.plugins.metadata.zookeeper_principals import digest_id


def test_a_digest_identity_is_the_one_zookeeper_computes():
    assert digest_id("a" * 64, "s3cret") == make_digest_acl("a" * 64, "s3cret", read=True).id.id


@pytest.mark.parametrize("path, resource", [
    ("ledgers/00000000000000000012", ("ledger", None)),
    ("logs/orders", ("log", "orders")),
    ("replication/tally", ("name", "replicated-tally")),
    ("replication/tally/snapshots/00000000000000000003", ("name", "replicated-tally")),
    ("elections/replication/tally/leader", ("name", "replicated-tally")),
    (".counters/elections/replication/tally", ("name", "replicated-tally")),
    ("ledgers", None), ("logs", None), ("elections/replication", None), ("replication", None),
    (".counters/ledger-id", None), ("bookies/127.0.0.1:3181", None), ("deleted-ledgers/00000000000000000012", None),
    ("ledgers/00000000000000000012/delete", None), ("security/clients/" + "a" * 64, None),
])
def test_which_znodes_are_resources(path, resource):
    assert resource_of(path) == resource


def test_only_a_64_hex_user_is_a_principal():
    assert is_principal("0f" * 32) and not is_principal("walkit") and not is_principal(None)
    assert not is_principal("0F" * 32) and not is_principal("0f" * 31)
