"""Secured clusters (issue 17): CurveZMQ keys, the allow-list, and per-log permissions, with real bookies."""

from __future__ import annotations

import pytest

import walkit
from walkit import security
from walkit.errors import Unauthorized
from walkit.local import LocalCluster
from walkit.plugins import open_metadata

from walkit.core.messages import AddRequest, Entry, ReadLacRequest, ReadRequest, Status
from walkit.core.metadata import LEDGER_ID_COUNTER
from walkit.registry import BookieRegistry

from .helpers import MASTER_KEY, RawBookie, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, data_dir=str(tmp_path_factory.mktemp("secure") / "cluster"), storage="memory",
                      security=True) as cluster:
        yield cluster


@pytest.fixture
def store(cluster):
    store = open_metadata(cluster.metadata_url)
    yield store
    store.close()


def keyed(cluster, tmp_path, name: str, store=None, allow: bool = True) -> tuple[str, str]:
    """keyed makes a key pair (allowed unless told otherwise) and returns (secret file, principal)."""
    _, secret = security.new_keys(str(tmp_path), name)
    principal = security.principal_of(secret)
    if allow:
        security.allow(store, principal, name)
    return secret, principal


def client(cluster, key: str | None) -> walkit.Client:
    return walkit.Client(cluster.metadata_url, key=key, timeout=10, add_timeout=2, request_timeout=3)


def refused_everything(cluster, key: str | None, ledger_id: int) -> None:
    """refused_everything checks that a client can neither write, read nor fence (nor create, with a key
    off the allow-list: walkit.permissions.check_create)."""
    with client(cluster, key) as c:
        if key is None:
            writer = c.create_ledger(3, 2, 2, password=b"pw")       # metadata only: no bookie involved yet
            with pytest.raises(Unauthorized):
                writer.append(b"x", timeout=10)
        else:
            with pytest.raises(walkit.errors.PermissionDenied, match="not on the allow-list"):
                c.create_ledger(3, 2, 2, password=b"pw")
        with pytest.raises(Unauthorized):
            list(c.open_ledger(ledger_id, password=b"pw").read())
        with pytest.raises(Unauthorized):
            c.open_ledger(ledger_id, password=b"pw", recover=True)


@pytest.fixture
def owned(cluster):
    """owned is an open ledger whose entry 0 is confirmed (entry 1 carries LAC 0), by the allowed client."""
    with client(cluster, cluster.client_key) as c:
        writer = c.create_ledger(3, 2, 2, password=b"pw")
        writer.append(b"secret")
        writer.append(b"more")
        yield writer.ledger_id
        try:
            writer.close()
        except walkit.errors.LedgerFenced:
            pass        # a refused recovery still marked it IN_RECOVERY: the metadata store is not secured here


def test_an_allowed_client_writes_and_reads(cluster, owned):
    with client(cluster, cluster.client_key) as c:
        assert [e.payload for e in c.open_ledger(owned, password=b"pw").read()][0] == b"secret"


def test_a_client_without_a_key_is_refused_everything(cluster, owned):
    refused_everything(cluster, None, owned)


def test_a_client_with_an_unknown_key_is_refused_everything(cluster, owned, tmp_path, store):
    secret, _ = keyed(cluster, tmp_path, "stranger", store, allow=False)
    refused_everything(cluster, secret, owned)


def appends(c) -> bool:
    """appends tells whether every bookie takes this client's writes now (False once one refuses)."""
    try:
        c.create_ledger(3, 3, 3, password=b"pw").append(b"probe", timeout=10)
        return True
    except Unauthorized:
        return False


def test_allowing_and_revoking_a_key_take_effect_without_a_restart(cluster, tmp_path, store):
    secret, principal = keyed(cluster, tmp_path, "temp", store)
    with client(cluster, secret) as c:
        wait_until(lambda: appends(c), 10, message="the new key was never accepted")   # bookies watch the list
        writer = c.create_ledger(3, 3, 3, password=b"pw")        # every entry goes to every bookie
        assert writer.append(b"allowed") == 0
        security.disallow(store, principal)                         # no bookie restarts
        wait_until(lambda: refused(writer), 10,                     # also on the connections it has open
                   message="the revoked key was still accepted by the bookies")
        assert not appends(c)                                       # and no new ledger (walkit.permissions)


