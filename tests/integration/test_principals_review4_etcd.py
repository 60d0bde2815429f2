"""Adversarial review 4 of etcd principal mode (setup: test_etcd_principals). Each test fails while its hole exists.

A ledger belonged to a log by name alone (walkit.permissions.log_of), so whoever owned the log of that name governed
it. Ledgers of a deleted log that its deletion did not delete (dropped from its list by a write grantee, or the
log's key deleted alone by an admin grantee) passed, with their data, to the next owner of the name: the grantee.
Closed: a ledger belongs to the instance of its log it was made for (LogMetadata.holds), and the reaper's and the
agent's deletion of a log deletes its ledgers.
"""

from __future__ import annotations


import pytest

from walkit.core.loglist import LogMetadata

from .helpers import read_within
from .test_etcd_principals import alice, ask, env, mallory  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def _alices_log(alice, name: str) -> int:
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice's secret")
        return LogMetadata.from_bytes(client.store.get(f"logs/{name}")[0]).ledger_ids[0]


def _read_as_next_owner(mallory, name: str, ledger: int):
    with mallory.client() as client:
        # The name is free: mallory's log now (made before she writes a ledger of it, so that the bookies look the
        # log's owner up again: they cache it per ledger until the grants change).
        client.store.create(f"logs/{name}", LogMetadata(name=name, owner=mallory.id).to_bytes())
        return read_within(client, ledger)


def test_etcd_review4_a_write_grantee_unlists_a_ledger_and_reads_it_as_owner_of_the_next_log_of_that_name(
        env, alice, mallory):
    name = "unlisted"
    hidden = _alices_log(alice, name)
    env.walkit("acl", "grant", mallory.id, "write", "log", name)
    with mallory.client() as client:                 # through the agent: dropping ledgers is what truncation does
        value, version = client.store.get(f"logs/{name}")
        client.store.put(f"logs/{name}", LogMetadata.from_bytes(value).without({hidden}).to_bytes(), version)
    with alice.client() as client:
        client.delete_log(name)                      # alice deletes her log (and with it mallory's grant)
    read = _read_as_next_owner(mallory, name, hidden)
    assert not read or not any(b"alice's secret" in r for r in read), (
        f"mallory read ledger {hidden} of alice's deleted log through the next log of that name: {read}")
    with alice.client() as client:                   # the ledger its log's deletion missed stays its owner's
        assert read_within(client, hidden) == [b"alice's secret"]


def test_etcd_review4_an_admin_grantee_deletes_only_the_logs_key_and_owns_its_ledgers_as_the_next_logs_owner(
        env, alice, mallory):
    name = "usurped"
    ledger = _alices_log(alice, name)
    env.walkit("acl", "grant", mallory.id, "admin", "log", name)
    answer = ask(mallory, {"op": "delete", "key": f"logs/{name}", "version": -1, "nonce": "usurp"})
    read = _read_as_next_owner(mallory, name, ledger)
    assert not read or not any(b"alice's secret" in r for r in read), (
        f"a former admin grantee ({answer}) owns alice's ledger {ledger} through the next log of that name: {read}")
