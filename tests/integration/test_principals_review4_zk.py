"""Adversarial review 4 of ZooKeeper principal mode. Each test fails while its hole exists.

1. A principal with no grant plants ``logs/<name>`` (a write point every principal creates in) with a value
   naming *another* principal as owner and an ACL of its own choosing that keeps write for itself. The named
   owner's client saw a log that is its own, wrote into it, and the planter rewrote it at will. Closed: the
   owner's store checks its log's ACL (Policy.check_own_log; a broken-rule twin shows what it stops).
2. A write grantee remakes a replicated name's znode with an ACL that leaves the cluster read and delete
   (so `_replace` would fix it) but pins it with a child: `_replace` gives up on a znode with children, and the
   revoked grantee keeps writing it.
3. A write grantee drops one of the owner's ledgers from the log's list (a put request: removals are not
   checked). Revocation's pass and the owner's `delete_log` only touch listed ledgers, so the ledger stays
   (data, no deletion marker, and its ZooKeeper ACL still reading the grantee); once the log is deleted its
   grants go, and the grantee creates the next log of that name, whose owner governed every ledger naming it.
   Closed: a ledger belongs to the instance of its log it was made for (LogMetadata.holds).
4. The same with an admin grant and no unlisting: the grantee has the reaper delete the log's key alone (not
   through delete_log, which would delete the ledgers too) and creates the next log of that name.
"""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, Id, Permissions

from walkit.core.loglist import LogMetadata
from walkit.errors import MetadataNotAuthorized

from .principal_attacks import zk_cluster, zk_digest
from .helpers import read_within
from .test_zookeeper_principals import alice, env, mallory  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def _plant(mallory, alice, name: str) -> bytes:
    """_plant creates logs/NAME as mallory, naming alice as its owner, with an ACL that keeps write for mallory."""
    planted = LogMetadata(name=name, owner=alice.id).to_bytes()
    alice_id = json.loads(mallory.raw.get(mallory.path(f"security/clients/{alice.id}"))[0])["zookeeper"]
    # `logs` is a write point: any allowed principal creates there, with the ACL it likes.
    mallory.raw.create(mallory.path(f"logs/{name}"), planted,
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", zk_digest(mallory))),
                                                ACL(Permissions.ALL, Id("digest", alice_id))])
    return planted


def test_zk_review4_a_principal_plants_a_log_naming_another_owner_and_its_owner_refuses_it(env, alice, mallory):
    _plant(mallory, alice, "planted")
    with alice.client() as client:
        with pytest.raises(MetadataNotAuthorized, match="not made by it"):
            client.open_log("planted")
        with pytest.raises(MetadataNotAuthorized, match="not made by it"):
            list(client.read_log("planted"))


def test_zk_review4_a_log_planted_with_walkits_own_acl_and_a_config_of_its_planters_is_refused(env, alice, mallory):
    # The planter keeps no right on it, but chose its config: a retention of a second would have alice's own writer
    # delete her records. Nothing in the ACL tells it from alice's; the witness only alice's store can make does.
    from walkit.core.loglist import LogConfig
    planted = LogMetadata(name="configured", owner=alice.id, config=LogConfig(retention_age_s=1)).to_bytes()
    alice_id = json.loads(mallory.raw.get(mallory.path(f"security/clients/{alice.id}"))[0])["zookeeper"]
    mallory.raw.create(mallory.path("logs/configured"), planted,
                       acl=zk_cluster(mallory) + [ACL(Permissions.ALL, Id("digest", alice_id))])
    with pytest.raises(NoAuthError):
        mallory.raw.create(mallory.path(f"log-owners/{alice.id}/configured"), b"")    # alice's witness: hers alone
    with alice.client() as client:
        with pytest.raises(MetadataNotAuthorized, match="no witness"):
            client.open_log("configured")


def test_zk_review4_broken_rule_an_owner_that_trusts_a_planted_log_loses_what_it_wrote(env, alice, mallory,
                                                                                         monkeypatch):
    from walkit.plugins.metadata.zookeeper_principals import Policy
    monkeypatch.setattr(Policy, "check_own_log", lambda *args: None)
    planted = _plant(mallory, alice, "trusted")
    with alice.client() as client:
        with client.open_log("trusted") as log:        # "her" log: the value names her as its owner
            log.append(b"alice's secret")
    mallory.raw.set(mallory.path("logs/trusted"), planted)   # alice's ledgers dropped from her log
    with alice.client() as client:
        assert list(client.read_log("trusted")) == []


