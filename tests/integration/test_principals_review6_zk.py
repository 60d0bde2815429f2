"""Adversarial review 6 of ZooKeeper principal mode: the fixes of review 5 (commit 6067954) attacked.

Each test asserts the safe outcome; a hole found and still open is marked xfail(strict=True).

1. is_snapshot_of trusts a ledger's ``owner`` field. A ledger's owner is in its value, which its maker writes
   (ZooKeeper lets whoever creates a znode choose its value and ACL; nothing checks a ledger's owner against its
   maker). A principal that reads a replicated name's log (a `read` grant, or once held one: the instance's
   creation time never changes) makes a snapshot ledger of the log's current instance, writes it, then rewrites
   its owner to the name's owner: it then "may write the name now", so the name's node lists it, indexes it and,
   with a created time of the planter's choosing, keeps it and deletes the owner's own snapshots for it.
2. forget_name deletes every ledger the name's *index* lists that is "of no log and the log owner's", and a
   write grantee may create index entries: it lists the owner's private ledgers (ids are world-readable), and the
   owner's later deletion of the name deletes them, long after the grantee's revocation.
3. `walkit clients revoke` does not depose: a revoked principal's node keeps the ephemeral leader key of a name
   it held write on (as `walkit acl revoke` did before review 5's fix), for as long as its session lives.
4. `walkit acl grant/revoke` on a replicated name whose index has an entry (every name with a snapshot) fails with
   a NameError (zookeeper_principals._log_paths uses LEDGER_NAME, not imported since refactor 168069f), half way:
   after the grant record changed and before the snapshot ledgers' ACLs and the deposition, so a revoked grantee
   keeps the name's election (review 5's hole 3 again).
5. The reaper checks a principal's log deletion against the log's value (`_may`), then reads the value again
   (`deleted_log`) and deletes at no version. The log's owner rewrites its own log between the two: owner another
   principal, listing that principal's ledgers of no log; delete_ledgers_of then deletes them (a race, won within
   a few attempts by a thread that flips the value).

Closed: 2 (forget_name deletes only snapshots made for the deleted log), 3 (`walkit clients revoke` deposes the
names the principal could write), 4 (the import), 5 (the reaper deletes the value it checked, at its version).
Closed since: 1 (on a cluster with security only the name's index, which only its writers write, names its
snapshots: walkit.replication.snapshots.trusts_unindexed).

Refused, kept for coverage: a grantee's put that the reaper carried out and answered, then dropped by the
operator's `walkit acl grant` on the log before the grantee read the answer, does not leave the log listing a
deleted ledger (the grantee's open fails, NoSuchLog; nothing is lost).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
import time

import crc32c
import pytest
from kazoo.security import ACL, Id, Permissions

from walkit.core.loglist import LOG_CREATED, LOG_OWNER, LogMetadata, LogSegment, Position
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import NoSuchKey, WalkitError

from .principal_attacks import publish_snapshot, wins_election, zk_cluster, zk_digest
from .helpers import wait_until
from .test_zookeeper_principals import alice, env, mallory  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

HOUR_MS = 3600 * 1000


def _make_name(principal, name: str) -> None:
    """_make_name has the cluster make replicated name `name`'s znodes (any principal may ask), with no snapshot."""
    principal.raw.create(principal.path(f"deletion-requests/name|{name}|{secrets.token_hex(8)}"), b"")
    wait_until(lambda: principal.raw.exists(principal.path(f".counters/elections/replication/{name}")) is not None,
               timeout=20, message=f"the cluster did not make {name!r}'s znodes")


def _revoke(env, principal, log: str, monkeypatch) -> None:
    """_revoke is `walkit acl revoke` (it failed half way on a name with snapshots until LEDGER_NAME was imported)."""
    env.walkit("acl", "revoke", principal.id, "log", log)


def _log(env, name: str) -> LogMetadata:
    return LogMetadata.from_bytes(env.operator.get(f"logs/{name}")[0])


def _exists(env, key: str) -> bool:
    try:
        env.operator.get(key)
        return True
    except NoSuchKey:
        return False


