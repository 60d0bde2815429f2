"""Per-principal ZooKeeper identities (issue 47 item 1): ZooKeeper itself holds walkit's permissions.

A real ZooKeeper server, three secured bookies (which carry out deletions: walkit.plugins.metadata.zookeeper_reaper.Reaper),
and principals that connect to ZooKeeper as themselves (walkit.plugins.metadata.zookeeper_principals).
Each test tries what an adversary holding a principal's own ZooKeeper credentials would: straight
through kazoo, past walkit's own checks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions

import walkit
from walkit import security
from walkit.client.log import read_log_metadata
from walkit.core.metadata import deleted_key, ledger_key
from walkit.errors import ConfigError, MetadataError, PermissionDenied
from walkit.local import LocalCluster
from walkit.plugins import open_metadata
from walkit.plugins.metadata.zookeeper_reaper import Reaper
from walkit.testing.servers import with_user

from tests.conftest import fresh_root

from .helpers import wait_until

pytestmark = pytest.mark.slow

USER, PASSWORD = "walkit", "cluster-s3cret"


class Principal:
    """Principal is a key pair with a ZooKeeper identity of its own: its walkit Client, and raw kazoo as itself."""

    def __init__(self, env, name: str) -> None:
        self.env = env
        _, self.key = security.new_keys(str(env.tmp), name)
        self.id = security.principal_of(self.key)
        self.password_file = env.tmp / f"{name}.zk"
        env.walkit("clients", "allow", self.id, "--name", name, "--metadata-password-file", str(self.password_file))
        self.password = self.password_file.read_text().strip()
        self.url = with_user(env.zk.url(env.root, timeout=10), self.id) + f"&password_file={self.password_file}"
        self.raw = KazooClient(hosts=env.zk.address, auth_data=[("digest", f"{self.id}:{self.password}")])
        self.raw.start(timeout=10)

    def client(self) -> walkit.Client:
        return walkit.Client(self.url, key=self.key, timeout=10, add_timeout=3, request_timeout=3)

    def path(self, key: str) -> str:
        return f"{self.env.root}/{key}"

    def close(self) -> None:
        self.raw.stop()
        self.raw.close()


class Env:
    def __init__(self, zk, tmp) -> None:
        self.zk, self.tmp, self.root = zk, tmp, fresh_root()
        self.cluster_url = with_user(zk.url(self.root, timeout=10), USER, PASSWORD)
        self.cluster = LocalCluster(bookies=3, data_dir=str(tmp / "cluster"), storage="memory",
                                    metadata=self.cluster_url, security=True)
        self.operator = open_metadata(self.cluster_url)
        self.principals: list[Principal] = []

    def walkit(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "walkit", *args, "--metadata", self.cluster_url],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def principal(self, name: str) -> Principal:
        self.principals.append(Principal(self, name))
        return self.principals[-1]

    def close(self) -> None:
        for principal in self.principals:
            principal.close()
        self.operator.close()
        self.cluster.close()


@pytest.fixture(scope="module")
def env(zk_server, tmp_path_factory):
    env = Env(zk_server, tmp_path_factory.mktemp("principals"))
    try:
        yield env
    finally:
        env.close()


@pytest.fixture(scope="module")
def alice(env):
    return env.principal("alice")


@pytest.fixture(scope="module")
def mallory(env):
    return env.principal("mallory")


def a_log_with_a_ledger(principal: Principal, name: str) -> tuple[int, int]:
    """a_log_with_a_ledger writes log `name` and a ledger of no log as `principal`; it returns both ledgers' ids."""
    with principal.client() as client:
        with client.open_log(name) as log:
            log.append(b"secret")
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        writer.append(b"private")
        writer.close()
        return read_log_metadata(client.store, name)[0].ledger_ids[0], writer.ledger_id


def digest_of(principal: Principal) -> str:
    """digest_of is the hash part of a principal's ZooKeeper digest identity."""
    from walkit.plugins.metadata.zookeeper_principals import digest_id
    return digest_id(principal.id, principal.password).partition(":")[2]


def refused(*attempts) -> None:
    for i, attempt in enumerate(attempts):
        with pytest.raises(NoAuthError):
            try:
                attempt()
            except NoNodeError as exc:
                raise AssertionError(f"attempt {i}: NoNode {exc}") from exc


