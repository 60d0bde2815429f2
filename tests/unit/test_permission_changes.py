"""walkit.permissions.check_change: what a grantee's change of a ledger or log may not touch (issue 47).

In principal mode (ZooKeeper's reaper, etcd's agent) a principal that may write a ledger or log but does not
own it changes it only through the cluster, which refuses a change of what decides who holds it: the
owner, the log, the ledger id, the log's name. Otherwise the grantee could write itself in as the owner and
keep the resource after its grant is revoked.
"""

from __future__ import annotations

import dataclasses

import pytest

from walkit.core.loglist import LogMetadata
from walkit.core.metadata import LedgerMetadata
from walkit.errors import PermissionDenied
from walkit.permissions import check_change

ALICE, MALLORY = "a" * 64, "b" * 64


def ledger(**changes) -> bytes:
    base = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles={0: ("x", "y", "z")},
                          custom={"log": "orders"}, owner=ALICE)
    return dataclasses.replace(base, **changes).to_bytes()


def log(**changes) -> bytes:
    return dataclasses.replace(LogMetadata(name="orders", owner=ALICE), **changes).to_bytes()


def test_a_grantee_may_change_what_a_writer_changes():
    check_change("ledgers/00000000000000000007", ledger(), ledger(state="CLOSED", last_entry_id=3))
    check_change("logs/orders", log(), log(truncated_to=5))


@pytest.mark.parametrize("changed", [dict(owner=MALLORY), dict(custom={}), dict(custom={"log": "mallorys"}),
                                     dict(ledger_id=8)])
def test_a_grantee_may_not_change_a_ledgers_owner_log_or_id(changed):
    with pytest.raises(PermissionDenied, match="only its owner"):
        check_change("ledgers/00000000000000000007", ledger(), ledger(**changed))


@pytest.mark.parametrize("changed", [dict(owner=MALLORY), dict(owner=""), dict(name="other")])
def test_a_grantee_may_not_change_a_logs_owner_or_name(changed):
    with pytest.raises(PermissionDenied, match="only its owner"):
        check_change("logs/orders", log(), log(**changed))