def refused(writer) -> bool:
    """refused tells whether the bookies refuse `writer`'s next append (False while they take it)."""
    try:
        writer.append(b"after the revocation", timeout=10)
        return False
    except Unauthorized:
        return True


def test_principal_a_cannot_read_or_fence_principal_bs_log_unless_granted(cluster, tmp_path, store):
    key_a, principal_a = keyed(cluster, tmp_path, "alice", store)
    key_b, principal_b = keyed(cluster, tmp_path, "bob", store)
    with client(cluster, key_a) as a, client(cluster, key_b) as b:
        wait_until(lambda: appends(a) and appends(b), 10, message="the new keys were never accepted")
        writer = b.open_log("bobs-log")
        position = writer.append(b"bob's record")
        writer.append(b"confirms the first")                     # carries LAC 0: the first is readable
        assert b.log_metadata("bobs-log").owner == principal_b
        with pytest.raises(Unauthorized):
            list(a.read_log("bobs-log"))
        with pytest.raises(Unauthorized):
            a.open_ledger(position.ledger_id, recover=True)        # a fence
        security.grant(store, principal_a, "read", "bobs-log")
        records = wait_until(lambda: [r.payload for r in a.read_log("bobs-log")], 10,
                             message="the read grant never took effect")
        assert records[0] == b"bob's record"
        with pytest.raises(Unauthorized):
            a.open_ledger(position.ledger_id, recover=True)        # read is not enough to fence
        security.grant(store, principal_a, "write", "bobs-log")
        closed = wait_until(lambda: a.open_ledger(position.ledger_id, recover=True), 10,
                            message="the write grant never took effect")
        assert closed.is_closed
        with pytest.raises(walkit.errors.LedgerFenced):
            writer.append(b"after alice took over", timeout=10)


def test_no_one_can_claim_a_ledger_id_nobody_created(cluster, store):
    """An allowed principal cannot write, read or fence a ledger id no one created: a secured bookie
    checks ownership against the ledger's metadata, and a ledger without metadata has no owner."""
    future_id = store.next_id(LEDGER_ID_COUNTER) + 1000               # never created
    public, secret = security.load_keys(cluster.client_key)
    address = cluster.addresses[0]
    server_key = BookieRegistry(store).info(address).public_key.encode()
    with RawBookie(address, curve=(public, secret, server_key)) as raw:
        for request in (AddRequest(txn=raw.next_txn(), ledger_id=future_id, master_key=MASTER_KEY,
                                   entries=[Entry(future_id, 0, -1, b"", b"squatter")]),
                        ReadRequest(txn=raw.next_txn(), ledger_id=future_id, entry_ids=[0]),
                        ReadLacRequest(txn=raw.next_txn(), ledger_id=future_id, fence=True, master_key=MASTER_KEY)):
            response = raw.request(request, timeout=10)
            assert response.status == Status.NO_SUCH_LEDGER, response