def test_zk_a_principal_cannot_read_change_or_delete_anothers_log_or_ledger_with_its_own_credentials(
        env, alice, mallory):
    log_ledger, lone = a_log_with_a_ledger(alice, "orders")
    raw = mallory.raw
    for key in ("logs/orders", ledger_key(log_ledger), ledger_key(lone)):
        refused(lambda: raw.get(mallory.path(key)),
                lambda: raw.set(mallory.path(key), b"{}"),
                lambda: raw.delete(mallory.path(key)),
                lambda: raw.create(mallory.path(f"{key}/delete"), b"{}"),        # a deletion request
                lambda: raw.set_acls(mallory.path(key), OPEN_ACL_UNSAFE))
    refused(lambda: raw.create(mallory.path(deleted_key(lone)), b"{}"),           # would have bookies drop it
            lambda: raw.delete(mallory.path("security/clients/" + alice.id)),
            lambda: raw.set(mallory.path(f"security/clients/{mallory.id}"), b"{}"))
    # A forged deletion hint (no request under the ledger, which it may not make) and garbage ones are
    # dropped by the bookies' reaper, which keeps serving; the ledger stays.
    for hint in (ledger_key(lone).replace("/", "|"), "..|security", "bookies|x", "logs|"):
        raw.create(mallory.path(f"deletion-requests/{hint}"), b"")
    wait_until(lambda: raw.get_children(mallory.path("deletion-requests")) == [], timeout=20,
               message="the reaper left forged deletion requests")
    assert alice.raw.exists(alice.path(ledger_key(lone))) is not None
    # Shared lists stay readable (bookie addresses, the allow-list) and changeable by the cluster alone.
    assert raw.get_children(mallory.path("bookies"))
    refused(lambda: raw.create(mallory.path("bookies/evil"), b""))
    # Through walkit: refused, by walkit's own check or by ZooKeeper when the metadata cannot even be read.
    with mallory.client() as client:
        for attempt in (lambda: client.delete_ledger(lone), lambda: client.truncate_ledger(lone, 1),
                        lambda: list(client.read_log("orders")), lambda: client.delete_log("orders")):
            with pytest.raises((PermissionDenied, MetadataError), match="not authorized|may not"):
                attempt()
    for args in (("log", "read", "orders"), ("log", "truncate", "orders", "--before", f"{log_ledger}:1"),
                 ("ledger", "delete", str(lone)), ("log", "delete", "orders")):
        refusal = subprocess.run([sys.executable, "-m", "walkit", "--key", mallory.key, *args, "--metadata", mallory.url],
                                 capture_output=True, text=True, timeout=120)
        assert refusal.returncode == 1 and ("not authorized" in refusal.stderr or "may not" in refusal.stderr), (
            args, refusal.stdout, refusal.stderr)
    with alice.client() as client:                     # untouched
        assert [bytes(r.payload) for r in client.read_log("orders")] == [b"secret"]


def test_zk_an_owner_cannot_delete_its_own_znodes_or_write_deletion_markers_directly(env, alice):
    _, lone = a_log_with_a_ledger(alice, "own-deletes")
    # Deleting a child needs delete on the parent, which no principal holds: one could delete them all.
    refused(lambda: alice.raw.delete(alice.path(ledger_key(lone))),
            lambda: alice.raw.delete(alice.path("logs/own-deletes")),
            lambda: alice.raw.create(alice.path(deleted_key(lone + 1000)), b"{}"))


def test_zk_an_owners_deletions_go_through_the_bookies_reaper(env, alice):
    log_ledger, lone = a_log_with_a_ledger(alice, "to-delete")
    with alice.client() as client:
        client.delete_ledger(lone)                      # returns once a bookie's reaper deleted it
        assert env.operator.children("ledgers").count(ledger_key(lone).rpartition("/")[2]) == 0
        client.delete_log("to-delete")
    for key in (ledger_key(lone), "logs/to-delete"):
        assert alice.raw.exists(alice.path(key)) is None, key
    marker = alice.raw.get(alice.path(deleted_key(lone)))[0]        # written by the reaper, readable by all
    assert json.loads(marker)["deleted_ms"] > 0
    assert alice.raw.get_children(alice.path("deletion-requests")) == []


