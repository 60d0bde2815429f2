"""Adversarial review 5 of ZooKeeper principal mode: log instances, log witnesses, replicated names made by the cluster.

Each test asserts the safe outcome, so it fails while its hole exists. All five found are closed:
1. walkit.replication.snapshots.is_snapshot_of (a snapshot counts only if its owner may write the name now);
2. walkit.deletions.forget_name (a replicated name's snapshots and keys go with its log);
3. `walkit acl revoke` deposes the name's leader (walkit.election.depose);
4. a principal's store writes no log without an owner (Policy.check_log_write), and the log machine fails at once
   on a store's refusal instead of taking it for contention (LogMetadataConflict.refused);
5. a snapshot scan skips ledgers its reader may not read.

1. A principal with no grant creates a snapshot ledger of someone else's replicated name in the form walkit wrote
   before log instances (custom ``replication`` without ``log_owner``): such a ledger still belongs to the name's
   log by name alone, so the name's owner reads it, a restore (``list_snapshots(scan=True)``) takes it for one of
   the name's snapshots, and the owner's node indexes it (``adopt_unindexed``); with a created time of its
   choosing it becomes the snapshot the retention window keeps, and the owner's node deletes the owner's own
   older snapshots (and truncates its log) for it.
2. A replicated name's znodes outlive its log: after its owner deletes ``replicated-N``, the next owner of the
   name finds the former owner still holding write on the name's pointer, and, once the cluster remade the
   name's znodes, loads the pointer the former owner left, into a snapshot of the former owner's making.
3. A write grantee holds a replicated name's election with an ephemeral leader key of its own; the grant's
   revocation leaves the key (ZooKeeper deletes it only with its maker's session), so a revoked principal keeps
   the name's election.
4. A principal plants ``logs/<name>`` with *no* owner (an unowned resource is open to everyone) and an ACL that
   keeps write for itself. The witness and ACL check covers only a log whose value names the reader, so the
   victim's client takes the log, writes into it, and the planter rewrites its list.
5. (A bug, not a hole.) A snapshot scan fails on the first ledger its reader may not read, so any principal's
   private ledger stops restores and a node's snapshot collection.

Refused, and kept for coverage: a later `walkit clients allow` (a full ACL pass) makes no witness for a log planted
in another's name; a write grantee cannot strip or change a ledger's log instance through the reaper.
"""

from __future__ import annotations

import json
import secrets
import time

import crc32c
import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, Id, Permissions

from walkit.core.loglist import LogMetadata, Position
from walkit.errors import MetadataError, PermissionDenied, WalkitError

from .principal_attacks import publish_snapshot, wins_election, zk_cluster, zk_digest
from .helpers import wait_until
from .test_zookeeper_principals import alice, env, mallory  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

HOUR_MS = 3600 * 1000


def _forged_snapshot(client, name: str, position: Position, state: bytes, created_ms: int, *, maker, reader,
                     monkeypatch) -> int:
    """_forged_snapshot writes, as principal `maker`, a closed snapshot ledger of replicated name `name` as walkit did
    before log instances (no log_owner, log_created_ms): it returns its id. Its maker owns it and, as whoever creates
    a znode, chooses its ACL: its own, the cluster's, and read for `reader` (whose digest the allow-list shows)."""
    from walkit.plugins.metadata.zookeeper_principals import Policy
    chosen = zk_cluster(maker) + [ACL(Permissions.ALL, Id("digest", zk_digest(maker))),
                                ACL(Permissions.READ, Id("digest", zk_digest(reader)))]
    original = Policy.acl_for
    monkeypatch.setattr(Policy, "acl_for", lambda self, rel, value: chosen if (
        rel.startswith("ledgers/") and self.own == zk_digest(maker)) else original(self, rel, value))
    writer = client.create_ledger(3, 2, 2, custom={"replication": name, "snapshot": str(position),
                                                   "created_ms": str(created_ms)})
    header = {"format": 1, "name": name, "position": str(position), "size": len(state),
              "crc32c": crc32c.crc32c(state)}
    writer.append(json.dumps(header).encode())
    writer.append(state)
    writer.close()
    monkeypatch.setattr(Policy, "acl_for", original)
    return writer.ledger_id


