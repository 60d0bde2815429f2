"""Adversarial review 3 of ZooKeeper principal mode: the requester named by a request's ACL.

The reaper takes a put request's maker from the one non-cluster digest its ACL names (requester_of). ZooKeeper
checks no digest ACL entry against its creator: any client may create a znode whose ACL names another user's
digest identity, and every principal's identity is on the world-readable allow-list. So whoever may create
children under ``put-requests/<log>`` can have the reaper act as the log's owner. A principal with no right on
the log gets that create right by making ``put-requests/<name>`` itself before the owner creates the log: its
ACL is then the creator's (resource_acl's `creator`), and the owner's made_log only warns on NodeExists.

Also: grants outlive the log they were made on (a later log of that name inherits them), and a write grantee
can remake a replicated name's znode with an ACL the revocation cannot reset. Each test fails while its hole exists.
"""

from __future__ import annotations

import base64
import json

import pytest
from kazoo.exceptions import NodeExistsError
from kazoo.security import ACL, Id, Permissions

from walkit.core.loglist import LogMetadata

from .helpers import wait_until
from .test_zookeeper_principals import alice, env, mallory  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def _own_acl(principal) -> list[ACL]:
    from walkit.plugins.metadata.zookeeper_principals import digest_id
    return [ACL(Permissions.ALL, Id("digest", digest_id(principal.id, principal.password)))]


def _cluster_ids(mallory) -> list[str]:
    return json.loads(mallory.raw.get(mallory.path("security/principal-identities"))[0])["cluster"]


def test_zk_review3_a_principal_without_a_grant_squats_a_logs_put_requests_and_forges_the_owner_as_requester(
        env, alice, mallory):
    # Once, a principal could make a log's put requests' znode before the log and then make requests whose ACL
    # named the owner's digest (ZooKeeper does not check a digest named in an ACL against its maker, and the
    # allow-list shows every digest), which the reaper took for the owner's. Now only the cluster makes
    # put-requests/<log>/<grantee> directories, and a request's path says who made it.
    from kazoo.exceptions import NoAuthError
    name = "squatted"
    cluster = [ACL(Permissions.ALL, Id("digest", i)) for i in _cluster_ids(mallory)]
    with pytest.raises(NoAuthError):
        mallory.raw.create(mallory.path(f"put-requests/{name}"), b"", acl=_own_acl(mallory) + cluster)
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"secret")
    env.walkit("acl", "grant", alice.id, "write", "log", name)       # a directory the cluster makes, for a grantee
    alice_id = json.loads(mallory.raw.get(mallory.path(f"security/clients/{alice.id}"))[0])["zookeeper"]
    emptied = LogMetadata(name=name, owner=alice.id).to_bytes()
    body = {"key": f"logs/{name}", "value": base64.b64encode(emptied).decode(), "version": 0}
    for where in (f"put-requests/{name}/{alice.id}/0000000000000001", f"put-requests/{name}/{mallory.id}",
                  f"put-requests/{name}/0000000000000002"):
        with pytest.raises(NoAuthError):
            mallory.raw.create(mallory.path(where), json.dumps(body).encode(),
                               acl=cluster + [ACL(Permissions.ALL, Id("digest", alice_id))])
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log(name)] == [b"secret"]


@pytest.fixture(scope="module")
def bob(env):
    return env.principal("bob")


def test_zk_review3_a_grant_on_a_deleted_log_is_not_a_grant_on_the_next_log_of_that_name(env, alice, mallory, bob):
    # Grants live at security/acl/logs/<name>/<principal>, keyed by the name alone; deleting a log leaves them.
    # A principal another owner granted keeps that level on whatever log is created later under the name.
    with alice.client() as client:
        with client.open_log("reused") as log:
            log.append(b"alice's")
    env.walkit("acl", "grant", mallory.id, "write", "log", "reused")
    with alice.client() as client:
        client.delete_log("reused")                   # alice is done with it (and with mallory's grant)
    with bob.client() as client:
        with client.open_log("reused") as log:        # bob's log, never granted to anyone
            log.append(b"bob's secret")
    read = None
    with mallory.client() as client:
        try:
            read = [bytes(r.payload) for r in client.read_log("reused")]
        except Exception:  # noqa: BLE001 - refused: held
            pass
    assert read is None, f"a grant alice made on her deleted log let mallory read bob's new log of that name: {read}"


def test_zk_review3_a_revoked_write_grantee_keeps_writing_a_replicated_names_snapshot_pointer(env, alice, mallory):
    # A replicated name's znodes give its log's write grants crwd, so a grantee may delete the snapshot pointer
    # (replication/N/snapshot, which every node of the name loads its state from) and make it again with an
    # ACL that gives the cluster every right but ADMIN: the revocation's pass cannot set that ACL back
    # (reacl_tree only reports it), and the revoked grantee keeps pointing alice's machine at a state it wrote.
    # (Since then the cluster makes a name's znodes, and a grantee may no longer delete or create them.)
    from kazoo.exceptions import NoAuthError
    from walkit.core.loglist import Position
    from walkit.replication.snapshots import SnapshotPointer, pointer_key, publish
    with alice.client() as client:
        with client.open_log("replicated-kept") as log:
            log.append(b"x")
        publish(client.store, "kept", SnapshotPointer(ledger_id=1, position=Position(0, 0), size=0))
    env.walkit("acl", "grant", mallory.id, "write", "log", "replicated-kept")
    path = mallory.path(pointer_key("kept"))
    cluster = [ACL(Permissions.ALL & ~Permissions.ADMIN, Id("digest", i)) for i in _cluster_ids(mallory)]
    try:
        mallory.raw.delete(path)
        mallory.raw.create(path, b'{"alice": "pointer"}', acl=_own_acl(mallory) + cluster)
    except NoAuthError:
        pass
    env.walkit("acl", "revoke", mallory.id, "log", "replicated-kept")
    try:
        mallory.raw.set(path, b'{"mallory": "pointer"}')
        kept = True
    except NoAuthError:
        kept = False
    assert not kept, "a revoked write grantee still rewrites the replicated name's snapshot pointer"