def test_zk_a_grant_opens_the_znodes_at_once_and_its_revocation_closes_them(env, alice, mallory):
    log_ledger, _ = a_log_with_a_ledger(alice, "shared")
    refused(lambda: mallory.raw.get(mallory.path("logs/shared")))
    env.walkit("acl", "grant", mallory.id, "read", "log", "shared")
    assert mallory.raw.get(mallory.path("logs/shared"))[0]
    assert mallory.raw.get(mallory.path(ledger_key(log_ledger)))[0]
    refused(lambda: mallory.raw.set(mallory.path("logs/shared"), b"{}"),
            lambda: mallory.raw.create(mallory.path(f"{ledger_key(log_ledger)}/delete"), b"{}"))
    with mallory.client() as client:
        assert [bytes(r.payload) for r in client.read_log("shared")] == [b"secret"]
    read = subprocess.run([sys.executable, "-m", "walkit", "--key", mallory.key, "log", "read", "shared",
                           "--metadata", mallory.url], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0 and "secret" in read.stdout, read.stderr      # the CLI, as mallory, in ZooKeeper too
    env.walkit("acl", "revoke", mallory.id, "log", "shared")
    refused(lambda: mallory.raw.get(mallory.path("logs/shared")),
            lambda: mallory.raw.get(mallory.path(ledger_key(log_ledger))))


def test_zk_a_write_grant_lets_a_principal_roll_and_truncate_but_not_delete_the_log(env, alice, mallory):
    a_log_with_a_ledger(alice, "team")
    env.walkit("acl", "grant", mallory.id, "write", "log", "team")
    with mallory.client() as client:
        with client.open_log("team") as log:           # fences alice's ledger and starts its own
            log.append(b"from mallory")
            log.roll()
            log.append(b"after the roll")
        with pytest.raises(PermissionDenied):
            client.delete_log("team")
    refused(lambda: mallory.raw.create(mallory.path("logs/team/delete"), b"{}"))    # admin only, in ZooKeeper too
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log("team")] == [b"secret", b"from mallory", b"after the roll"]


def test_zk_a_revoked_principal_loses_its_zookeeper_rights(env, tmp_path):
    gone = env.principal("gone")
    with gone.client() as client:
        client.create_ledger(3, 2, 2, password=b"pw").close()
    gone.raw.create(gone.path("logs/made-before"), b"{}")       # allowed: it may create logs
    env.walkit("clients", "revoke", gone.id)
    refused(lambda: gone.raw.create(gone.path("ledgers/99999999"), b"{}"),
            lambda: gone.raw.create(gone.path("logs/squat"), b"{}"))


def test_zk_a_replicated_name_runs_under_a_principals_own_identity(env, alice, mallory):
    class Counter(walkit.StateMachine):
        def __init__(self):
            self.value = 0

        def apply(self, record, position):
            self.value += int(record)
            return self.value

        def snapshot(self, out):
            out.write(str(self.value).encode())

        def restore(self, src):
            self.value = int(src.read())

    with alice.client() as client:
        node = walkit.replicate(Counter(), client=client, name="tally", node_id="n0", snapshot_every_records=0)
        try:
            wait_until(lambda: node.is_leader, timeout=20, message=f"no leader: {node.trouble}")
            assert [node.submit(b"2", timeout=20), node.submit(b"3", timeout=20)] == [2, 5]
        finally:
            node.close()
    for key in ("elections/replication/tally", "logs/replicated-tally"):
        refused(lambda: mallory.raw.get_children(mallory.path(key)),
                lambda: mallory.raw.create(mallory.path(f"{key}/x"), b""))


def test_zk_a_client_whose_store_user_is_another_principal_is_refused(env, alice, mallory):
    with pytest.raises(ConfigError, match="is a principal"):
        walkit.Client(alice.url, key=mallory.key)