def test_zk_review5_a_forged_snapshot_of_no_instance_is_not_taken_for_a_names_snapshot(env, alice, mallory,
                                                                                        monkeypatch):
    # First in this module: list_snapshots(scan=True) and adopt_unindexed read every ledger's metadata, and fail on
    # one the reader may not read (another principal's ledger of no log), which later tests make.
    from walkit.replication.snapshots import adopt_unindexed, collect_garbage, list_snapshots, retained
    name = "forged-snapshot"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            for record in (b"r0", b"r1", b"r2"):
                log.append(record)
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
        older = publish_snapshot(client, name, Position(ledger, 0), b"alice's state at 0")
        current = publish_snapshot(client, name, Position(ledger, 2), b"alice's state at 2")
    with mallory.client() as client:                 # no grant on replicated-forged-snapshot
        forged = _forged_snapshot(client, name, Position(ledger, 1), b"mallory's state", created_ms=0,
                                  maker=mallory, reader=alice, monkeypatch=monkeypatch)
    with alice.client() as client:
        restorable = [s.ledger_id for s in list_snapshots(client, name, scan=True)]    # what a restore picks from
        adopt_unindexed(client, name)                                                    # the node, once per start
        keep = retained(list_snapshots(client, name), current, HOUR_MS, int(time.time() * 1000))
        collect_garbage(client, name, keep, current)                                     # the node, after each
        try:
            client.ledger_metadata(older.ledger_id)
            older_kept = True
        except WalkitError:
            older_kept = False
    assert forged not in restorable and keep.ledger_id != forged and older_kept, (
        f"mallory's ledger {forged} is one of alice's snapshots (restorable: {restorable}; kept from: "
        f"{keep.ledger_id}); alice's own snapshot {older.ledger_id} in her retention window "
        f"{'stays' if older_kept else 'was deleted for it'}")


def test_zk_review5_a_replicated_names_next_owner_inherits_nothing_from_its_former_owner(env, alice, mallory,
                                                                                          monkeypatch):
    from walkit.replication.snapshots import SnapshotPointer, load_snapshot, pointer_key, publish, read_pointer
    name = "inherited"
    with mallory.client() as client:                 # mallory's name first, with a snapshot of her making
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"m0")
        forged = _forged_snapshot(client, name, Position(0, 0), b"mallory's state", created_ms=0,
                                  maker=mallory, reader=alice, monkeypatch=monkeypatch)
        publish(client.store, name, SnapshotPointer(ledger_id=forged, position=Position(0, 0), size=15))
        client.delete_log(f"replicated-{name}")      # her log goes; its name's znodes stay
    with alice.client() as client:                   # alice takes the free name
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"alice's record")
    problems = []
    try:
        mallory.raw.set(mallory.path(pointer_key(name)), SnapshotPointer(
            ledger_id=forged, position=Position(0, 0), size=15).to_bytes())
        problems.append("mallory wrote the pointer of alice's name")
    except (NoAuthError, NoNodeError):          # gone with mallory's log (deletions.forget_name)
        pass
    # Any principal may ask the cluster to make a name's znodes (alice's node would, if it could read them).
    alice.raw.create(alice.path(f"deletion-requests/name|{name}|{secrets.token_hex(8)}"), b"")
    with alice.client() as client:
        pointer, _ = wait_until(lambda: (read_pointer(client.store, name),), timeout=20,
                                message="the cluster did not give alice her name's znodes")[0]
        if pointer is not None:
            problems.append(f"alice's name points at ledger {pointer.ledger_id}, of mallory's making")
            # Bookies cache a ledger's log owner until some grant changes (any log's): then alice's node loads it.
            with client.open_log("unrelated") as log:
                log.append(b"x")
            env.walkit("acl", "grant", mallory.id, "read", "log", "unrelated")
            state = wait_until(lambda: load_snapshot(client, pointer).read(), timeout=10)
            problems.append(f"alice's node loads {state!r} from it")
    assert problems == []