def test_the_cli_makes_keys_allows_them_and_uses_the_one_walkit_key_names(cluster, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from walkit.cli import main
    monkeypatch.setenv("WALKIT_KEY", "")        # `walkit --key` sets it; setenv makes pytest remove it after
    url = cluster.metadata_url

    def walkit_cli(*args: str, ok: bool = True):
        result = CliRunner().invoke(main, list(args))
        assert (result.exit_code == 0) == ok, (result.output, result.exception)
        return result.output

    refused = walkit_cli("ledger", "create", "x", "--metadata", url, ok=False)
    assert "Unauthorized" in refused and "key" in refused
    made = walkit_cli("keys", "new", "carol", "--dir", str(tmp_path))
    principal = made.split("principal:")[1].strip()
    assert walkit_cli("keys", "show", str(tmp_path / "carol.key")).strip() == principal
    walkit_cli("clients", "allow", principal, "--name", "carol", "--metadata", url)
    assert f"{principal}\tcarol" in walkit_cli("clients", "list", "--metadata", url)
    carol = str(tmp_path / "carol.key_secret")
    wait_until(lambda: CliRunner().invoke(main, ["--key", carol, "ledger", "create", "a", "b",
                                                 "--metadata", url]).exit_code == 0,
               10, message="carol's key was never accepted")
    ledger_id = int(walkit_cli("--key", carol, "ledger", "create", "c", "d", "--metadata", url))
    assert walkit_cli("--key", carol, "ledger", "read", str(ledger_id), "--metadata", url) == "0\tc\n1\td\n"
    walkit_cli("acl", "grant", principal, "read", "log", "orders", "--metadata", url)
    assert f"{principal}\tread" in walkit_cli("acl", "list", "log", "orders", "--metadata", url)
    walkit_cli("acl", "revoke", principal, "log", "orders", "--metadata", url)
    assert principal not in walkit_cli("acl", "list", "log", "orders", "--metadata", url)
    walkit_cli("clients", "revoke", principal, "--metadata", url)
    assert principal not in walkit_cli("clients", "list", "--metadata", url)


def test_the_log_sqlite_and_spark_commands_take_the_key_walkit_key_names(cluster, tmp_path, monkeypatch):
    """Commands that talk to bookies open their Client with the key of `walkit --key` (WALKIT_KEY): without
    it the owner's log and replicated database are refused, with it they are read (issue 47, item 4)."""
    import sqlite3

    from click.testing import CliRunner

    import walkit.adapters.sqlite as sq
    from walkit.cli import main
    url, key = cluster.metadata_url, cluster.client_key
    monkeypatch.setenv("WALKIT_KEY", key)                       # the database's owner
    database = sq.connect(str(tmp_path / "keyed.db"), name="keyed", metadata=url, forward_address=False,
                          isolation_level=None)
    database.execute("CREATE TABLE t (v TEXT)")
    database.execute("INSERT INTO t VALUES ('kept')")
    database.close()

    def run(*args: str, with_key: bool):
        monkeypatch.setenv("WALKIT_KEY", "")                    # `walkit --key` sets it; pytest removes it after
        return CliRunner().invoke(main, (["--key", key] if with_key else []) + [*args, "--metadata", url])
    assert run("log", "append", "keyed-log", "a", "b", with_key=True).exit_code == 0
    for command in (("log", "read", "keyed-log"), ("sqlite", "restore", "keyed", str(tmp_path / "refused.db"))):
        refused = run(*command, with_key=False)
        assert refused.exit_code == 1 and "WALKIT_KEY" in refused.output, (command, refused.output)
    read = run("log", "read", "keyed-log", with_key=True)
    assert read.exit_code == 0 and [line.split("\t")[1] for line in read.output.splitlines()] == ["a", "b"]
    restored = run("sqlite", "restore", "keyed", str(tmp_path / "restored.db"), with_key=True)
    assert restored.exit_code == 0, restored.output
    assert sqlite3.connect(str(tmp_path / "restored.db")).execute("SELECT v FROM t").fetchall() == [("kept",)]
    cleaned = run("spark", "cleanup", with_key=True)            # nothing staged: it opens its Client with the key
    assert cleaned.exit_code == 0 and cleaned.output.startswith("deleted 0 staged ledgers"), cleaned.output


def test_a_read_grant_on_a_replicated_name_lets_a_principal_read_its_snapshot_ledgers(cluster, tmp_path, store):
    """A snapshot ledger of replicated name N belongs to the log replicated-N (walkit.permissions.log_of):
    bookies check its reads against that log's grants, as the client checks its deletes."""
    key_a, principal_a = keyed(cluster, tmp_path, "alice", store)
    key_b, _ = keyed(cluster, tmp_path, "bob", store)
    with client(cluster, key_a) as a, client(cluster, key_b) as b:
        wait_until(lambda: appends(a) and appends(b), 10, message="the new keys were never accepted")
        snapshot = b.create_ledger(3, 2, 2, password=b"pw", custom={"replication": "counter", "snapshot": "0:0"})
        snapshot.append(b"state")
        snapshot.close()
        with pytest.raises(Unauthorized):
            list(a.open_ledger(snapshot.ledger_id, password=b"pw").read())
        security.grant(store, principal_a, "read", "replicated-counter")
        read = wait_until(lambda: [e.payload for e in a.open_ledger(snapshot.ledger_id, password=b"pw").read()], 10,
                          message="the read grant on the replicated name never took effect")
        assert read == [b"state"]
        with pytest.raises(walkit.errors.PermissionDenied):
            a.delete_ledger(snapshot.ledger_id)