# -- what an adversarial review of principal mode tried (each was possible before its fix) -------------
def test_zk_a_deletion_request_made_while_granted_does_not_outlive_the_grant(env, alice, mallory):
    log_ledger, _ = a_log_with_a_ledger(alice, "kept")
    env.walkit("acl", "grant", mallory.id, "write", "log", "kept")
    mallory.raw.create(mallory.path(f"{ledger_key(log_ledger)}/delete"), b'{"version": -1}')   # no hint yet
    env.walkit("acl", "revoke", mallory.id, "log", "kept")                                     # drops the request
    mallory.raw.create(mallory.path(f"deletion-requests/{ledger_key(log_ledger).replace('/', '|')}"), b"")
    wait_until(lambda: mallory.raw.get_children(mallory.path("deletion-requests")) == [], timeout=20,
               message="the hint was not dropped")
    assert alice.raw.exists(alice.path(ledger_key(log_ledger))) is not None
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log("kept")] == [b"secret"]


@pytest.mark.parametrize("form", ["short", "padded", "full-width"])
def test_zk_a_principal_cannot_have_a_marker_written_for_another_principals_ledger(env, alice, mallory, form):
    _, lone = a_log_with_a_ledger(alice, f"marked-{form}")
    name = {"short": str(lone), "padded": f"0{lone}", "full-width": "".join(chr(0xFF10 + int(d)) for d in str(lone))}[form]
    mallory.raw.create(mallory.path(f"ledgers/{name}"), b"{}")                      # hers: she may create ledgers
    mallory.raw.create(mallory.path(f"ledgers/{name}/delete"), b'{"version": -1}')
    mallory.raw.create(mallory.path(f"deletion-requests/ledgers|{name}"), b"")
    wait_until(lambda: mallory.raw.get_children(mallory.path("deletion-requests")) == [], timeout=20,
               message="the hint was not dropped")
    assert mallory.raw.exists(mallory.path(deleted_key(lone))) is None
    assert alice.raw.exists(alice.path(ledger_key(lone))) is not None


def test_zk_a_znode_a_principal_shut_to_the_cluster_does_not_stop_its_revocation(env):
    poisoner = env.principal("poisoner")
    poisoner.raw.create(poisoner.path("logs/aaa-poison"), b"",
                        acl=[ACL(Permissions.ALL, Id("digest", f"{poisoner.id}:{digest_of(poisoner)}"))])
    env.walkit("clients", "revoke", poisoner.id)                     # exits 0, reporting what it could not fix
    refused(lambda: poisoner.raw.create(poisoner.path("ledgers/00000000000099999999"), b"{}"),
            lambda: poisoner.raw.create(poisoner.path("logs/another"), b"{}"))


def test_zk_a_deep_chain_of_znodes_under_a_watched_prefix_stops_neither_watches_nor_the_reaper(env, mallory):
    path = mallory.path("deletion-requests/deep")
    chain = [path, path + "/a"]
    first = mallory.raw.transaction()          # the hint and its first child at once: the bookies' reapers drop a
    first.create(chain[0], b"")                # childless garbage hint as soon as they see it
    first.create(chain[1], b"")
    assert not any(isinstance(result, Exception) for result in first.commit())
    try:
        for _ in range(1100):
            chain.append(chain[-1] + "/a")
            mallory.raw.create(chain[-1], b"")
        changes: list[str] = []
        watch = env.operator.watch("deletion-requests", changes.append)    # Python's recursion limit is 1000
        try:
            reaper = Reaper(env.operator)
            assert reaper.scan() == 0                                      # the garbage hint stays, it goes on
            reaper.close()
            chain.append(chain[-1] + "/b")
            mallory.raw.create(chain[-1], b"")                             # at the bottom: the watch still sees it
            bottom = chain[-1][len(env.root) + 1:]
            wait_until(lambda: bottom in changes, timeout=20, message="the watch missed a change 1,100 znodes deep")
        finally:
            watch.cancel()
    finally:
        for znode in reversed(chain):          # deepest first: kazoo's recursive delete would recurse 1,100 deep
            try:
                env.operator._client.delete(znode)
            except NoNodeError:
                pass


def test_zk_a_wound_back_or_broken_ledger_id_counter_never_reuses_a_deleted_ledgers_id(env, alice, mallory):
    _, lone = a_log_with_a_ledger(alice, "counter")
    with alice.client() as client:
        client.delete_ledger(lone)
        assert alice.raw.exists(alice.path(deleted_key(lone))) is not None
        mallory.raw.set(mallory.path(".counters/ledger-id"), str(lone).encode())      # wound back to a deleted id
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        assert writer.ledger_id != lone
        writer.close()
        mallory.raw.set(mallory.path(".counters/ledger-id"), b"not-a-number")
        with pytest.raises(MetadataError, match="not a non-negative integer"):
            client.create_ledger(3, 2, 2, password=b"pw")
        mallory.raw.set(mallory.path(".counters/ledger-id"), str(writer.ledger_id + 1).encode())