def test_zk_review5_a_revoked_grantee_does_not_keep_a_names_election(env, alice, mallory):
    from walkit.replication.snapshots import SnapshotPointer, publish
    name = "held-election"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"x")
        publish(client.store, name, SnapshotPointer(ledger_id=1, position=Position(0, 0), size=0))   # its znodes
    env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}")
    leader = mallory.path(f"elections/replication/{name}/leader")
    mallory.raw.create(leader, json.dumps({"candidate": "mallory:9999", "epoch": 1}).encode(), ephemeral=True,
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", zk_digest(mallory)))])
    env.walkit("acl", "revoke", mallory.id, "log", f"replicated-{name}")
    try:
        wait_until(lambda: alice.raw.exists(leader) is None, timeout=10)
        held = False
    except AssertionError:
        held = True
    with alice.client() as client:
        won = wins_election(client, name, 3)
    assert not held and won, f"revoked mallory still holds {name!r}'s election (alice won: {won})"


def test_zk_review5_a_log_planted_with_no_owner_is_not_taken_by_a_principal(env, alice, mallory):
    name = "ownerless"
    planted = LogMetadata(name=name, owner="").to_bytes()
    mallory.raw.create(mallory.path(f"logs/{name}"), planted,
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("world", "anyone"))])
    try:
        with alice.client() as client:
            with client.open_log(name) as log:           # the name alice meant to use
                log.append(b"alice's secret")
    except (PermissionDenied, MetadataError):
        return                                           # refused: safe
    mallory.raw.set(mallory.path(f"logs/{name}"), planted)   # her ledgers dropped from the log
    with alice.client() as client:
        read = [bytes(r.payload) for r in client.read_log(name)]
    assert read == [b"alice's secret"], f"alice wrote into a log mallory planted, and mallory rewrote it: {read}"


def test_zk_review5_a_snapshot_scan_skips_ledgers_the_reader_may_not_read(env, alice, mallory):
    from walkit.replication.snapshots import list_snapshots
    name = "scanned"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"r0")
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
        mine = publish_snapshot(client, name, Position(ledger, 0), b"alice's state")
    with mallory.client() as client:                 # a ledger of her own, as every principal may make
        writer = client.create_ledger(3, 2, 2)
        writer.append(b"mallory's own")
        writer.close()
    with alice.client() as client:
        assert [s.ledger_id for s in list_snapshots(client, name, scan=True)] == [mine.ledger_id]


def test_zk_review5_a_planted_log_stays_unwitnessed_through_a_later_clients_allow(env, alice, mallory):
    # The legacy pass (witnesses for the logs made before principal mode) runs once: a later `walkit clients allow`,
    # which rewrites every ACL (so the planted log's ACL becomes exactly what alice's own would be), makes none.
    from walkit.errors import MetadataNotAuthorized
    name = "planted-before-allow"
    alice_id = json.loads(mallory.raw.get(mallory.path(f"security/clients/{alice.id}"))[0])["zookeeper"]
    mallory.raw.create(mallory.path(f"logs/{name}"), LogMetadata(name=name, owner=alice.id).to_bytes(),
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", alice_id)),
                                                ACL(Permissions.ALL, Id("digest", zk_digest(mallory)))])
    env.principal("bob")                             # the operator allows another principal: a full ACL pass
    assert mallory.raw.exists(mallory.path(f"log-owners/{alice.id}/{name}")) is None
    with alice.client() as client:
        with pytest.raises(MetadataNotAuthorized, match="no witness"):
            client.open_log(name)


def test_zk_review5_a_write_grantee_cannot_rebind_a_ledger_to_no_instance_through_the_reaper(env, alice, mallory):
    # Stripping log_owner/log_created_ms would make alice's ledger "of before instances": of any later log of its
    # name, which mallory could then create. The reaper's put refuses it (permissions.check_change).
    import dataclasses
    from walkit.core.metadata import LedgerMetadata, ledger_key
    from walkit.errors import MetadataNotAuthorized
    name = "rebind"
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice's secret")
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/{name}")[0]).ledger_ids[0]
    env.walkit("acl", "grant", mallory.id, "write", "log", name)
    try:
        with mallory.client() as client:
            value, version = client.store.get(ledger_key(ledger))
            metadata = LedgerMetadata.from_bytes(value)
            for custom in ({"log": name}, {**metadata.custom, "log_owner": mallory.id},
                           {**metadata.custom, "log_created_ms": "1"}):
                with pytest.raises(MetadataNotAuthorized, match="only its owner"):
                    client.store.put(ledger_key(ledger), dataclasses.replace(metadata, custom=custom).to_bytes(),
                                     version)
            assert client.store.get(ledger_key(ledger))[0] == value
    finally:
        env.walkit("acl", "revoke", mallory.id, "log", name)
