"""Adversarial review 2 of ZooKeeper principal mode: a request that outlives its grant.

An operator pass (`walkit acl revoke`, `walkit clients revoke`) drops a grantee's pending put requests
(``put-requests/<name>/<principal>/<nonce>``) and deletion requests (``<resource>/delete``) with a plain ZooKeeper
delete. The request's ACL gives its maker ``crwd``, so the maker can give it a child: the delete then fails
with NotEmpty, which reacl_tree skips silently, and the request stays. The reaper never looks at grants
(only at ZooKeeper having let the request be made), so a hint made after the revocation, within
REQUEST_WINDOW_S of the request, is carried out.
"""

from __future__ import annotations

import base64
import json

import pytest
from kazoo.security import ACL, Id, Permissions

from walkit.core.metadata import deleted_key, ledger_key
from walkit.errors import MetadataError

from .helpers import wait_until
from .test_zookeeper_principals import a_log_with_a_ledger, alice, env, mallory  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def _own_acl(principal) -> list[ACL]:
    from walkit.plugins.metadata.zookeeper_principals import digest_id
    return [ACL(Permissions.ALL, Id("digest", digest_id(principal.id, principal.password)))]


def test_zk_review2_a_put_request_pinned_by_a_child_is_carried_out_after_the_grant_is_revoked(env, alice, mallory):
    log_ledger, _ = a_log_with_a_ledger(alice, "rev-put")
    env.walkit("acl", "grant", mallory.id, "write", "log", "rev-put")
    value, stat = mallory.raw.get(mallory.path("logs/rev-put"))
    nonce = "00112233445566aa"
    request = mallory.path(f"put-requests/rev-put/{mallory.id}/{nonce}")
    mallory.raw.create(request, b"{}")                               # made while granted: ZooKeeper lets it
    mallory.raw.create(f"{request}/pin", b"", acl=_own_acl(mallory))  # the maker's crwd lets it add a child
    env.walkit("acl", "revoke", mallory.id, "log", "rev-put")          # should drop every pending request
    try:
        # Revoked: mallory writes the change it wants now (its own znode) and hints it.
        doc = json.loads(value)
        doc["segments"] = []                                          # the log forgets all its ledgers
        body = {"key": "logs/rev-put", "value": base64.b64encode(json.dumps(doc).encode()).decode(),
                "version": stat.version}
        if mallory.raw.exists(request) is not None:
            mallory.raw.set(request, json.dumps(body).encode())
            mallory.raw.create(mallory.path(f"deletion-requests/put|rev-put|{mallory.id}|{nonce}"), b"")
            wait_until(lambda: b"answer" in mallory.raw.get(request)[0], timeout=20,
                       message="the reaper did not answer")
        with alice.client() as client:                 # the revoked grantee emptied alice's log
            assert [bytes(r.payload) for r in client.read_log("rev-put")] == [b"secret"], (
                f"the reaper answered {mallory.raw.get(request)[0]!r}")
        if mallory.raw.exists(request) is not None:      # pinned, so the revocation could not drop it: refused
            assert json.loads(mallory.raw.get(request)[0])["answer"]["error"] == "denied"
    finally:
        for path in (f"{request}/pin",):
            try:
                mallory.raw.delete(path)
            except Exception:  # noqa: BLE001
                pass


