"""Per-principal etcd users (issue 47 item 1): etcd itself holds walkit's permissions.

A real etcd server with authentication, three secured bookies whose etcd user holds etcd's root
role (each runs the agent that creates and deletes ledgers and logs for principals:
walkit.plugins.metadata.etcd_principals.Agent), and principals that connect to etcd as
themselves. Each test tries what an adversary holding a principal's own etcd credentials would:
straight through etcd's v3 JSON gateway, past walkit's own checks.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import walkit
from walkit import security
from walkit.client.log import read_log_metadata
from walkit.core.metadata import deleted_key, ledger_key
from walkit.errors import ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, PermissionDenied
from walkit.local import LocalCluster
from walkit.plugins import open_metadata
from walkit.plugins.metadata.etcd_principals import REQUESTS, role_of
from walkit.testing.servers import SecuredEtcdServer, with_user

from tests.conftest import fresh_root

from .helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.servers]

ROOT_PASSWORD = "root-s3cret"


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class Raw:
    """Raw talks to etcd's v3 JSON gateway as one user, with nothing of walkit in between."""

    def __init__(self, etcd: SecuredEtcdServer, root: str, user: str, password: str) -> None:
        self.etcd, self.root = etcd, root
        self.token = etcd.api("/auth/authenticate", {"name": user, "password": password})["token"]

    def call(self, path: str, body: dict) -> dict:
        """call posts `body`; it raises Refused with etcd's error text when etcd answers an error."""
        request = urllib.request.Request(f"http://{self.etcd.address}/v3{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": self.token})
        try:
            with urllib.request.urlopen(request, timeout=10.0) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as exc:
            raise Refused(exc.read().decode()) from None

    def key(self, key: str) -> str:
        return _b64(f"{self.root}/{key}")

    def get(self, key: str) -> bytes | None:
        kvs = self.call("/kv/range", {"key": self.key(key)}).get("kvs")
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def put(self, key: str, value: bytes) -> None:
        self.call("/kv/put", {"key": self.key(key), "value": _b64(value)})

    def delete(self, key: str) -> None:
        self.call("/kv/deleterange", {"key": self.key(key)})

    def list(self, prefix: str) -> list[str]:
        low = f"{self.root}/{prefix}/"
        kvs = self.call("/kv/range", {"key": _b64(low), "range_end": _b64(low[:-1] + "0"), "keys_only": True})
        return [base64.b64decode(kv["key"]).decode()[len(low):] for kv in kvs.get("kvs", ())]


class Refused(Exception):
    """Refused is etcd's error answer."""


def refused(*attempts) -> None:
    for i, attempt in enumerate(attempts):
        with pytest.raises(Refused, match="permission denied") as caught:
            attempt()
        assert caught.value, i


class Principal:
    """Principal is a key pair with an etcd user of its own: its walkit Client, and raw etcd as itself."""

    def __init__(self, env, name: str) -> None:
        self.env = env
        _, self.key = security.new_keys(str(env.tmp), name)
        self.id = security.principal_of(self.key)
        self.password_file = env.tmp / f"{name}.etcd"
        env.walkit("clients", "allow", self.id, "--name", name, "--metadata-password-file", str(self.password_file))
        self.password = self.password_file.read_text().strip()
        self.url = with_user(env.etcd.url(env.root, timeout=10), self.id) + f"&password_file={self.password_file}"
        self.raw = Raw(env.etcd, env.root, self.id, self.password)

    def client(self) -> walkit.Client:
        return walkit.Client(self.url, key=self.key, timeout=10, add_timeout=3, request_timeout=3)

    def walkit(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "walkit", "--key", self.key, *args, "--metadata", self.url],
                              capture_output=True, text=True, timeout=120)


class Env:
    def __init__(self, etcd, tmp) -> None:
        self.etcd, self.tmp, self.root = etcd, tmp, fresh_root()
        self.cluster_url = with_user(etcd.url(self.root, timeout=10), "root", ROOT_PASSWORD)
        self.cluster = LocalCluster(bookies=3, data_dir=str(tmp / "cluster"), storage="memory",
                                    metadata=self.cluster_url, security=True)
        self.operator = open_metadata(self.cluster_url)
        self.root_raw = Raw(etcd, self.root, "root", ROOT_PASSWORD)

    def walkit(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "walkit", *args, "--metadata", self.cluster_url],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def principal(self, name: str) -> Principal:
        return Principal(self, name)

    def close(self) -> None:
        self.operator.close()
        self.cluster.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with SecuredEtcdServer(ROOT_PASSWORD) as etcd:
        env = Env(etcd, tmp_path_factory.mktemp("etcd-principals"))
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