@pytest.mark.parametrize("broken", [False, True])
def test_zk_review6_a_ledger_whose_owner_its_maker_rewrote_is_not_a_names_snapshot(env, alice, mallory, monkeypatch,
                                                                                   broken):
    # broken: the rule before, a ledger that says it is a snapshot counts without the name's index naming it.
    from walkit.plugins.metadata.zookeeper_principals import Policy
    from walkit.replication import snapshots
    from walkit.replication.snapshots import adopt_unindexed, collect_garbage, list_snapshots, retained
    if broken:
        monkeypatch.setattr(snapshots, "trusts_unindexed", lambda client: True)
    name = "owner-rewritten" + ("-broken" if broken else "")
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            for record in (b"r0", b"r1", b"r2"):
                log.append(record)
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
    # (Granted and revoked before the name has snapshots: see test_zk_review6_revoking_..._with_snapshots.)
    env.walkit("acl", "grant", mallory.id, "read", "log", f"replicated-{name}")     # a reader of the name
    try:
        instance = LogMetadata.from_bytes(mallory.raw.get(mallory.path(f"logs/replicated-{name}"))[0])
    finally:
        env.walkit("acl", "revoke", mallory.id, "log", f"replicated-{name}")        # what she read stays true
    with alice.client() as client:
        older = publish_snapshot(client, name, Position(ledger, 0), b"alice's state at 0")
        current = publish_snapshot(client, name, Position(ledger, 2), b"alice's state at 2")
    state, position = b"mallory's state", Position(ledger, 1)
    chosen = zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", zk_digest(mallory))),
                                  ACL(Permissions.READ, Id("digest", zk_digest(alice)))]
    original = Policy.acl_for
    monkeypatch.setattr(Policy, "acl_for", lambda self, rel, value: chosen if (
        rel.startswith("ledgers/") and self.own == zk_digest(mallory)) else original(self, rel, value))
    with mallory.client() as client:                 # a ledger of her own: the bookies take her entries
        writer = client.create_ledger(3, 2, 2)
        header = {"format": 1, "name": name, "position": str(position), "size": len(state),
                  "crc32c": crc32c.crc32c(state)}
        writer.append(json.dumps(header).encode())
        writer.append(state)
        writer.close()
    monkeypatch.setattr(Policy, "acl_for", original)
    forged = writer.ledger_id
    path = mallory.path(ledger_key(forged))
    metadata = LedgerMetadata.from_bytes(mallory.raw.get(path)[0])
    mallory.raw.set(path, dataclasses.replace(metadata, owner=alice.id, custom={   # her znode: she rewrites it
        "replication": name, "snapshot": str(position), "created_ms": "0",
        LOG_OWNER: instance.owner, LOG_CREATED: str(instance.created_ms)}).to_bytes())
    with alice.client() as client:
        restorable = [s.ledger_id for s in list_snapshots(client, name, scan=True)]
        adopt_unindexed(client, name)
        keep = retained(list_snapshots(client, name), current, HOUR_MS, int(time.time() * 1000))
        collect_garbage(client, name, keep, current)
        try:
            client.ledger_metadata(older.ledger_id)
            older_kept = True
        except WalkitError:
            older_kept = False
    if broken:
        assert forged in restorable and keep.ledger_id == forged and not older_kept
        return
    assert forged not in restorable and keep.ledger_id != forged and older_kept, (
        f"mallory's ledger {forged} is one of alice's snapshots (restorable: {restorable}; kept from: "
        f"{keep.ledger_id}); alice's own snapshot {older.ledger_id} "
        f"{'stays' if older_kept else 'was deleted for it'}")


def test_zk_review6_a_grantees_index_entry_does_not_have_the_names_deletion_delete_the_owners_ledger(env, alice,
                                                                                                    mallory,
                                                                                                    monkeypatch):
    from walkit.replication.snapshots import index_key
    name = "index-poisoned"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"r0")
        private = client.create_ledger(3, 2, 2)                                     # alice's, of no log
        private.append(b"alice's private record")
        private.close()
    _make_name(alice, name)
    env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}")
    # forget_name takes any child that is digits; an entry of 20 (as index_key writes it) works as well, but
    # `walkit acl revoke` then fails (test_zk_review6_revoking_..._with_snapshots).
    entry = f"{index_key(name, 0).rpartition('/')[0]}/{private.ledger_id}"
    mallory.raw.create(mallory.path(entry), b"",
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", zk_digest(mallory)))])
    _revoke(env, mallory, f"replicated-{name}", monkeypatch)
    with alice.client() as client:                   # later: alice is done with the name
        client.delete_log(f"replicated-{name}")
    wait_until(lambda: not _exists(env, f"replication/{name}"), timeout=20,
               message="the reaper did not forget the name")
    assert _exists(env, ledger_key(private.ledger_id)), (
        f"alice's private ledger {private.ledger_id} was deleted with her name, listed in its index by mallory")


def test_zk_review6_a_revoked_client_does_not_keep_a_names_election(env, alice):
    name = "held-by-a-revoked-client"
    trudy = env.principal("trudy")                   # revoked below: not the module's mallory
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"x")
    _make_name(alice, name)
    env.walkit("acl", "grant", trudy.id, "write", "log", f"replicated-{name}")
    leader = trudy.path(f"elections/replication/{name}/leader")
    trudy.raw.create(leader, json.dumps({"candidate": "trudy:9999", "epoch": 1}).encode(), ephemeral=True,
                     acl=zk_cluster(trudy) + [ACL(Permissions.ALL, Id("digest", zk_digest(trudy)))])
    env.walkit("clients", "revoke", trudy.id)
    try:
        wait_until(lambda: alice.raw.exists(leader) is None, timeout=10)
        held = False
    except AssertionError:
        held = True
    with alice.client() as client:
        won = wins_election(client, name, 3)
    assert not held and won, f"revoked trudy still holds {name!r}'s election (alice won: {won})"