def test_zk_review2_a_deletion_request_pinned_by_a_child_has_a_ledgers_data_dropped_after_the_revocation(
        env, alice, mallory):
    log_ledger, _ = a_log_with_a_ledger(alice, "rev-del")
    env.walkit("acl", "grant", mallory.id, "write", "log", "rev-del")
    child = mallory.path(f"{ledger_key(log_ledger)}/delete")
    mallory.raw.create(child, b'{"version": -1}')                     # no hint yet
    mallory.raw.create(f"{child}/pin", b"", acl=_own_acl(mallory))
    env.walkit("acl", "revoke", mallory.id, "log", "rev-del")          # should drop the request
    try:
        mallory.raw.create(mallory.path(f"deletion-requests/{ledger_key(log_ledger).replace('/', '|')}#0"), b"")
        wait_until(lambda: mallory.raw.get_children(mallory.path("deletion-requests")) == []
                   or alice.raw.exists(alice.path(deleted_key(log_ledger))) is not None, timeout=20,
                   message="the reaper did not look at the hint")
        # The reaper writes the deletion marker (bookies drop the ledger's data) before it fails to delete
        # the pinned request; mallory then removes its pin and the next scan deletes the metadata too.
        assert alice.raw.exists(alice.path(deleted_key(log_ledger))) is None, (
            "a revoked grantee had the deletion marker written for the log's ledger")
        with alice.client() as client:
            assert [bytes(r.payload) for r in client.read_log("rev-del")] == [b"secret"]
    finally:
        try:
            mallory.raw.delete(f"{child}/pin")
        except Exception:  # noqa: BLE001
            pass


def test_zk_review2_a_former_write_grantee_cannot_block_the_logs_deletion_for_good(env, alice, mallory):
    # The docs list "as a `write` grant, add children under the log's ledgers that block their deletion";
    # the log's own znode is not writable by a write grant, yet a child of its put request blocks the log's.
    a_log_with_a_ledger(alice, "rev-block")
    env.walkit("acl", "grant", mallory.id, "write", "log", "rev-block")
    request = mallory.path(f"put-requests/rev-block/{mallory.id}/00112233445566bb")
    mallory.raw.create(request, b"{}")
    mallory.raw.create(f"{request}/pin", b"", acl=_own_acl(mallory))
    mallory.raw.create(f"{request}/pin/deeper", b"", acl=_own_acl(mallory))  # the cluster may not delete under pin
    env.walkit("acl", "revoke", mallory.id, "log", "rev-block")
    with alice.client() as client:
        try:
            client.delete_log("rev-block")
        except MetadataError as exc:
            pytest.fail(f"the owner cannot delete its log after revoking the grantee: {exc}")
    assert alice.raw.exists(alice.path("logs/rev-block")) is None


def test_zk_review2_a_write_grantee_cannot_splice_another_ledger_into_the_log_for_the_owner_to_delete(
        env, alice, mallory):
    # check_change keeps a log's name and owner, but not which ledgers it lists: a grantee may list any ledger,
    # and delete_log (the owner's, which deletes every listed ledger it may delete) then takes it along.
    from walkit.core.loglist import LogMetadata, LogSegment
    from walkit.errors import NoSuchKey
    _, lone = a_log_with_a_ledger(alice, "splice")                   # `lone`: alice's ledger of no log
    env.walkit("acl", "grant", mallory.id, "write", "log", "splice")
    spliced = False
    with mallory.client() as client:
        value, version = client.store.get("logs/splice")
        forged = LogMetadata.from_bytes(value).with_segment(
            LogSegment(ledger_id=lone, created_ms=1, last_entry_id=0, entries=1, size=7, closed_ms=1))
        try:
            client.store.put("logs/splice", forged.to_bytes(), version)
            spliced = True
        except MetadataError:
            pass
    problems = []
    with alice.client() as client:
        if spliced and [bytes(r.payload) for r in client.read_log("splice")] != [b"secret"]:
            problems.append("a grantee spliced the owner's private ledger into the log (its reads return it)")
        client.delete_log("splice")
        try:
            client.store.get(ledger_key(lone))
        except NoSuchKey:
            problems.append("deleting the log deleted a ledger of no log that a grantee listed in it")
    assert not problems, problems


