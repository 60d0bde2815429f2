"""A ledger of a log belongs to one instance of the log, not to its name (issue 47).

A ledger records the owner and creation time of the log it was made for (LogMetadata.ledger_custom).
Once that log is deleted, a later log of the same name, whoever owns it, governs none of the ledgers its
deletion missed (a writer may take a ledger off the list, which is what truncation does): such a ledger
is its owner's alone. Each rule is shown beside a broken-rule twin that lets the next owner in.
"""

from __future__ import annotations

import dataclasses
import io
import time

import pytest

from walkit import permissions, security
from walkit.bookie import access as bookie_access
from walkit.bookie.access import ALLOW, DENY, LedgerAccess
from walkit.core.loglist import LOG_CREATED, LOG_OWNER, LogMetadata, Position, log_key
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.deletions import delete_log_ledgers, was_deleted
from walkit.errors import PermissionDenied
from walkit.plugins import open_metadata
from walkit.replication.snapshots import write_snapshot
from walkit.testing.processes import wait_until

ALICE, MALLORY = "a1" * 32, "b2" * 32


@pytest.fixture
def store(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/metadata.db")
    for principal in (ALICE, MALLORY):
        security.allow(store, principal)
    yield store
    store.close()


def make_log(store, owner: str, created_ms: int, name: str = "orders") -> LogMetadata:
    log = LogMetadata(name=name, owner=owner, created_ms=created_ms)
    store.create(log_key(name), log.to_bytes())
    return log


def make_ledger(store, ledger_id: int, owner: str, custom) -> LedgerMetadata:
    metadata = LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1,
                              ensembles={0: ("127.0.0.1:1",)}, owner=owner, custom=dict(custom))
    store.create(ledger_key(ledger_id), metadata.to_bytes())
    return metadata


def delete_log(store, name: str = "orders") -> None:
    store.delete(log_key(name))
    security.forget_log(store, name)


def alices_unlisted_ledger_and_mallorys_next_log(store) -> LedgerMetadata:
    """alice's log with a ledger of it, granted to mallory; the log deleted without the ledger; mallory's log of
    the same name made next."""
    alices = make_log(store, ALICE, created_ms=1000)
    ledger = make_ledger(store, 7, ALICE, alices.ledger_custom())
    security.grant(store, MALLORY, "write", "orders")
    assert permissions.level(store, MALLORY, owner=ALICE, log="orders", ledger=ledger) == "write"
    delete_log(store)
    make_log(store, MALLORY, created_ms=2000)
    return ledger


def test_a_log_holds_the_ledgers_of_its_own_instance_and_of_before_instances_were_recorded():
    log = LogMetadata(name="orders", owner=ALICE, created_ms=1000)
    assert dict(log.ledger_custom()) == {"log": "orders", LOG_OWNER: ALICE, LOG_CREATED: "1000"}
    assert log.holds(dict(log.ledger_custom()))
    assert log.holds({"log": "orders"})                               # made by a walkit that recorded no instance
    assert not LogMetadata(name="orders", owner=MALLORY, created_ms=1000).holds(dict(log.ledger_custom()))
    assert not LogMetadata(name="orders", owner=ALICE, created_ms=2000).holds(dict(log.ledger_custom()))


def test_the_next_owner_of_a_name_holds_nothing_on_a_ledger_of_the_log_before(store):
    ledger = alices_unlisted_ledger_and_mallorys_next_log(store)
    assert permissions.level(store, MALLORY, owner=ALICE, log="orders", ledger=ledger) is None
    assert permissions.bound_log(store, ledger) is None
    with pytest.raises(PermissionDenied):
        permissions.check_ledger(store, MALLORY, ledger, "read")
    assert permissions.level(store, ALICE, owner=ALICE, log="orders", ledger=ledger) == "admin"


def test_broken_rule_a_ledger_governed_by_its_logs_name_goes_to_the_next_owner(store, monkeypatch):
    ledger = alices_unlisted_ledger_and_mallorys_next_log(store)
    monkeypatch.setattr(permissions, "of_instance", lambda log, ledger: True)
    assert permissions.level(store, MALLORY, owner=ALICE, log="orders", ledger=ledger) == "admin"


def test_a_ledger_of_a_deleted_log_is_of_no_log(store):
    alices = make_log(store, ALICE, created_ms=1000)
    ledger = make_ledger(store, 7, ALICE, alices.ledger_custom())
    assert permissions.bound_log(store, ledger) == "orders"
    delete_log(store)
    assert permissions.bound_log(store, ledger) is None
    old = make_ledger(store, 8, ALICE, {"log": "orders"})             # recorded no instance: by name, as before
    assert permissions.bound_log(store, old) == "orders"


