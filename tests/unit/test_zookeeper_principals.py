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


@pytest.mark.parametrize("path, write, read", [
    ("replication/tally", "r", "r"),
    ("replication/tally/snapshot", "rw", "r"),
    ("replication/tally/snapshots", "crd", "r"),
    ("replication/tally/snapshots/00000000000000000003", "rw", "r"),
    ("elections/replication/tally", "crd", "r"),
    ("elections/replication/tally/leader", "rw", "r"),
    (".counters/elections/replication/tally", "rw", "r"),
])
def test_a_names_writers_create_and_delete_only_index_entries_and_the_leaders_key(path, write, read):
    # A writer that could create or delete the name's own znodes could make one again with an ACL of its own and
    # pin it with children past its revocation (zookeeper_principals._name_perms; the cluster makes them).
    from kazoo.security import Permissions
    from walkit.plugins.metadata.zookeeper_principals import _name_perms

    def letters(perms: int) -> str:
        return "".join(c for c, bit in (("c", Permissions.CREATE), ("r", Permissions.READ), ("w", Permissions.WRITE),
                                        ("d", Permissions.DELETE), ("a", Permissions.ADMIN)) if perms & bit)
    assert letters(_name_perms(path, "write")) == write == letters(_name_perms(path, "admin"))
    assert letters(_name_perms(path, "read")) == read
    assert _name_perms(path, "none") == 0