def test_zk_review2_an_admin_grantee_cannot_keep_making_put_requests_after_its_revocation(env, alice, mallory):
    # An `admin` grant has crd on the log's znode, so it may delete the (empty) put requests' znode and make it
    # again with an ACL of its choice: the operator's pass cannot set that ACL back (no ADMIN right), and the
    # reaper checks no grant, only that ZooKeeper let the request be made.
    from kazoo.exceptions import NoAuthError
    from walkit.plugins.metadata.zookeeper_principals import digest_id
    from .test_zookeeper_principals import PASSWORD, USER
    a_log_with_a_ledger(alice, "rev-admin")
    env.walkit("acl", "grant", mallory.id, "admin", "log", "rev-admin")
    value, stat = mallory.raw.get(mallory.path("logs/rev-admin"))
    top = mallory.path("put-requests/rev-admin")
    try:
        mallory.raw.delete(top)
    except NoAuthError:
        return                                                         # held
    cluster = [ACL(Permissions.ALL & ~Permissions.ADMIN, Id("digest", digest_id(USER, PASSWORD)))]
    mallory.raw.create(top, b"", acl=_own_acl(mallory) + cluster)
    env.walkit("acl", "revoke", mallory.id, "log", "rev-admin")
    doc = json.loads(value)
    doc["segments"] = []
    body = {"key": "logs/rev-admin", "value": base64.b64encode(json.dumps(doc).encode()).decode(),
            "version": stat.version}
    nonce = "00112233445566cc"
    request = f"{top}/{nonce}"
    try:
        mallory.raw.create(request, json.dumps(body).encode(), acl=_own_acl(mallory) + cluster)
    except NoAuthError:
        return                                                         # held
    mallory.raw.create(mallory.path(f"deletion-requests/put|rev-admin|{nonce}"), b"")
    wait_until(lambda: b"answer" in mallory.raw.get(request)[0], timeout=20, message="the reaper did not answer")
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log("rev-admin")] == [b"secret"], (
            f"a revoked admin grantee emptied the log: the reaper answered {mallory.raw.get(request)[0]!r}")


def test_zk_review2_an_admin_grantee_cannot_stop_its_revocation_and_keep_deleting_the_logs_ledgers(
        env, alice, mallory):
    # As above, but the put requests' znode is made unreadable to the cluster: reacl_log lists its children
    # outside its error handling, so `walkit acl revoke` stops there, before the log's ledgers' ACLs, and the
    # revoked grantee keeps `crd` on them; the reaper deletes whatever ledger a `delete` child was made under.
    import subprocess
    import sys
    from kazoo.exceptions import NoAuthError
    log_ledger, _ = a_log_with_a_ledger(alice, "rev-stuck")
    env.walkit("acl", "grant", mallory.id, "admin", "log", "rev-stuck")
    top = mallory.path("put-requests/rev-stuck")
    try:
        mallory.raw.delete(top)
    except NoAuthError:
        return                                                         # held
    mallory.raw.create(top, b"", acl=_own_acl(mallory))
    done = subprocess.run([sys.executable, "-m", "walkit", "acl", "revoke", mallory.id, "log", "rev-stuck",
                           "--metadata", env.cluster_url], capture_output=True, text=True, timeout=120)
    try:
        mallory.raw.create(mallory.path(f"{ledger_key(log_ledger)}/delete"), b'{"version": -1}')
    except NoAuthError:
        kept = False
    else:
        kept = True
        mallory.raw.create(mallory.path(f"deletion-requests/{ledger_key(log_ledger).replace('/', '|')}#1"), b"")
        wait_until(lambda: alice.raw.exists(alice.path(deleted_key(log_ledger))) is not None
                   or alice.raw.exists(alice.path(f"{ledger_key(log_ledger)}/delete")) is None, timeout=20,
                   message="the reaper did not look at the request")
    assert not kept and done.returncode == 0, (
        f"revoke exit {done.returncode} ({done.stderr.strip()[-300:]}); the revoked grantee kept create on the log's "
        f"ledger; its deletion marker was written: {alice.raw.exists(alice.path(deleted_key(log_ledger))) is not None}")