def test_zk_review6_a_grantees_put_answered_then_dropped_does_not_delete_a_listed_ledger(env, alice, mallory,
                                                                                        monkeypatch):
    from walkit.plugins.metadata.zookeeper import ZooKeeperMetadataStore
    from walkit.plugins.metadata.zookeeper_principals import Policy
    name = "answered-then-dropped"
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice's record")
    bob = env.principal("bob")
    env.walkit("acl", "grant", mallory.id, "write", "log", name)
    armed, fired = [False], []
    original_put, original_get = Policy.put, ZooKeeperMetadataStore.get

    def put(self, key, value, expected_version):
        armed[0] = key == f"logs/{name}"
        try:
            return original_put(self, key, value, expected_version)
        finally:
            armed[0] = False

    def get(self, key):
        found = original_get(self, key)
        try:
            answer = json.loads(found[0]).get("answer") if key.startswith("put-requests/") else None
        except ValueError:
            answer = None
        if armed[0] and not fired and isinstance(answer, dict) and "version" in answer:
            fired.append(key)                        # carried out; now the operator grants bob on the log
            env.walkit("acl", "grant", bob.id, "read", "log", name)
            return original_get(self, key)
        return found
    monkeypatch.setattr(Policy, "put", put)
    monkeypatch.setattr(ZooKeeperMetadataStore, "get", get)
    try:
        with mallory.client() as client:
            try:
                with client.open_log(name) as log:
                    log.append(b"mallory's record")
            except WalkitError:
                pass                                 # seen: NoSuchLog (the put read as a deleted log)
    finally:
        monkeypatch.undo()
        env.walkit("acl", "revoke", mallory.id, "log", name)
    assert fired, "the operator's grant did not meet an answered put"
    listed = _log(env, name).ledger_ids
    missing = [ledger_id for ledger_id in listed if not _exists(env, ledger_key(ledger_id))]
    assert missing == [], f"log {name!r} lists deleted ledgers {missing}"
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice again")
        assert b"alice's record" in [bytes(r.payload) for r in client.read_log(name)]


def test_zk_review6_revoking_a_write_grant_on_a_replicated_name_with_snapshots_deposes_its_leader(env, alice,
                                                                                                   mallory):
    name = "revoked-with-snapshots"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"r0")
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
    _make_name(alice, name)
    env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}")    # no snapshot yet: it works
    leader = mallory.path(f"elections/replication/{name}/leader")
    mallory.raw.create(leader, json.dumps({"candidate": "mallory:9999", "epoch": 1}).encode(), ephemeral=True,
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", zk_digest(mallory)))])
    with alice.client() as client:
        publish_snapshot(client, name, Position(ledger, 0), b"alice's state")              # as every name has, soon
    revoked = subprocess.run([sys.executable, "-m", "walkit", "acl", "revoke", mallory.id, "log",
                              f"replicated-{name}", "--metadata", env.cluster_url], capture_output=True, text=True,
                             timeout=120)
    problems = [] if revoked.returncode == 0 else [f"revoke failed: {revoked.stderr.strip().splitlines()[-1]}"]
    if alice.raw.exists(leader) is not None:
        problems.append("revoked mallory still holds the name's election")
    try:
        env.operator.delete(f"elections/replication/{name}/leader")          # (her session would hold it)
    except NoSuchKey:
        pass
    assert problems == [], problems


def test_zk_review6_a_log_rewritten_while_the_reaper_deletes_it_does_not_delete_anothers_ledgers(env, alice, mallory):
    import threading
    from kazoo.exceptions import NoNodeError
    from walkit.errors import BadVersion, MetadataError
    name = "rewritten-while-deleted"
    with alice.client() as client:                   # alice's, of no log: only she may delete it
        private = client.create_ledger(3, 2, 2)
        private.append(b"alice's private record")
        private.close()
    mine = LogMetadata(name=name, owner=mallory.id, created_ms=1)
    theirs = dataclasses.replace(mine, owner=alice.id).with_segment(LogSegment(ledger_id=private.ledger_id))
    path, stop = mallory.path(f"logs/{name}"), threading.Event()

    def toggle() -> None:                            # her log: she writes it as she likes, as fast as she can
        while not stop.is_set():
            for value in (mine, theirs):
                try:
                    mallory.raw.set(path, value.to_bytes())
                except NoNodeError:
                    pass
    deadline, attempts = time.monotonic() + 90, 0
    with mallory.client() as client:
        thread = threading.Thread(target=toggle, daemon=True)
        thread.start()
        try:
            while time.monotonic() < deadline and _exists(env, ledger_key(private.ledger_id)):
                attempts += 1
                try:
                    client.store.create(f"logs/{name}", mine.to_bytes())     # with its witness
                except WalkitError:
                    pass                             # still there
                try:
                    client.store.delete(f"logs/{name}")
                except (MetadataError, BadVersion, NoSuchKey):
                    pass                             # refused (read as alice's), or raced
        finally:
            stop.set()
            thread.join()
    assert _exists(env, ledger_key(private.ledger_id)), (
        f"alice's private ledger {private.ledger_id} was deleted by mallory's deletion of her own log "
        f"(attempt {attempts})")