def decided(access: LedgerAccess, principal: str, ledger_id: int) -> str:
    arrived = time.monotonic()
    verdict = access.decide(principal, ledger_id, "read", arrived)
    if verdict is None:
        wait_until(lambda: ledger_id in access.resolved(), 10, f"lookup of ledger {ledger_id}")
        verdict = access.decide(principal, ledger_id, "read", arrived)
    return verdict


@pytest.mark.parametrize("broken", [False, True])
def test_a_bookie_refuses_the_next_owner_of_the_name_and_serves_the_ledgers_owner(store, monkeypatch, broken):
    alices_unlisted_ledger_and_mallorys_next_log(store)
    if broken:
        monkeypatch.setattr(bookie_access, "of_instance", lambda log, ledger: True)
    allow_list = security.AllowList(store)
    access = LedgerAccess(store, allow_list)
    try:
        assert decided(access, MALLORY, 7) == (ALLOW if broken else DENY)
        assert decided(access, ALICE, 7) == ALLOW
    finally:
        access.close()
        allow_list.close()


@pytest.mark.parametrize("custom", [{"log": "orders"}, {"log": "orders", LOG_OWNER: MALLORY, LOG_CREATED: "1000"},
                                    {"log": "orders", LOG_OWNER: ALICE, LOG_CREATED: "5"}])
def test_a_grantee_may_not_rebind_a_ledger_to_another_instance(custom):
    log = LogMetadata(name="orders", owner=ALICE, created_ms=1000)
    base = LedgerMetadata(ledger_id=7, ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles={0: ("x",)},
                          owner=ALICE, custom=dict(log.ledger_custom()))
    with pytest.raises(PermissionDenied, match="only its owner"):
        permissions.check_change("ledgers/00000000000000000007", base.to_bytes(),
                                 dataclasses.replace(base, custom=custom).to_bytes())


def test_a_grantee_may_not_change_when_a_log_was_created_nor_list_a_ledger_of_another_instance(store):
    alices = make_log(store, ALICE, created_ms=1000)
    with pytest.raises(PermissionDenied, match="only its owner"):
        permissions.check_change("logs/orders", alices.to_bytes(), dataclasses.replace(alices, created_ms=5).to_bytes())
    earlier = LogMetadata(name="orders", owner=ALICE, created_ms=10)
    make_ledger(store, 7, ALICE, earlier.ledger_custom())
    make_ledger(store, 8, MALLORY, alices.ledger_custom())               # a grantee's roll: of this instance
    with pytest.raises(PermissionDenied, match="ledger 7 is not log 'orders'"):
        permissions.check_change("logs/orders", alices.to_bytes(),
                                 alices.with_segment(_segment(7)).to_bytes(), store)
    permissions.check_change("logs/orders", alices.to_bytes(), alices.with_segment(_segment(8)).to_bytes(), store)


def _segment(ledger_id: int):
    from walkit.core.loglist import LogSegment
    return LogSegment(ledger_id=ledger_id)


def test_deleting_a_log_deletes_its_instances_ledgers_and_keeps_a_listed_one_of_another_owners_instance(store):
    alices = make_log(store, ALICE, created_ms=1000)
    make_ledger(store, 7, MALLORY, alices.ledger_custom())                          # a grantee's, of this log
    make_ledger(store, 8, MALLORY, LogMetadata(name="orders", owner=MALLORY, created_ms=5).ledger_custom())
    listed = alices.with_segment(_segment(7)).with_segment(_segment(8))
    assert delete_log_ledgers(store, listed) == [7]
    assert was_deleted(store, 7) and not was_deleted(store, 8)


def test_ledgers_a_log_writer_and_a_snapshot_make_record_their_log_instance(memory_cluster):
    client = memory_cluster.client()
    with client.open_log("bounded") as writer:
        writer.append(b"x")
    with client.open_log("unbounded", unbounded=True) as writer:
        writer.append(b"x")
    with client.open_log("replicated-names") as writer:
        writer.append(b"x")
    pointer = write_snapshot(client, "names", io.BytesIO(b"state"), Position(0, 0), ensemble=3, write_quorum=2,
                             ack_quorum=2)
    for name, ledger_id in [("bounded", None), ("unbounded", None), ("replicated-names", pointer.ledger_id)]:
        log = LogMetadata.from_bytes(client.store.get(log_key(name))[0])
        ledger_id = log.ledger_ids[0] if ledger_id is None else ledger_id
        custom = client.open_ledger(ledger_id).metadata.custom
        assert log.created_ms > 0 and custom[LOG_OWNER] == log.owner and custom[LOG_CREATED] == str(log.created_ms)
        assert permissions.bound_log(client.store, client.open_ledger(ledger_id).metadata) == name


