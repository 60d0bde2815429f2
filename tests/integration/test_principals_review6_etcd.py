"""Adversarial review 6 of etcd principal mode (setup: test_etcd_principals): review 5's fixes attacked.

Each test asserts the safe outcome; a hole found and still open is marked xfail(strict=True).

1. is_snapshot_of trusts a ledger's ``owner`` field, and a ledger's owner writes its key directly (its role holds
   it; etcd does not look at values). A principal with no grant at all (every principal reads all metadata, so the
   name's log instance too) writes a snapshot ledger of its own, then rewrites its key: owner the name's owner,
   bound to the name's current log instance. The name's node lists and indexes it and, given a created time of the
   planter's choosing, keeps it and deletes the owner's own older snapshots for it.
2. forget_name deletes every ledger the name's index lists that is "of no log and the log owner's"; a write grantee
   writes the index: it lists the owner's private ledgers, and the owner's later deletion of the name (the agent
   carries it out) deletes them, after the grantee was revoked.
3. `walkit clients revoke` deposes nothing: a write grantee whose leader key (on a lease of its own) holds a
   replicated name's election keeps it after its etcd user and role are deleted, as etcd still takes its
   keepalives on the lease (review 5's fix deposes on `walkit acl revoke` only).

Closed: 2 and 3, and 1 since (on a cluster with security only the name's index, which only its writers write,
names its snapshots: walkit.replication.snapshots.trusts_unindexed).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time

import crc32c
import pytest

from walkit.core.loglist import LOG_CREATED, LOG_OWNER, LogMetadata, Position
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import NoSuchKey, WalkitError

from .principal_attacks import publish_snapshot, wins_election
from .helpers import wait_until
from .test_etcd_principals import Refused, alice, env, mallory  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.servers]

HOUR_MS = 3600 * 1000


def _exists(env, key: str) -> bool:
    try:
        env.operator.get(key)
        return True
    except NoSuchKey:
        return False


def test_etcd_review6_a_ledger_whose_owner_its_maker_rewrote_is_not_a_names_snapshot(env, alice, mallory):
    from walkit.replication.snapshots import adopt_unindexed, collect_garbage, list_snapshots, retained
    name = "owner-rewritten"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            for record in (b"r0", b"r1", b"r2"):
                log.append(record)
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
        older = publish_snapshot(client, name, Position(ledger, 0), b"alice's state at 0")
        current = publish_snapshot(client, name, Position(ledger, 2), b"alice's state at 2")
    instance = LogMetadata.from_bytes(mallory.raw.get(f"logs/replicated-{name}"))     # no grant: all is readable
    state, position = b"mallory's state", Position(ledger, 1)
    with mallory.client() as client:
        writer = client.create_ledger(3, 2, 2)
        header = {"format": 1, "name": name, "position": str(position), "size": len(state),
                  "crc32c": crc32c.crc32c(state)}
        writer.append(json.dumps(header).encode())
        writer.append(state)
        writer.close()
    forged = writer.ledger_id
    metadata = LedgerMetadata.from_bytes(mallory.raw.get(ledger_key(forged)))
    mallory.raw.put(ledger_key(forged), dataclasses.replace(metadata, owner=alice.id, custom={
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
    assert forged not in restorable and keep.ledger_id != forged and older_kept, (
        f"mallory's ledger {forged} is one of alice's snapshots (restorable: {restorable}; kept from: "
        f"{keep.ledger_id}); alice's own snapshot {older.ledger_id} "
        f"{'stays' if older_kept else 'was deleted for it'}")


def test_etcd_review6_a_grantees_index_entry_does_not_have_the_names_deletion_delete_the_owners_ledger(env, alice,
                                                                                                      mallory):
    from walkit.replication.snapshots import index_key
    name = "index-poisoned"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"r0")
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/replicated-{name}")[0]).ledger_ids[0]
        publish_snapshot(client, name, Position(ledger, 0), b"alice's state")
        private = client.create_ledger(3, 2, 2)                                     # alice's, of no log
        private.append(b"alice's private record")
        private.close()
    env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}")
    mallory.raw.put(index_key(name, private.ledger_id), b"")
    env.walkit("acl", "revoke", mallory.id, "log", f"replicated-{name}")
    with alice.client() as client:                   # later: alice is done with the name
        client.delete_log(f"replicated-{name}")
    wait_until(lambda: not _exists(env, index_key(name, private.ledger_id)), timeout=20,
               message="the agent did not forget the name")
    assert _exists(env, ledger_key(private.ledger_id)), (
        f"alice's private ledger {private.ledger_id} was deleted with her name, listed in its index by mallory")


def test_etcd_review6_a_revoked_client_does_not_keep_a_names_election(env, alice):
    from walkit.replication.snapshots import SnapshotPointer, publish
    name = "held-by-a-revoked-client"
    trudy = env.principal("trudy")                   # revoked below: not the module's mallory
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"x")
        publish(client.store, name, SnapshotPointer(ledger_id=1, position=Position(0, 0), size=0))
    env.walkit("acl", "grant", trudy.id, "write", "log", f"replicated-{name}")
    lease = trudy.raw.call("/lease/grant", {"TTL": 2})["ID"]
    leader = f"elections/replication/{name}/leader"
    value = json.dumps({"candidate": "trudy:9999", "epoch": 1}).encode()
    trudy.raw.call("/kv/put", {"key": trudy.raw.key(leader), "lease": lease,
                               "value": base64.b64encode(value).decode()})
    env.walkit("clients", "revoke", trudy.id)

    def gone() -> bool:
        try:
            trudy.raw.call("/lease/keepalive", {"ID": lease})         # she keeps her lease alive, if etcd lets her
        except Refused:
            pass
        return alice.raw.get(leader) is None
    wait_until(gone, timeout=15, interval=0.5, message="revoked trudy's leader key stays")
    with alice.client() as client:
        if not wins_election(client, name, 5):
            pytest.fail("alice cannot win her name's election")
