"""Adversarial review 2 of etcd principal mode (setup: test_etcd_principals). Each test fails while its hole exists."""

from __future__ import annotations

import json

import pytest

from walkit.core.loglist import LogMetadata, LogSegment
from walkit.core.metadata import ledger_key
from walkit.errors import MetadataError, NoSuchKey

from .test_etcd_principals import a_log_with_a_ledger, alice, ask, env, mallory, role_keys  # noqa: F401
from .test_etcd_principals_attacks import again

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def test_etcd_review2_a_write_grantee_cannot_splice_another_ledger_into_the_log_for_the_owner_to_delete(
        env, alice, mallory):
    # check_change keeps a log's name and owner, but not which ledgers it lists: a grantee may list any ledger
    # (through the agent's put), and delete_log (the owner's) then deletes every listed ledger the owner may.
    _, lone = a_log_with_a_ledger(alice, "splice")                   # `lone`: alice's ledger of no log
    env.walkit("acl", "grant", mallory.id, "write", "log", "splice")
    spliced = False
    with mallory.client() as client:
        value, version = client.store.get("logs/splice")
        forged = LogMetadata.from_bytes(value).with_segment(
            LogSegment(ledger_id=lone, created_ms=1, last_entry_id=0, entries=1, size=7, closed_ms=1))
        try:
            client.store.put("logs/splice", forged.to_bytes(), version)
            spliced = True
        except MetadataError:
            pass
    problems = []
    with alice.client() as client:
        if spliced and [bytes(r.payload) for r in client.read_log("splice")] != [b"secret"]:
            problems.append("a grantee spliced the owner's private ledger into the log (its reads return it)")
        client.delete_log("splice")
        try:
            client.store.get(ledger_key(lone))
        except NoSuchKey:
            problems.append("deleting the log deleted a ledger of no log that a grantee listed in it")
    assert not problems, problems


@pytest.mark.parametrize("which", ["ledger", "log"])
def test_etcd_review2_a_create_request_for_an_existing_key_does_not_take_it_from_its_owners_role(
        env, alice, mallory, which):
    # The agent claims a creation and takes the key from every role *before* it finds the key exists; the
    # answer "exists" gives nobody the key back, so the owner's role loses its own ledger or log.
    name = f"stripped-{which}"
    log_ledger, _ = a_log_with_a_ledger(alice, name)
    key = ledger_key(log_ledger) if which == "ledger" else f"logs/{name}"
    assert key in again(role_keys, env, alice)
    doc = json.loads(again(alice.raw.get, key))
    doc["owner"] = mallory.id
    if which == "ledger":
        doc.get("custom", {}).pop("log", None)                       # a ledger of no log: no grant checked
    answer = again(ask, mallory, {"op": "create", "key": key,
                                  "value": __import__("base64").b64encode(json.dumps(doc).encode()).decode()})
    assert answer.get("error") == "exists", answer
    assert key in again(role_keys, env, alice), f"mallory's failed create took {key} from alice's role"
