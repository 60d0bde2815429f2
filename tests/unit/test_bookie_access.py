"""LedgerAccess (issue 17): a secured bookie's ownership checks against a real (SQLite) metadata store."""

from __future__ import annotations

import time

import pytest

from walkit import security
from walkit.bookie.access import ALLOW, DENY, NO_LEDGER, UNREADABLE, LedgerAccess
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.plugins import open_metadata
from walkit.testing.processes import wait_until

ALICE = "a1" * 32
MALLORY = "b2" * 32


@pytest.fixture
def store(tmp_path):
    store = open_metadata(f"sqlite://{tmp_path}/metadata.db")
    yield store
    store.close()


@pytest.fixture
def access(store):
    for principal in (ALICE, MALLORY):
        security.allow(store, principal)
    allow_list = security.AllowList(store)
    access = LedgerAccess(store, allow_list)
    yield access
    access.close()
    allow_list.close()


def decided(access: LedgerAccess, principal: str, ledger_id: int, needed: str, arrived: float) -> str:
    """decided asks until the lookup finished and returns the verdict."""
    verdict = access.decide(principal, ledger_id, needed, arrived)
    if verdict is None:
        wait_until(lambda: ledger_id in access.resolved(), 10, f"lookup of ledger {ledger_id}")
        verdict = access.decide(principal, ledger_id, needed, arrived)
    assert verdict is not None
    return verdict


def create(store, ledger_id: int, owner: str) -> None:
    metadata = LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1,
                              ensembles={0: ("127.0.0.1:1",)}, owner=owner)
    store.create(ledger_key(ledger_id), metadata.to_bytes())


def test_a_ledger_nobody_created_is_refused_as_missing(access):
    assert decided(access, MALLORY, 77, "write", time.monotonic()) == NO_LEDGER


def test_a_squatters_miss_does_not_refuse_the_writer_of_a_ledger_created_after_it(access, store):
    assert decided(access, MALLORY, 78, "write", time.monotonic()) == NO_LEDGER
    create(store, 78, ALICE)
    # ALICE's add arrives after the ledger exists: the earlier miss must not answer it.
    assert decided(access, ALICE, 78, "write", time.monotonic()) == ALLOW
    assert decided(access, MALLORY, 78, "write", time.monotonic()) == DENY


def test_only_the_owner_may_use_an_owned_ledger_and_unknown_principals_nothing(access, store):
    create(store, 79, ALICE)
    now = time.monotonic()
    assert decided(access, ALICE, 79, "write", now) == ALLOW
    assert decided(access, MALLORY, 79, "read", now) == DENY
    assert access.decide("c3" * 32, 79, "read", now) == DENY          # not on the allow-list
    assert access.decide(None, 79, "read", now) == DENY


def test_a_revoked_principal_is_refused_at_once(access, store):
    create(store, 80, ALICE)
    assert decided(access, ALICE, 80, "write", time.monotonic()) == ALLOW
    security.disallow(store, ALICE)
    wait_until(lambda: access.decide(ALICE, 80, "write", time.monotonic()) == DENY, 10, "revocation")


@pytest.mark.parametrize("value", [b'{"ledger_id": 79, "from_a_newer_walkit": 1}', b"not json", b'{"disks": 5}'])
def test_metadata_it_cannot_read_is_unreadable_not_missing(access, store, value):
    """NO_SUCH_LEDGER would tell a recovering client this bookie holds nothing of the ledger;
    metadata a bookie cannot decode says nothing of the kind (it answers IO_ERROR instead)."""
    store.create(ledger_key(79), value)
    assert decided(access, ALICE, 79, "write", time.monotonic()) == UNREADABLE
    assert access.why_unreadable(79)