def ask(principal: Principal, request: dict) -> dict:
    """ask writes a raw request to the agent as `principal` and returns the agent's answer."""
    key = f"{REQUESTS}/{principal.id}/{request.get('nonce', 'raw')}"
    principal.raw.put(key, json.dumps(request).encode())
    answers: list[dict] = []

    def answered() -> bool:
        value = principal.raw.get(key)
        if value is not None and "answer" in json.loads(value):
            answers.append(json.loads(value)["answer"])
        return bool(answers)
    wait_until(answered, timeout=20, message=f"the agent did not answer {request}")
    principal.raw.delete(key)
    return answers[0]


def test_etcd_a_principal_cannot_change_or_delete_anothers_log_or_ledger_with_its_own_credentials(env, alice, mallory):
    log_ledger, lone = a_log_with_a_ledger(alice, "orders")
    raw = mallory.raw
    for key in ("logs/orders", ledger_key(log_ledger), ledger_key(lone)):
        refused(lambda: raw.put(key, b"{}"), lambda: raw.delete(key))
    refused(lambda: raw.put(deleted_key(lone), b"{}"),                           # would have bookies drop it
            lambda: raw.delete(f"security/clients/{alice.id}"),
            lambda: raw.put(f"security/clients/{mallory.id}", b"{}"),
            lambda: raw.put("bookies/evil", b""),
            lambda: raw.put(f"{REQUESTS}/{alice.id}/forged", b"{}"),            # another principal's requests
            # etcd's users and roles are root's alone: no principal gives itself a key
            lambda: raw.call("/auth/role/grant", {"name": role_of(env.root, mallory.id), "perm": {
                "permType": "READWRITE", "key": raw.key("logs/orders")}}),
            lambda: raw.call("/auth/user/grant", {"user": mallory.id, "role": "root"}))
    # The agent refuses what walkit's permissions refuse, whatever the request says.
    assert ask(mallory, {"op": "delete", "key": ledger_key(lone), "version": -1})["error"] == "denied"
    assert ask(mallory, {"op": "delete", "key": "logs/orders", "version": -1})["error"] == "denied"
    assert ask(mallory, {"op": "sync", "key": "logs/orders"}) == {"synced": True}     # recomputed: still not hers
    refused(lambda: raw.put("logs/orders", b"{}"))
    # Through walkit and its CLI: refused too.
    with mallory.client() as client:
        for attempt in (lambda: client.delete_ledger(lone), lambda: client.truncate_ledger(lone, 1),
                        lambda: list(client.read_log("orders")), lambda: client.delete_log("orders"),
                        lambda: client.open_log("orders")):               # a writer rolls the log
            with pytest.raises((PermissionDenied, MetadataError), match="may not|not authorized|denied"):
                attempt()
    for args in (("log", "read", "orders"), ("log", "truncate", "orders", "--before", f"{log_ledger}:1"),
                 ("ledger", "delete", str(lone)), ("log", "delete", "orders")):
        refusal = mallory.walkit(*args)
        assert refusal.returncode == 1 and "may not" in refusal.stderr, (args, refusal.stdout, refusal.stderr)
    with alice.client() as client:                     # untouched
        assert [bytes(r.payload) for r in client.read_log("orders")] == [b"secret"]
        assert [bytes(e.payload) for e in client.open_ledger(lone, password=b"pw").read()] == [b"private"]


def test_etcd_an_owner_cannot_create_ledgers_or_logs_or_write_deletion_markers_directly(env, alice):
    _, lone = a_log_with_a_ledger(alice, "own-creates")
    # A role that could create one new key under ledgers/ could create or delete any: creation is the agent's.
    refused(lambda: alice.raw.put(ledger_key(lone + 1000), b"{}"),
            lambda: alice.raw.put("logs/squatted", b"{}"),
            lambda: alice.raw.put(deleted_key(lone + 1000), b"{}"))
    # Its own keys it may change (etcd tells no delete from a write: documented).
    assert alice.raw.get(ledger_key(lone))


def test_etcd_an_owners_deletions_go_through_the_bookies_agent(env, alice):
    _, lone = a_log_with_a_ledger(alice, "to-delete")
    with alice.client() as client:
        client.delete_ledger(lone)                      # returns once a bookie's agent deleted it
        client.delete_log("to-delete")
    for key in (ledger_key(lone), "logs/to-delete"):
        assert alice.raw.get(key) is None, key
    assert json.loads(alice.raw.get(deleted_key(lone)))["deleted_ms"] > 0       # written by the agent
    role = env.root_raw.call("/auth/role/get", {"role": role_of(env.root, alice.id)})
    held = {base64.b64decode(p["key"]).decode() for p in role.get("perm", ())}
    assert f"{env.root}/{ledger_key(lone)}" not in held and f"{env.root}/logs/to-delete" not in held
    assert alice.raw.list(f"{REQUESTS}/{alice.id}") == []                        # the client cleans up


