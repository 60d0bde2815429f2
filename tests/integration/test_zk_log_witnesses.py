"""A log's witness in ZooKeeper's principal mode (issue 47): who made a log, told apart from what its value says.

Any allowed principal may create under ``logs/``, with the value and the ACL it likes, so a log's value naming
its owner proves nothing. A principal's store creates its log with a witness ``log-owners/<principal>/<name>``
in one ZooKeeper transaction (the same czxid), in a directory only that principal creates in; the cluster's user
makes the witness of a log it creates for a principal, and, once, of the logs made before principal mode. A
principal's store takes a log naming it as owner for its own only with its witness. A real ZooKeeper; no bookies.
"""

from __future__ import annotations

import pytest

from walkit import faults, security
from walkit.core.loglist import LogMetadata
from walkit.errors import MetadataNotAuthorized, NoSuchKey
from walkit.plugins.metadata.zookeeper_principals import witness_key
from walkit.plugins import open_metadata
from walkit.testing.servers import with_user

from tests.conftest import fresh_root

pytestmark = [pytest.mark.slow, pytest.mark.servers]

USER, PASSWORD = "walkit", "cluster-s3cret"
ALICE = "a1" * 32


@pytest.fixture
def stores(zk_server, tmp_path):
    root = fresh_root()
    cluster = open_metadata(with_user(zk_server.url(root, timeout=10), USER, PASSWORD))
    opened = [cluster]

    def as_alice():
        password = tmp_path / "alice.zk"
        password.write_text("alice-s3cret")
        store = open_metadata(with_user(zk_server.url(root, timeout=10), ALICE) + f"&password_file={password}")
        opened.append(store)
        return store

    try:
        yield cluster, as_alice
    finally:
        for store in opened:
            store.close()


def test_logs_made_before_principal_mode_and_by_the_clusters_user_are_their_owners(stores):
    cluster, as_alice = stores
    cluster.create("logs/before", LogMetadata(name="before", owner=ALICE, created_ms=1).to_bytes())
    security.allow(cluster, ALICE)
    cluster.principal_identity(ALICE, "alice-s3cret")          # principal mode on: "before" gets its witness
    cluster.create("logs/after", LogMetadata(name="after", owner=ALICE, created_ms=2).to_bytes())
    alice = as_alice()
    alice.create("logs/own", LogMetadata(name="own", owner=ALICE, created_ms=3).to_bytes())
    for name in ("before", "after", "own"):
        assert LogMetadata.from_bytes(alice.get(f"logs/{name}")[0]).owner == ALICE


def test_a_log_made_again_gets_a_witness_of_its_own_and_the_old_one_proves_nothing(stores):
    cluster, as_alice = stores
    security.allow(cluster, ALICE)
    cluster.principal_identity(ALICE, "alice-s3cret")
    alice = as_alice()
    value = LogMetadata(name="again", owner=ALICE, created_ms=1).to_bytes()
    alice.create("logs/again", value)
    cluster.delete("logs/again")                                 # the witness stays behind
    alice.create("logs/again", value)                            # its store deletes the stale one first
    assert alice.get("logs/again")[0] == value
    # A log of that name made by someone else over a stale witness is not alice's.
    cluster._client.delete(cluster._path("logs/again"))
    cluster._client.create(cluster._path("logs/again"), value, acl=cluster._policy.resource_acl("log", "again", ALICE))
    fresh = as_alice()
    with pytest.raises(MetadataNotAuthorized, match="witness was made with another log"):
        fresh.get("logs/again")


@pytest.mark.parametrize("point", ["zookeeper.own_log.read", "zookeeper.own_log.acl"])
def test_a_log_deleted_while_its_owner_reads_it_is_absent_not_planted(stores, point):
    """A log deleted between its read and the reads of its ACL or witness is not there (NoSuchKey, as a read after
    the deletion says), not a crash with kazoo's NoNodeError (the CI failure of stop 56) nor a planted log."""
    cluster, as_alice = stores
    security.allow(cluster, ALICE)
    cluster.principal_identity(ALICE, "alice-s3cret")
    alice = as_alice()
    for name in ("raced", "raced-again"):
        alice.create(f"logs/{name}", LogMetadata(name=name, owner=ALICE, created_ms=1).to_bytes())

    def delete(name, again=False):
        def action():
            faults.disable(point)
            cluster._client.delete(cluster._path(f"logs/{name}"))
            if point.endswith(".acl"):
                cluster._client.delete(cluster._path(witness_key(ALICE, name)))
            if again:                                # made again by the cluster user: another instance
                cluster.create(f"logs/{name}", LogMetadata(name=name, owner=ALICE, created_ms=2).to_bytes())
        return action
    try:
        faults.enable(point, delete("raced"))
        with pytest.raises(NoSuchKey):
            alice.get("logs/raced")
        faults.enable(point, delete("raced-again", again=True))
        with pytest.raises(NoSuchKey):
            alice.get("logs/raced-again")
    finally:
        faults.disable(point)
    assert LogMetadata.from_bytes(alice.get("logs/raced-again")[0]).created_ms == 2     # read again: the new one