def test_zk_principal_mode_needs_the_clusters_own_user(env):
    anonymous = open_metadata(env.zk.url(fresh_root(), timeout=10))
    try:
        with pytest.raises(ConfigError, match="cluster's own ZooKeeper user"):
            anonymous.principal_identity("c" * 64, "pw")
    finally:
        anonymous.close()


def test_zk_junk_a_principal_makes_under_ledgers_is_skipped_by_listings_and_the_auditor(env, alice, mallory):
    from walkit.autorecovery.auditor import Auditor
    from walkit.autorecovery.daemon import RecoveryConfig
    _, lone = a_log_with_a_ledger(alice, "junk-around")
    mallory.raw.create(mallory.path("ledgers/not-a-ledger"), b"junk")
    mallory.raw.create(mallory.path("ledgers/00000000000088888888"), b"not ledger metadata")
    shut = [ACL(Permissions.ALL, Id("digest", f"{mallory.id}:{digest_of(mallory)}"))]
    mallory.raw.create(mallory.path("ledgers/00000000000088888889"), b"{}", acl=shut)
    with alice.client() as client:
        listed = client.list_ledgers()
    assert lone in listed and 88888888 in listed
    auditor = Auditor(env.operator, "test-auditor", RecoveryConfig())
    auditor._leading = lambda: True               # the audit's reading loop, without campaigning for it
    audited = [ledger_id for ledger_id, _ in auditor._ledgers()]
    assert lone in audited and 88888888 not in audited and 88888889 not in audited


def test_zk_a_write_grantee_cannot_make_itself_the_owner_and_keep_the_log_after_the_revocation(env, alice, mallory):
    # The owner is in the log's and its ledgers' values: only the owners' ACL entries write them; a grantee's
    # changes go through the reaper (put requests), which keeps the owner, the log and the id as they are.
    import base64
    log_ledger, _ = a_log_with_a_ledger(alice, "coveted")
    env.walkit("acl", "grant", mallory.id, "write", "log", "coveted")
    for key in ("logs/coveted", ledger_key(log_ledger)):
        doc = json.loads(mallory.raw.get(mallory.path(key))[0])
        doc["owner"] = mallory.id
        forged = json.dumps(doc).encode()
        refused(lambda: mallory.raw.set(mallory.path(key), forged))
        nonce = "0123456789abcdef"
        request = mallory.path(f"put-requests/coveted/{mallory.id}/{nonce}")
        mallory.raw.create(request, json.dumps({"key": key, "value": base64.b64encode(forged).decode(),
                                                "version": mallory.raw.get(mallory.path(key))[1].version}).encode())
        mallory.raw.create(mallory.path(f"deletion-requests/put|coveted|{mallory.id}|{nonce}"), b"")
        wait_until(lambda: b"answer" in mallory.raw.get(request)[0], timeout=20, message="the reaper did not answer")
        assert json.loads(mallory.raw.get(request)[0])["answer"]["error"] == "denied"
        mallory.raw.delete(request)
        assert json.loads(alice.raw.get(alice.path(key))[0])["owner"] == alice.id
    with mallory.client() as client:                   # through walkit: the same refusal
        value, version = client.store.get("logs/coveted")
        doc = json.loads(value)
        doc["owner"] = mallory.id
        with pytest.raises(MetadataError, match="only its owner changes"):
            client.store.put("logs/coveted", json.dumps(doc).encode(), version)
        client.store.put("logs/coveted", value, version)             # a change that keeps the owner goes through
    env.walkit("acl", "revoke", mallory.id, "log", "coveted")
    refused(lambda: mallory.raw.set(mallory.path("logs/coveted"), b"{}"),
            lambda: mallory.raw.create(mallory.path(f"put-requests/coveted/{alice.id}"), b""))   # the cluster's
    assert mallory.raw.exists(mallory.path(f"put-requests/coveted/{mallory.id}")) is None      # gone with the grant
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log("coveted")] == [b"secret"]
