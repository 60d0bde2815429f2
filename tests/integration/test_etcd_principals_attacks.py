"""Attacks on etcd's principal mode by one allowed principal with its own etcd credentials (and its key).

Each test asserts the safe behaviour: it fails while the hole it shows exists. The setup (a real
etcd with authentication, three secured bookies running the agent) is test_etcd_principals'.
"""

from __future__ import annotations

import base64
import json

import pytest

from walkit.core.metadata import deleted_key, ledger_key
from walkit.errors import MetadataError, MetadataNotAuthorized, PermissionDenied
from walkit.plugins.metadata.etcd_principals import REQUESTS

from .test_etcd_principals import (Principal, Raw, _b64, a_log_with_a_ledger, alice, ask, env, mallory,  # noqa: F401
                                   refused, role_keys)

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def again(attempt, *args, **kwargs):
    """again runs a raw etcd call, again while etcd says it was checked against roles that changed meanwhile (it
    was not applied: the agents change roles all the time)."""
    from .test_etcd_principals import Refused
    for _ in range(50):
        try:
            return attempt(*args, **kwargs)
        except Refused as exc:
            if "revision of auth store is old" not in str(exc):
                raise
    return attempt(*args, **kwargs)


def test_attack_a_forged_ledger_id_in_ones_own_ledger_has_the_agent_mark_anothers_ledger_deleted(env, alice, mallory):
    """(b) The agent's delete checks the permission on the *value* of the key it deletes and writes the marker of
    the id that value names, without checking that it is the key's id. mallory may write any value into her own
    ledger's key, so she names alice's ledger in it and asks for her own ledger's deletion."""
    _, victim = a_log_with_a_ledger(alice, "marked")
    with mallory.client() as client:
        own = client.create_ledger(3, 2, 2, password=b"pw")
        own.append(b"mine")
        own.close()
    key = ledger_key(own.ledger_id)
    doc = json.loads(again(mallory.raw.get, key))
    doc["ledger_id"] = victim                                # her own key: her role may write it
    again(mallory.raw.put, key, json.dumps(doc).encode())
    answer = again(ask, mallory, {"op": "delete", "key": key, "version": -1})
    assert again(mallory.raw.get, deleted_key(victim)) is None, (
        f"the agent wrote alice's ledger {victim}'s deletion marker for mallory (answer {answer}); bookies drop "
        f"its data once its key goes")
    assert again(alice.raw.get, ledger_key(victim)) is not None


def test_attack_a_request_key_with_an_empty_nonce_stops_every_agent_for_the_principals_after_it(env):
    """(d) ``principal-requests/<attacker>/`` (the prefix itself, which the attacker's role may write) lists as a
    request with an empty name; its key fails check_key (ConfigError, not a MetadataError), and the agent's
    fallback (`_answer`) fails the same way inside the except clause, so scan() raises on every bookie, every
    time, before it reaches the principals sorted after the attacker."""
    first, second = env.principal("empty-nonce-1"), env.principal("empty-nonce-2")
    attacker, victim = sorted((first, second), key=lambda p: p.id)
    wedge = f"{REQUESTS}/{attacker.id}/"
    assert again(ask, victim, {"op": "sync", "key": "logs/not-there", "nonce": "before-the-wedge"}) == {"synced": True}
    again(attacker.raw.call, "/kv/put", {"key": attacker.raw.key(wedge), "value": _b64(b"{}")})
    try:
        assert again(ask, victim, {"op": "sync", "key": "logs/not-there", "nonce": "after-the-wedge"}) == {"synced": True}
        with victim.client() as client:
            client.create_ledger(3, 2, 2, password=b"pw").close()
    finally:
        again(attacker.raw.call, "/kv/deleterange", {"key": attacker.raw.key(wedge)})
        again(victim.raw.delete, f"{REQUESTS}/{victim.id}/after-the-wedge")


def test_attack_a_request_whose_refusal_is_too_large_for_etcd_stops_every_agent_for_the_principals_after_it(env):
    """(d) The same wedge through a well-formed key: the refusal of an invalid request quotes the attacker's
    text (`not a valid request: ...{op!r}`), which repr() and json.dumps() blow up 5 times for bytes like 0x7f.
    A 1 MB request (under etcd's 1.5 MiB limit) gets a 5 MB answer, etcd refuses the put, and that MetadataError
    leaves scan() from inside its except clause, on every bookie, every time."""
    first, second = env.principal("big-answer-1"), env.principal("big-answer-2")
    attacker, victim = sorted((first, second), key=lambda p: p.id)
    assert again(ask, victim, {"op": "sync", "key": "logs/not-there", "nonce": "before-the-big-one"}) == {"synced": True}
    wedge = f"{REQUESTS}/{attacker.id}/0"
    again(attacker.raw.put, wedge, json.dumps({"op": "\x7f" * 1_000_000, "key": "logs/x"}, ensure_ascii=False).encode())
    try:
        assert again(ask, victim, {"op": "sync", "key": "logs/not-there", "nonce": "after-the-big-one"}) == {"synced": True}
    finally:
        again(attacker.raw.delete, wedge)
        again(victim.raw.delete, f"{REQUESTS}/{victim.id}/after-the-big-one")