# -- a replicated name's snapshots and keys (adversarial review 5) ------------------------------------------------
def snapshot_ledger(store, ledger_id: int, owner: str, log: LogMetadata | None, name: str = "names") -> LedgerMetadata:
    custom = {"replication": name, "snapshot": "0:0", "created_ms": "0"}
    if log is not None:
        custom.update(log.ledger_custom("replication", name))
    return make_ledger(store, ledger_id, owner, custom)


def test_a_snapshot_is_the_names_only_if_its_owner_may_write_the_name(store):
    from walkit.replication.snapshots import is_snapshot_of
    names = make_log(store, ALICE, created_ms=1000, name="replicated-names")
    alices = snapshot_ledger(store, 7, ALICE, names)
    forged = snapshot_ledger(store, 8, MALLORY, None)             # the form before instances: any principal's
    copied = snapshot_ledger(store, 9, MALLORY, names)            # the instance's values, copied
    assert is_snapshot_of(store, "names", alices)
    assert not is_snapshot_of(store, "names", forged) and not is_snapshot_of(store, "names", copied)
    security.grant(store, MALLORY, "write", "replicated-names")
    assert is_snapshot_of(store, "names", forged) and is_snapshot_of(store, "names", copied)


def test_broken_rule_a_snapshot_taken_by_what_it_says_is_anyones(store, monkeypatch):
    from walkit.replication import snapshots
    make_log(store, ALICE, created_ms=1000, name="replicated-names")
    forged = snapshot_ledger(store, 8, MALLORY, None)
    monkeypatch.setattr(snapshots.permissions, "writes", lambda store, principal, log: True)
    assert snapshots.is_snapshot_of(store, "names", forged)


def test_a_pointer_names_a_snapshot_of_the_log_as_it_is_now(store):
    from walkit.replication.snapshots import is_snapshot_of
    names = make_log(store, ALICE, created_ms=1000, name="replicated-names")
    security.grant(store, MALLORY, "write", "replicated-names")
    mallorys = snapshot_ledger(store, 7, MALLORY, names)
    security.revoke(store, MALLORY, "replicated-names")          # published while granted: still the name's
    assert is_snapshot_of(store, "names", mallorys, by_writer=False)
    assert not is_snapshot_of(store, "names", mallorys)          # but no longer listed for restores
    delete_log(store, "replicated-names")
    make_log(store, MALLORY, created_ms=2000, name="replicated-names")
    assert not is_snapshot_of(store, "names", mallorys, by_writer=False)   # a pointer left by the log before


def test_deleting_a_replicated_names_log_deletes_its_snapshots_and_keys(store):
    from walkit.deletions import forget_name
    from walkit.replication.snapshots import index_key, pointer_key
    names = make_log(store, ALICE, created_ms=1000, name="replicated-names")
    snapshot_ledger(store, 7, ALICE, names)
    snapshot_ledger(store, 8, MALLORY, LogMetadata(name="replicated-names", owner=MALLORY, created_ms=5))
    make_ledger(store, 9, ALICE, {})             # the owner's own ledger of no log, which a writer indexed
    for key in (pointer_key("names"), index_key("names", 7), index_key("names", 8), index_key("names", 9),
                "elections/replication/names/leader", ".counters/elections/replication/names"):
        store.create(key, b"x")
    delete_log(store, "replicated-names")
    assert forget_name(store, names) == [7]                       # 8 is of another instance, 9 of no log
    assert was_deleted(store, 7) and not was_deleted(store, 8) and not was_deleted(store, 9)
    for prefix in ("replication", "elections/replication", ".counters/elections/replication"):
        assert store.children(prefix) == []


def test_deposing_ends_an_election(store):
    from walkit.election import LeaderElection, depose
    election = LeaderElection(store, "replication/names", "n1")
    election.campaign(timeout=5)
    assert election.leader() == "n1"
    assert depose(store, "replication/names") and election.leader() is None
    assert not depose(store, "replication/names")
