"""Adversarial review 3 of etcd principal mode (setup: test_etcd_principals). Each test fails while its hole exists."""

from __future__ import annotations

import pytest

from walkit.core.loglist import LogMetadata

from .test_etcd_principals import alice, env, mallory  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.servers]


@pytest.fixture(scope="module")
def bob(env):
    return env.principal("bob")


def test_etcd_review3_a_grant_on_a_deleted_log_is_not_a_grant_on_the_next_log_of_that_name(env, alice, mallory, bob):
    # Grants live at security/acl/logs/<name>/<principal>, keyed by the name alone; deleting a log leaves them,
    # so a principal one owner granted holds that level on the log another owner creates later under the name.
    with alice.client() as client:
        with client.open_log("reused") as log:
            log.append(b"alice's")
    env.walkit("acl", "grant", mallory.id, "write", "log", "reused")
    with alice.client() as client:
        client.delete_log("reused")
    with bob.client() as client:
        with client.open_log("reused") as log:        # bob's log, never granted to anyone
            log.append(b"bob's secret")
    problems = []
    with mallory.client() as client:
        try:
            problems.append(f"mallory read bob's log: {[bytes(r.payload) for r in client.read_log('reused')]}")
        except Exception:  # noqa: BLE001 - refused: held
            pass
        value, version = client.store.get("logs/reused")
        try:                                           # through the agent: its check reads the stale grant
            client.store.put("logs/reused", LogMetadata.from_bytes(value).without(
                set(LogMetadata.from_bytes(value).ledger_ids)).to_bytes(), version)
            problems.append("mallory emptied bob's log through the agent")
        except Exception:  # noqa: BLE001 - refused: held
            pass
    assert not problems, problems