def test_attack_a_write_grantee_makes_itself_the_logs_owner_and_keeps_it_after_the_revocation(env, alice, mallory):
    """(a) A log's owner is in its value: a `write` grantee that could rewrite it would hold the log as its owner,
    also after the revocation. Its role never holds the key (only the owner's does): its changes go through the
    agent, which refuses a change of the owner."""
    a_log_with_a_ledger(alice, "seized")
    env.walkit("acl", "grant", mallory.id, "write", "log", "seized")
    doc = json.loads(again(mallory.raw.get, "logs/seized"))
    doc["owner"] = mallory.id
    forged = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    refused(lambda: again(mallory.raw.put, "logs/seized", forged))
    with mallory.client() as client:
        with pytest.raises(MetadataNotAuthorized, match="only its owner changes"):
            client.store.put("logs/seized", forged, client.store.get("logs/seized")[1])
    env.walkit("acl", "revoke", mallory.id, "log", "seized")
    assert "logs/seized" in role_keys(env, alice) and "logs/seized" not in role_keys(env, mallory)
    assert json.loads(again(alice.raw.get, "logs/seized"))["owner"] == alice.id
    assert again(ask, mallory, {"op": "delete", "key": "logs/seized", "version": -1})["error"] == "denied"


def test_attack_a_write_grantee_makes_itself_a_ledgers_owner_and_reads_it_after_the_revocation(env, alice, mallory):
    """(a)/(e) The same with a ledger of the log: a grantee that wrote itself in as the ledger's owner (and dropped
    its log) would read alice's entries after the revocation. Refused directly and through the agent."""
    log_ledger, _ = a_log_with_a_ledger(alice, "seized-ledger")
    env.walkit("acl", "grant", mallory.id, "write", "log", "seized-ledger")
    key = ledger_key(log_ledger)
    doc = json.loads(again(mallory.raw.get, key))
    doc["owner"] = mallory.id
    doc["custom"] = {}
    forged = json.dumps(doc).encode()
    refused(lambda: again(mallory.raw.put, key, forged))
    with mallory.client() as client:
        with pytest.raises(MetadataNotAuthorized, match="only its owner changes"):
            client.store.put(key, forged, client.store.get(key)[1])
    env.walkit("acl", "revoke", mallory.id, "log", "seized-ledger")
    with mallory.client() as client:
        with pytest.raises((PermissionDenied, MetadataError)):
            list(client.open_ledger(log_ledger, password=b"").read())


def _log_value(template: bytes, name: str, owner: str) -> bytes:
    doc = json.loads(template)
    doc.update(name=name, owner=owner, segments=[], truncated_to=-1)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def test_attack_a_key_deleted_directly_keeps_its_permission_and_takes_over_the_next_log_of_that_name(
        env, alice, mallory):
    """(a) A holder may delete its key directly (documented), but its role keeps readwrite on the key, which
    nothing ever revokes (sync_all walks existing keys only). When alice later has the agent create a log of
    that name, the agent creates the key, then reads its value again to compute the holders: mallory, who
    overwrites the key the moment it exists, is read back as its owner, keeps the key, and alice gets nothing."""
    import threading
    a_log_with_a_ledger(alice, "template")
    template = again(alice.raw.get, "logs/template")
    won = []
    for attempt in range(12):
        name = f"reborn-{attempt}"
        key = f"logs/{name}"
        assert "version" in again(ask, mallory, {"op": "create", "key": key,
                                          "value": _b64(_log_value(template, name, mallory.id)), "nonce": name})
        again(mallory.raw.delete, key)                          # directly: her role keeps the key
        stop = threading.Event()
        mine = _b64(_log_value(template, name, mallory.id))

        def overwrite() -> None:
            while not stop.is_set():
                try:
                    done = mallory.raw.call("/kv/txn", {
                        "compare": [{"key": mallory.raw.key(key), "result": "GREATER", "target": "CREATE",
                                     "create_revision": "0"}],
                        "success": [{"request_put": {"key": mallory.raw.key(key), "value": mine}}]})
                except Exception as exc:                 # noqa: BLE001 - revoked meanwhile: lost this one
                    if "auth store is old" in str(exc):
                        continue
                    return
                if done.get("succeeded"):
                    return
        spinner = threading.Thread(target=overwrite)
        spinner.start()
        try:
            answer = again(ask, alice, {"op": "create", "key": key, "value": _b64(_log_value(template, name, alice.id)),
                                 "nonce": name})
        finally:
            stop.set()
            spinner.join()
        assert "version" in answer, answer                 # alice's log was created
        if key in role_keys(env, mallory):
            won.append((name, json.loads(again(alice.raw.get, key))["owner"] == mallory.id, key in role_keys(env, alice)))
    assert not won, f"mallory took over alice's new logs {won}: her role holds their keys ((name, owner is mallory, alice holds it))"


def test_attack_a_ledger_key_deleted_directly_leaves_no_key_in_the_role_and_the_counter_cannot_be_wound_back(
        env, alice, mallory):
    """(e) The ledger form of the stale permission: mallory has the agent create ledger M and deletes its key
    directly (no marker, documented). Winding the ledger id counter back to M, so that alice's next ledger is M
    while mallory's role still holds its key, is refused: ids are the agent's to draw. The operator's next pass
    takes the dead key from her role."""
    with mallory.client() as client:
        own = client.create_ledger(3, 2, 2, password=b"pw")
        own.close()
    key = ledger_key(own.ledger_id)
    assert key in role_keys(env, mallory)
    again(mallory.raw.delete, key)                                        # directly: no marker
    refused(lambda: again(mallory.raw.put, ".counters/ledger-id", str(own.ledger_id).encode()))
    with alice.client() as client:
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        assert writer.ledger_id > own.ledger_id
        writer.close()
    env.walkit("acl", "grant", alice.id, "read", "log", "anything")       # any operator pass: roles re-synced
    from walkit.plugins.metadata.etcd_principals import sync_all
    sync_all(env.operator)
    assert key not in role_keys(env, mallory)
