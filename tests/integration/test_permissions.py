"""Permissions past the bookie (issue 47 item 1): delete, truncate, roll, read and grant changes are
checked against the caller's principal (walkit.permissions), through the API and the CLI, on every
metadata backend (real ZooKeeper and etcd servers; in-process bookies, which check nothing, so
every refusal here is the client's own check)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from walkit import security
from walkit.cli import main
from walkit.errors import PermissionDenied, Unauthorized
from walkit.testing.memory import MemoryCluster

from tests.conftest import fresh_metadata_url


@pytest.fixture(params=["sqlite", "zk", "etcd"])
def cluster(request, tmp_path):
    with MemoryCluster(fresh_metadata_url(request, request.param, tmp_path), bookies=3, add_timeout=2.0,
                       request_timeout=2.0) as cluster:
        yield cluster


def keyed(cluster, tmp_path, name: str) -> tuple[str, str]:
    """keyed makes an allowed key pair and returns (secret file, principal)."""
    _, secret = security.new_keys(str(tmp_path / "keys"), name)
    principal = security.principal_of(secret)
    security.allow(cluster.store, principal, name)
    return secret, principal


def owned_log(cluster, owner_key: str, name: str = "orders"):
    """owned_log is log `name`, opened by the owner of `owner_key`, with two ledgers of one record each."""
    writer = cluster.client(key=owner_key).open_log(name, ensemble=3, write_quorum=2, ack_quorum=2)
    first = writer.append(b"one")
    writer.roll()
    writer.append(b"two")
    return writer, first


def test_a_principal_without_permission_cannot_delete_truncate_roll_or_read_a_log_and_the_owner_can(cluster, tmp_path):
    owner_key, _ = keyed(cluster, tmp_path, "owner")
    intruder_key, intruder = keyed(cluster, tmp_path, "intruder")
    writer, first = owned_log(cluster, owner_key)
    other = cluster.client(key=intruder_key)
    ledger_id = first.ledger_id
    for attempt in (lambda: other.delete_ledger(ledger_id),
                    lambda: other.truncate_ledger(ledger_id, 1),
                    lambda: other.delete_log("orders"),
                    lambda: other.open_log("orders"),                   # a writer's open, then its rolls
                    lambda: other.read_log("orders"),
                    lambda: other.open_ledger(ledger_id)):
        with pytest.raises(PermissionDenied) as refused:
            attempt()
        assert refused.value.principal == intruder and "walkit acl grant" in str(refused.value)
    assert ledger_id in cluster.client().list_ledgers() and writer.metadata.ledger_ids[0] == ledger_id
    writer.roll()                                                       # the owner can
    assert ledger_id in writer.truncate(before=writer.append(b"three"))
    writer.close()
    payloads = [r.payload for r in cluster.client(key=owner_key).read_log("orders")]
    assert payloads[-1] == b"three" and b"one" not in payloads
    cluster.client(key=owner_key).delete_log("orders")
    assert "orders" not in cluster.client().list_logs()


def test_a_read_grant_lets_a_principal_read_and_change_nothing(cluster, tmp_path):
    owner_key, _ = keyed(cluster, tmp_path, "owner")
    reader_key, reader = keyed(cluster, tmp_path, "reader")
    writer, first = owned_log(cluster, owner_key)
    writer.append(b"confirms two")
    security.grant(cluster.store, reader, "read", "orders")
    client = cluster.client(key=reader_key)
    assert [r.payload for r in client.read_log("orders")][:2] == [b"one", b"two"]
    for attempt in (lambda: client.delete_ledger(first.ledger_id), lambda: client.truncate_ledger(first.ledger_id, 1),
                    lambda: client.open_log("orders"), lambda: client.delete_log("orders"),
                    lambda: client.open_ledger(writer.ledger_id, recover=True)):     # a fence
        with pytest.raises(PermissionDenied) as refused:
            attempt()
        assert refused.value.needed in ("write", "admin")
    writer.close()


def test_a_write_grant_lets_a_principal_roll_and_truncate_but_not_delete_the_log_or_grant(cluster, tmp_path):
    owner_key, _ = keyed(cluster, tmp_path, "owner")
    writer_key, granted = keyed(cluster, tmp_path, "writer")
    owners_writer, _ = owned_log(cluster, owner_key)
    owners_writer.close()
    security.grant(cluster.store, granted, "write", "orders")
    client = cluster.client(key=writer_key)
    writer = client.open_log("orders")                                  # takes the log over
    writer.roll()
    assert len(writer.truncate(before=writer.append(b"three"))) >= 2    # the owner's ledgers go too
    writer.close()
    with pytest.raises(PermissionDenied):
        client.delete_log("orders")
    with pytest.raises(PermissionDenied):
        client.check_log("orders", "grant")


def test_revoking_a_grant_or_a_client_takes_effect_on_the_next_call(cluster, tmp_path):
    owner_key, _ = keyed(cluster, tmp_path, "owner")
    writer_key, granted = keyed(cluster, tmp_path, "writer")
    owners_writer, _ = owned_log(cluster, owner_key)
    owners_writer.close()
    security.grant(cluster.store, granted, "write", "orders")
    writer = cluster.client(key=writer_key).open_log("orders")
    writer.roll()
    security.grant(cluster.store, granted, "read", "orders")           # lowered, no restart
    with pytest.raises(PermissionDenied):
        writer.roll()
    with pytest.raises(PermissionDenied):
        writer.truncate(before=writer.append(b"x"))
    owner = cluster.client(key=owner_key)
    assert [r.payload for r in owner.read_log("orders")][:1] == [b"one"]
    security.disallow(cluster.store, security.principal_of(owner_key))   # even the owner, once revoked
    with pytest.raises(PermissionDenied):
        owner.read_log("orders")
    writer.close()


def test_a_ledger_of_no_log_is_its_owners_alone_and_a_client_without_a_key_holds_nothing(cluster, tmp_path):
    owner_key, _ = keyed(cluster, tmp_path, "owner")
    ledger = cluster.client(key=owner_key).create_ledger(3, 2, 2)
    ledger.append(b"x")
    with pytest.raises(Unauthorized):                                   # PermissionDenied is an Unauthorized
        cluster.client().delete_ledger(ledger.ledger_id)
    ledger.close()
    cluster.client(key=owner_key).delete_ledger(ledger.ledger_id)
    assert ledger.ledger_id not in cluster.client().list_ledgers()


def test_a_cluster_without_security_stays_open(cluster):
    client = cluster.client()
    writer = client.open_log("open")
    writer.truncate(before=writer.append(b"x"))
    writer.roll()
    writer.close()
    other = cluster.client()
    assert [r.payload for r in other.read_log("open")] == [b"x"]
    other.delete_log("open")


def test_the_cli_refuses_a_principal_without_permission_and_lets_the_owner(cluster, tmp_path, monkeypatch):
    """The CLI's refusals come before any bookie is asked (its clients cannot reach in-process bookies)."""
    monkeypatch.setenv("WALKIT_KEY", "")        # `walkit --key` sets it; setenv makes pytest remove it after
    owner_key, owner = keyed(cluster, tmp_path, "owner")
    intruder_key, intruder = keyed(cluster, tmp_path, "intruder")
    writer, first = owned_log(cluster, owner_key)
    writer.close()
    url = cluster.metadata_url

    def walkit_cli(key: str, *args: str):
        return CliRunner().invoke(main, ["--key", key, *args, "--metadata", url])

    for args in (("ledger", "delete", str(first.ledger_id)), ("acl", "grant", intruder, "admin", "log", "orders"),
                 ("acl", "revoke", owner, "log", "orders"), ("log", "read", "orders"),
                 ("log", "truncate", "orders", "--before", f"{first.ledger_id + 1}:0"), ("log", "delete", "orders")):
        result = walkit_cli(intruder_key, *args)
        assert result.exit_code == 1 and "PermissionDenied" in result.output, result.output
    assert security.grants(cluster.store, "orders") == {}
    assert walkit_cli(owner_key, "acl", "grant", intruder, "read", "log", "orders").exit_code == 0
    assert walkit_cli(owner_key, "ledger", "delete", str(first.ledger_id)).exit_code == 0
    assert first.ledger_id not in cluster.client().list_ledgers()
    assert walkit_cli(owner_key, "log", "delete", "orders").exit_code == 0
    assert "orders" not in cluster.client().list_logs()


def test_a_principal_off_the_allow_list_cannot_create_a_ledger_or_claim_a_log_name(cluster, tmp_path):
    _, secret = security.new_keys(str(tmp_path / "keys"), "stranger")
    client = cluster.client(key=secret)
    for attempt in (lambda: client.create_ledger(3, 2, 2), lambda: client.open_log("orders")):
        with pytest.raises(PermissionDenied, match="not on the allow-list"):
            attempt()
    assert cluster.client().list_ledgers() == [] and cluster.client().list_logs() == []


def test_clients_allow_refuses_a_metadata_password_for_a_store_without_principal_identities(tmp_path):
    url = f"sqlite://{tmp_path / 'metadata.db'}"
    principal = "ab" * 32
    result = CliRunner().invoke(main, ["clients", "allow", principal, "--metadata-password-file",
                                       str(tmp_path / "p.zk"), "--metadata", url])
    assert result.exit_code == 2 and "needs a ZooKeeper or etcd metadata store" in result.output
    listed = CliRunner().invoke(main, ["clients", "list", "--metadata", url])
    assert principal not in listed.output and not (tmp_path / "p.zk").exists()      # nothing half done