def test_etcd_a_grant_opens_the_keys_at_once_and_its_revocation_closes_them(env, alice, mallory):
    log_ledger, _ = a_log_with_a_ledger(alice, "shared")
    key = ledger_key(log_ledger)
    with mallory.client() as client:
        value, version = client.store.get(key)
        with pytest.raises(MetadataNotAuthorized):
            client.store.put(key, value, version)
        env.walkit("acl", "grant", mallory.id, "write", "log", "shared")
        version = client.store.put(key, value, version)             # through the agent: it is alice's ledger
        refused(lambda: mallory.raw.put(key, value))                # directly never: its owner is in its value
        read = mallory.walkit("log", "read", "shared")
        assert read.returncode == 0 and "secret" in read.stdout, read.stderr
        env.walkit("acl", "revoke", mallory.id, "log", "shared")
        with pytest.raises(MetadataNotAuthorized):
            client.store.put(key, value, version)
        with pytest.raises(PermissionDenied):
            list(client.read_log("shared"))
    refused(lambda: mallory.raw.put(key, b"{}"), lambda: mallory.raw.put("logs/shared", b"{}"))


def test_etcd_a_write_grant_lets_a_principal_roll_and_truncate_but_not_delete_the_log_through_walkit(
        env, alice, mallory):
    a_log_with_a_ledger(alice, "team")
    env.walkit("acl", "grant", mallory.id, "write", "log", "team")
    with mallory.client() as client:
        with client.open_log("team") as log:           # fences alice's ledger and starts one of its own
            log.append(b"from mallory")
            log.roll()
            log.append(b"after the roll")
        with pytest.raises(PermissionDenied):
            client.delete_log("team")
    assert ask(mallory, {"op": "delete", "key": "logs/team", "version": -1})["error"] == "denied"
    with alice.client() as client:
        assert [bytes(r.payload) for r in client.read_log("team")] == [b"secret", b"from mallory", b"after the roll"]


def test_etcd_a_revoked_principal_loses_its_etcd_user(env):
    gone = env.principal("gone")
    with gone.client() as client:
        client.create_ledger(3, 2, 2, password=b"pw").close()
    env.walkit("clients", "revoke", gone.id)
    with pytest.raises(urllib.error.HTTPError):
        Raw(env.etcd, env.root, gone.id, gone.password)                # the user is gone
    with pytest.raises(Refused, match="invalid auth token"):           # its token from before is dead too
        gone.raw.put(f"{REQUESTS}/{gone.id}/x", b"{}")
    with pytest.raises(MetadataError):
        gone.client()


def test_etcd_a_replicated_name_runs_under_a_principals_own_identity(env, alice, mallory):
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
        node = walkit.replicate(Counter(), client=client, name="tally", node_id="n0", snapshot_every_records=1)
        try:
            wait_until(lambda: node.is_leader, timeout=20, message=f"no leader: {node.trouble}")
            assert [node.submit(b"2", timeout=20), node.submit(b"3", timeout=20)] == [2, 5]
        finally:
            node.close()
    leaders = [k for k in alice.raw.list("elections/replication/tally")]
    refused(lambda: mallory.raw.put("elections/replication/tally/leader", b"mine"),
            lambda: mallory.raw.put(".counters/elections/replication/tally", b"0"),
            lambda: mallory.raw.put("replication/tally/snapshot", b"{}"),
            lambda: mallory.raw.put("logs/replicated-tally", b"{}"))
    assert ask(mallory, {"op": "sync", "key": "replication/tally/snapshot"}) == {"synced": True}
    refused(lambda: mallory.raw.put("replication/tally/snapshot", b"{}"))     # the name is alice's log's
    assert leaders == alice.raw.list("elections/replication/tally")


def test_etcd_a_client_whose_store_user_is_another_principal_is_refused(env, alice, mallory):
    with pytest.raises(ConfigError, match="is a principal"):
        walkit.Client(alice.url, key=mallory.key)


