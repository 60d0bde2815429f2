"""The agent of etcd's principal mode, in this process, against a real etcd with authentication (issue 47 item 1).

Each rule the agent keeps (walkit.plugins.metadata.etcd_principals) has a broken-rule twin here: an
agent without the rule, shown doing the harm the rule stops, beside the real agent refusing it.
No bookies: the agent runs on the operator's store, and principals' stores ask it as clients do.
"""

from __future__ import annotations

import threading

import pytest

from walkit import security
from walkit.core.loglist import LogMetadata
from walkit.core.metadata import LedgerMetadata, deleted_key, ledger_key
from walkit.errors import MetadataNotAuthorized, NodeExists, NoSuchKey
from walkit.plugins import open_metadata
from walkit.plugins.metadata import etcd_principals
from walkit.plugins.metadata.etcd_principals import Agent
from walkit.testing.servers import SecuredEtcdServer, etcd_missing, with_user

from tests.conftest import fresh_root

pytestmark = [pytest.mark.slow, pytest.mark.servers]

ROOT_PASSWORD = "root-s3cret"
ALICE, MALLORY = "a" * 64, "b" * 64


class NoMarkerGuard(Agent):
    """NoMarkerGuard creates ledgers without looking for their deletion marker (the broken rule)."""

    def _create(self, *args):
        original = etcd_principals.deleted_key
        etcd_principals.deleted_key = lambda ledger_id: f"unused-guard/{ledger_id}"
        try:
            return super()._create(*args)
        finally:
            etcd_principals.deleted_key = original


class NoDeleteCheck(Agent):
    """NoDeleteCheck deletes whatever a principal asks, without walkit's permission check (the broken rule)."""

    def _delete(self, *args):
        original = etcd_principals.permissions.check_ledger
        etcd_principals.permissions.check_ledger = lambda *args: None
        try:
            return super()._delete(*args)
        finally:
            etcd_principals.permissions.check_ledger = original


@pytest.fixture(scope="module")
def etcd():
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with SecuredEtcdServer(ROOT_PASSWORD) as server:
        yield server


@pytest.fixture
def cluster(etcd, tmp_path):
    """cluster: a fresh root, its operator's store (etcd's root), and alice and mallory with etcd users."""
    root = fresh_root()
    operator = open_metadata(with_user(etcd.url(root, timeout=5), "root", ROOT_PASSWORD))
    stores = {}
    try:
        for principal in (ALICE, MALLORY):
            security.allow(operator, principal, principal[:1])
            operator.principal_identity(principal, f"pw-{principal[:1]}")
            stores[principal] = open_metadata(with_user(etcd.url(root, timeout=5), principal, f"pw-{principal[:1]}"))
        yield operator, stores[ALICE], stores[MALLORY]
    finally:
        for store in stores.values():
            store.close()
        operator.close()


def ledger(ledger_id: int, owner: str) -> bytes:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
                          ensembles={0: ("b1", "b2", "b3")}, owner=owner).to_bytes()


def serving(agent_class, operator):
    """serving runs `agent_class` on the operator's store (it watches the requests) until the block ends."""
    class Running:
        def __enter__(self):
            self.agent = agent_class(operator)
            return self.agent

        def __exit__(self, *exc):
            self.agent.close()
    return Running()


def reuses_a_deleted_id(agent_class, operator, alice) -> bool:
    """reuses_a_deleted_id deletes a ledger of alice's, then has `agent_class` serve alice's creation of that id."""
    with serving(agent_class, operator):
        alice.create(ledger_key(7), ledger(7, ALICE))
        alice.delete(ledger_key(7))
        assert operator.get(deleted_key(7))
        try:
            alice.create(ledger_key(7), ledger(7, ALICE))
            return True
        except NodeExists:
            return False


def test_a_ledger_id_whose_deletion_marker_exists_is_not_created_again(cluster):
    assert reuses_a_deleted_id(Agent, *cluster[:2]) is False


def test_broken_rule_an_agent_that_ignores_deletion_markers_creates_a_deleted_id_again(cluster):
    assert reuses_a_deleted_id(NoMarkerGuard, *cluster[:2]) is True


def marks_anothers_ledger(agent_class, operator, alice, mallory) -> bool:
    """marks_anothers_ledger has mallory ask `agent_class` to delete alice's ledger; True if a marker came of it."""
    with serving(agent_class, operator):
        alice.create(ledger_key(9), ledger(9, ALICE))
        try:
            mallory.delete(ledger_key(9))
        except MetadataNotAuthorized:
            pass
        try:
            operator.get(deleted_key(9))
            return True
        except NoSuchKey:
            return False


def test_a_principal_cannot_have_another_principals_ledger_marked_deleted(cluster):
    assert marks_anothers_ledger(Agent, *cluster) is False


def test_broken_rule_an_agent_that_skips_the_permission_check_marks_anothers_ledger(cluster):
    assert marks_anothers_ledger(NoDeleteCheck, *cluster) is True


def test_a_principal_store_without_an_agent_fails_after_its_timeout_saying_why(cluster):
    _, alice, _ = cluster
    alice.timeout = 0.5
    with pytest.raises(Exception, match="no answer within 0.5 s from the agent"):
        alice.create(ledger_key(11), ledger(11, ALICE))
    assert alice.children(f"{etcd_principals.REQUESTS}/{ALICE}") == []          # its request is taken back


def test_racing_agents_create_a_ledger_once_and_answer_once(cluster):
    operator, alice, _ = cluster
    agents = [Agent(operator) for _ in range(3)]
    try:
        versions = []
        threads = [threading.Thread(target=lambda i=i: versions.append(alice.create(ledger_key(20 + i),
                                                                                     ledger(20 + i, ALICE))))
                   for i in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(versions) == 5
        for i, version in enumerate(sorted(versions)):
            assert operator.get(ledger_key(20 + i))[1] in versions
        for i in range(5):                          # alice's role holds every one of them
            value, version = alice.get(ledger_key(20 + i))
            alice.put(ledger_key(20 + i), value, version)
    finally:
        for agent in agents:
            agent.close()


def test_the_first_principal_to_sync_a_replicated_name_without_a_log_claims_it(cluster):
    operator, alice, mallory = cluster
    with serving(Agent, operator):
        alice.create("elections/replication/tally/leader", b"alice")        # refused, synced, claimed, made
        with pytest.raises(MetadataNotAuthorized):
            mallory.put("elections/replication/tally/leader", b"mallory", alice.get("elections/replication/tally/leader")[1])
        with pytest.raises(MetadataNotAuthorized, match="claimed by another principal"):
            mallory.create("logs/replicated-tally", LogMetadata(name="replicated-tally", owner=MALLORY).to_bytes())
        alice.create("logs/replicated-tally", LogMetadata(name="replicated-tally", owner=ALICE).to_bytes())
