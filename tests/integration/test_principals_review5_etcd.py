"""Adversarial review 5 of etcd principal mode (setup: test_etcd_principals). Each test fails while its hole exists.

1. A ledger's owner writes its ledger's key directly (its role holds it). So a principal with no grant turns a ledger
   of its own into a snapshot ledger of someone else's replicated name, in the form walkit wrote before log
   instances (custom ``replication`` without ``log_owner``), which still belongs to the name's log by name alone.
   The name's owner's node indexes it and, given a created time of the planter's choosing, keeps it as the snapshot
   its retention window starts from: it deletes the owner's own older snapshots for it.
2. A replicated name's keys outlive its log: the next owner of the name finds the former owner's snapshot pointer,
   and the former owner's role still writes it.
3. A write grantee's leader key (on a lease of its own) outlives the grant's revocation: etcd lets the revoked role
   keep its lease alive, so the revoked principal keeps the name's election.
All three are closed: walkit.replication.snapshots.is_snapshot_of, walkit.deletions.forget_name (with the agent
dropping the name's claim and roles), and `walkit acl revoke` deposing the name's leader (walkit.election.depose).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time

import crc32c
import pytest

from walkit.core.loglist import LogMetadata, Position
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import WalkitError

from .principal_attacks import publish_snapshot, wins_election
from .helpers import wait_until
from .test_etcd_principals import Refused, alice, env, mallory  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.servers]

HOUR_MS = 3600 * 1000


def _forged_snapshot(client, name: str, position: Position, state: bytes, created_ms: int) -> int:
    """_forged_snapshot writes a closed ledger of no log as its owner, then rewrites its key (the owner's role holds
    it) into a snapshot of replicated name `name` as walkit wrote them before log instances; it returns its id."""
    writer = client.create_ledger(3, 2, 2)
    header = {"format": 1, "name": name, "position": str(position), "size": len(state),
              "crc32c": crc32c.crc32c(state)}
    writer.append(json.dumps(header).encode())
    writer.append(state)
    writer.close()
    value, version = client.store.get(ledger_key(writer.ledger_id))
    metadata = LedgerMetadata.from_bytes(value)
    custom = {"replication": name, "snapshot": str(position), "created_ms": str(created_ms)}
    client.store.put(ledger_key(writer.ledger_id), dataclasses.replace(metadata, custom=custom).to_bytes(), version)
    return writer.ledger_id


def test_etcd_review5_a_forged_snapshot_of_no_instance_is_not_taken_for_a_names_snapshot(env, alice, mallory):
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
        forged = _forged_snapshot(client, name, Position(ledger, 1), b"mallory's state", created_ms=0)
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


def test_etcd_review5_a_replicated_names_next_owner_inherits_nothing_from_its_former_owner(env, alice, mallory):
    from walkit.replication.snapshots import SnapshotPointer, pointer_key, publish, read_pointer
    name = "inherited"
    with mallory.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"m0")
        publish(client.store, name, SnapshotPointer(ledger_id=12345, position=Position(0, 0), size=15))
        client.delete_log(f"replicated-{name}")
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"alice's record")
    problems = []
    try:
        mallory.raw.put(pointer_key(name), SnapshotPointer(ledger_id=12346, position=Position(0, 0),
                                                           size=15).to_bytes())
        problems.append("mallory wrote the pointer of alice's name")
    except Refused:
        pass
    with alice.client() as client:
        pointer, _ = read_pointer(client.store, name)
    if pointer is not None:
        problems.append(f"alice's name points at ledger {pointer.ledger_id}, of mallory's making")
    assert problems == []


def test_etcd_review5_a_revoked_grantee_does_not_keep_a_names_election(env, alice, mallory):
    from walkit.replication.snapshots import SnapshotPointer, publish
    name = "held-election"
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"x")
        publish(client.store, name, SnapshotPointer(ledger_id=1, position=Position(0, 0), size=0))
    env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}")
    lease = mallory.raw.call("/lease/grant", {"TTL": 2})["ID"]
    leader = f"elections/replication/{name}/leader"
    value = json.dumps({"candidate": "mallory:9999", "epoch": 1}).encode()
    mallory.raw.call("/kv/put", {"key": mallory.raw.key(leader), "lease": lease,
                                 "value": base64.b64encode(value).decode()})
    env.walkit("acl", "revoke", mallory.id, "log", f"replicated-{name}")

    def gone() -> bool:
        try:
            mallory.raw.call("/lease/keepalive", {"ID": lease})       # she keeps her lease alive, if etcd lets her
        except Refused:
            pass
        return alice.raw.get(leader) is None
    wait_until(gone, timeout=15, interval=0.5, message="revoked mallory's leader key stays")
    with alice.client() as client:
        if not wins_election(client, name, 5):
            pytest.fail("alice cannot win her name's election")