def _pin_attempt(env, alice, mallory, name: str, grant, revoke) -> list[str]:
    """_pin_attempt: alice's replicated name with a snapshot pointer; mallory, granted write, tries to make the
    pointer again with an ACL of its own and pin it with children, then to write it after the revocation. It
    returns the steps ZooKeeper let her do."""
    from walkit.replication.snapshots import SnapshotPointer, pointer_key, publish
    from walkit.core.loglist import Position
    with alice.client() as client:
        with client.open_log(f"replicated-{name}") as log:
            log.append(b"x")
        publish(client.store, name, SnapshotPointer(ledger_id=1, position=Position(0, 0), size=0))
    grant()
    path = mallory.path(pointer_key(name))
    own = [ACL(Permissions.ALL, Id("digest", zk_digest(mallory)))]
    steps = {
        "delete": lambda: mallory.raw.delete(path),
        # The cluster may read and delete it (so _replace would remake it), but not set its ACL...
        "create": lambda: mallory.raw.create(path, b'{"alice": "pointer"}',
                                             acl=own + zk_cluster(mallory, Permissions.ALL & ~Permissions.ADMIN)),
        # ...and a child (its own: the cluster can neither list nor empty it) keeps _replace from remaking it.
        "pin": lambda: mallory.raw.create(f"{path}/pin", b"", acl=own),
        "pin deeper": lambda: mallory.raw.create(f"{path}/pin/pin", b"", acl=own),
    }
    done = []
    for step, attempt in steps.items():
        try:
            attempt()
            done.append(step)
        except (NoAuthError, NoNodeError):
            pass
    revoke()
    try:
        mallory.raw.set(path, b'{"mallory": "pointer"}')
        done.append("write after the revocation")
    except NoAuthError:
        pass
    return done


def test_zk_review4_a_write_grantee_can_neither_make_again_nor_pin_a_replicated_names_znode(env, alice, mallory):
    name = "pinned"
    done = _pin_attempt(env, alice, mallory, name,
                        lambda: env.walkit("acl", "grant", mallory.id, "write", "log", f"replicated-{name}"),
                        lambda: env.walkit("acl", "revoke", mallory.id, "log", f"replicated-{name}"))
    assert done == [], f"a write grantee of a replicated name did: {done}"


def test_zk_review4_broken_rule_grantees_that_create_and_delete_a_names_znodes_pin_them(env, alice, mallory,
                                                                                     monkeypatch):
    # The rule before: a name's writers held every right but admin on each of its znodes (create and delete too).
    from walkit.plugins.metadata import zookeeper_principals
    from walkit import security
    monkeypatch.setattr(zookeeper_principals, "_name_perms",
                        lambda rel, level: Permissions.READ if level == "read" else
                        Permissions.ALL & ~Permissions.ADMIN)
    name, operator = "pinned-before", env.operator

    def grant():
        security.grant(operator, mallory.id, "write", f"replicated-{name}")
        operator.refresh_acls(log=f"replicated-{name}")

    def revoke():
        security.revoke(operator, mallory.id, f"replicated-{name}")
        operator.refresh_acls(log=f"replicated-{name}")

    assert _pin_attempt(env, alice, mallory, name, grant, revoke) == [
        "delete", "create", "pin", "pin deeper", "write after the revocation"]


def test_zk_review4_a_write_grantee_unlists_a_ledger_and_reads_it_as_owner_of_the_next_log_of_that_name(
        env, alice, mallory):
    name = "unlisted"
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice's secret")
        metadata, version = client.store.get(f"logs/{name}")
    hidden = LogMetadata.from_bytes(metadata).ledger_ids[0]
    env.walkit("acl", "grant", mallory.id, "write", "log", name)
    with mallory.client() as client:                 # a put request: dropping ledgers is what truncation does
        value, version = client.store.get(f"logs/{name}")
        current = LogMetadata.from_bytes(value)
        client.store.put(f"logs/{name}", current.without({hidden}).to_bytes(), version)
    with alice.client() as client:
        client.delete_log(name)                      # alice deletes her log (and with it mallory's grant)
    read = None
    with mallory.client() as client:
        client.store.create(f"logs/{name}", LogMetadata(name=name, owner=mallory.id).to_bytes())  # hers now
        read = read_within(client, hidden)
    assert not read or not any(b"alice's secret" in r for r in read), (
        f"mallory read ledger {hidden} of alice's deleted log through the next log of that name: {read}")
    with alice.client() as client:                   # the ledger its log's deletion missed stays its owner's
        assert read_within(client, hidden) == [b"alice's secret"]


def test_zk_review4_an_admin_grantee_deletes_only_the_logs_key_and_owns_its_ledgers_as_the_next_logs_owner(
        env, alice, mallory):
    # An admin grant may delete the log; asked of the reaper directly (not through delete_log), only the key goes,
    # with the grants. The ledgers naming the log stay, with their data, and are governed by whoever owns the
    # next log of that name: the grantee, which now holds them as owner, beyond any revocation.
    name = "usurped"
    with alice.client() as client:
        with client.open_log(name) as log:
            log.append(b"alice's secret")
        ledger = LogMetadata.from_bytes(client.store.get(f"logs/{name}")[0]).ledger_ids[0]
    env.walkit("acl", "grant", mallory.id, "admin", "log", name)
    with mallory.client() as client:
        client.store.delete(f"logs/{name}")           # the log's key alone
        # The next log of that name, hers (made before she writes a ledger of it, so that the bookies look the
        # log's owner up again: they cache it per ledger until the grants change).
        client.store.create(f"logs/{name}", LogMetadata(name=name, owner=mallory.id).to_bytes())
        read = read_within(client, ledger)
    assert not read or not any(b"alice's secret" in r for r in read), (
        f"a former admin grantee owns alice's ledger {ledger} through the next log of that name: {read}")