def test_etcd_requests_for_keys_that_are_not_the_principals_are_refused(env, alice, mallory):
    log_ledger, lone = a_log_with_a_ledger(alice, "guarded")
    with alice.client() as client:
        metadata = client.store.get(ledger_key(lone))[0]
        log_value = client.store.get("logs/guarded")[0]
    # alice's own metadata, as mallory's: a ledger or log owned by another is not created for her
    assert ask(mallory, {"op": "create", "key": ledger_key(lone + 5000), "value": _b64(metadata)})["error"] == "denied"
    assert ask(mallory, {"op": "create", "key": "logs/guarded-2", "value": _b64(log_value)})["error"] == "denied"
    # keys the agent never makes, forged values, garbage: refused, and the agent keeps serving
    for request in ({"op": "create", "key": "bookies/evil", "value": _b64(b"x")},
                    {"op": "create", "key": f"ledgers/{lone + 6000}", "value": _b64(metadata)},
                    {"op": "create", "key": "ledgers/00000000000000777777", "value": _b64(b"not metadata")},
                    {"op": "delete", "key": "security/clients/" + alice.id},
                    {"op": "explode", "key": "logs/guarded"}, {"op": "create"}):
        answer = ask(mallory, request)
        assert answer.get("error") in ("invalid", "denied"), (request, answer)
    for junk in (b"\xff not json", b'["not", "a", "dict"]'):
        mallory.raw.put(f"{REQUESTS}/{mallory.id}/junk", junk)
        wait_until(lambda: b"answer" in (mallory.raw.get(f"{REQUESTS}/{mallory.id}/junk") or b""), timeout=20,
                   message=f"the agent did not answer the request {junk!r}")
        mallory.raw.delete(f"{REQUESTS}/{mallory.id}/junk")
    assert alice.raw.get(ledger_key(lone)) == metadata and alice.raw.get("security/clients/" + alice.id)
    with alice.client() as client:                     # the agent still serves
        client.create_ledger(3, 2, 2, password=b"pw").close()


def test_etcd_ledger_ids_are_drawn_by_the_agent_and_no_principal_winds_the_counter_back(env, alice, mallory):
    _, lone = a_log_with_a_ledger(alice, "counter")
    refused(lambda: mallory.raw.put(".counters/ledger-id", str(lone).encode()),
            lambda: mallory.raw.put(".counters/ledger-id", b"not-a-number"))
    with alice.client() as client:
        client.delete_ledger(lone)
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        assert writer.ledger_id > lone
        writer.close()
        assert int(env.operator.get(".counters/ledger-id")[0]) > writer.ledger_id


def test_etcd_two_principals_racing_for_one_log_name_get_one_owner(env):
    first, second = env.principal("racer-1"), env.principal("racer-2")
    with first.client() as a, second.client() as b:
        outcomes = []
        for client in (a, b):
            try:
                with client.open_log("contested") as log:
                    log.append(client.principal.encode())
                outcomes.append(client.principal)
            except (PermissionDenied, NodeExists, MetadataNotAuthorized) as exc:
                outcomes.append(exc)
    assert outcomes[0] == first.id and not isinstance(outcomes[1], str)
    second.raw.get("logs/contested")
    refused(lambda: second.raw.put("logs/contested", b"{}"))
    first.raw.put("logs/contested", first.raw.get("logs/contested"))


def test_etcd_principal_mode_needs_a_user_with_etcds_root_role(env, tmp_path):
    env.etcd.add_user("plain", "plain-pw", prefix=f"{env.root}/")
    plain = open_metadata(with_user(env.etcd.url(env.root, timeout=10), "plain", "plain-pw"))
    try:
        with pytest.raises(MetadataNotAuthorized, match="root role"):
            plain.principal_identity("c" * 64, "pw")
        done = subprocess.run([sys.executable, "-m", "walkit", "clients", "allow", "d" * 64, "--metadata-password-file",
                               str(tmp_path / "d.etcd"), "--metadata",
                               with_user(env.etcd.url(env.root, timeout=10), "plain", "plain-pw")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "root role" in done.stderr, (done.stdout, done.stderr)
        assert "d" * 64 not in security.allowed(plain)                  # refused before anything changed
    finally:
        plain.close()


def role_keys(env, principal: Principal) -> set[str]:
    role = env.root_raw.call("/auth/role/get", {"role": role_of(env.root, principal.id)})
    return {base64.b64decode(p["key"]).decode()[len(env.root) + 1:] for p in role.get("perm", ())
            if p.get("permType") == "READWRITE"}


def test_etcd_an_agent_that_stopped_half_way_is_finished_by_the_next(env, alice):
    _, lone = a_log_with_a_ledger(alice, "half-way")
    key = ledger_key(lone)
    # Created, but stopped before the roles got the key: the request stays marked "written".
    env.root_raw.call("/auth/role/revoke", {"role": role_of(env.root, alice.id), "key": alice.raw.key(key)})
    assert key not in role_keys(env, alice)
    answer = ask(alice, {"op": "create", "key": key, "value": _b64(b"-"), "state": "written"})
    assert "version" in answer and key in role_keys(env, alice)
    # Deleted, but stopped before the roles lost the key: marked "deleted".
    env.root_raw.delete(key)
    assert ask(alice, {"op": "delete", "key": key, "version": -1, "state": "deleted"}) == {"deleted": True}
    assert key not in role_keys(env, alice)
