"""walkit.cli.security: `walkit keys`, `walkit clients` and `walkit acl` (walkit.security)."""

from __future__ import annotations

import click

from walkit.cli.common import friendly, main, metadata_option


def _store(metadata: str | None):
    from walkit.cli.common import default_metadata
    from walkit.plugins import open_metadata
    return open_metadata(metadata or default_metadata())


def _check_grantor(store, name: str) -> None:
    """_check_grantor refuses a grant change by a caller with a key (`--key`, WALKIT_KEY) that lacks admin
    on log NAME. Without a key the caller is the operator, whose authority is the metadata store's
    own credentials (docs/operations/security.md)."""
    import os
    key = os.environ.get("WALKIT_KEY")
    if not key:
        return
    from walkit.permissions import check_log
    from walkit.security import principal_of
    check_log(store, principal_of(key), name, "grant")


# -- keys ------------------------------------------------------------------------------------------
@main.group()
def keys() -> None:
    """CurveZMQ key pairs: every secured bookie and every client of a secured cluster has one."""


@keys.command("new")
@click.argument("name")
@click.option("--dir", "directory", default=".", show_default=True, help="Where to write the two files.")
@friendly
def keys_new(name: str, directory: str) -> None:
    """Write a key pair: NAME.key (public) and NAME.key_secret (keep it private, mode 0600).

    Give a bookie its NAME.key_secret with `walkit bookie --curve-key`; give a client its own with
    `--key` (or walkit.Client(url, key=...)), and allow the client's principal with
    `walkit clients allow`.
    """
    from walkit.security import new_keys, principal_of
    public, secret = new_keys(directory, name)
    click.echo(f"public key: {public}\nsecret key: {secret}\nprincipal:  {principal_of(public)}")


@keys.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@friendly
def keys_show(path: str) -> None:
    """Print the principal (the public key in hex) of a NAME.key or NAME.key_secret file."""
    from walkit.security import principal_of
    click.echo(principal_of(path))


# -- the allow-list -----------------------------------------------------------------------------------
@main.group()
def clients() -> None:
    """The allow-list: the clients secured bookies accept (changes apply without restarts)."""


@clients.command("allow")
@click.argument("principal")
@click.option("--name", default="", help="A label for this client.")
@click.option("--metadata-password-file", type=click.Path(dir_okay=False),
              help="ZooKeeper and etcd: give the client a metadata user of its own, PRINCIPAL, with the password "
                   "in this file (written, mode 0600, if it does not exist); the store then enforces the client's "
                   "permissions too. The client connects with zk://PRINCIPAL@HOSTS/ROOT?password_file=FILE or "
                   "etcd://PRINCIPAL@HOST:PORT/ROOT?password_file=FILE. etcd needs the --metadata user to hold "
                   "etcd's root role.")
@metadata_option
@friendly
def clients_allow(principal: str, name: str, metadata_password_file: str | None, metadata: str | None) -> None:
    """Let the client with this PRINCIPAL (`walkit keys show FILE`) connect to the bookies."""
    from walkit.security import allow
    store = _store(metadata)
    try:
        if metadata_password_file and not hasattr(store, "principal_identity"):
            scheme = str(getattr(store, "uri", "")).partition(":")[0] or type(store).__name__
            raise click.UsageError(f"--metadata-password-file needs a ZooKeeper or etcd metadata store (this one is "
                                   f"{scheme}); see docs/operations/security.md#permissions")
        if metadata_password_file:
            store.check_principal_identities()         # before the allow-list changes: nothing half done
        allow(store, principal, name)
        if metadata_password_file:
            store.principal_identity(principal, _password_file(metadata_password_file))
        scheme = getattr(store, "backend", "zk")
    finally:
        store.close()
    click.echo(f"allowed {principal}")
    if metadata_password_file:
        where = "etcd://{p}@HOST:PORT/ROOT" if scheme == "etcd" else "zk://{p}@HOSTS/ROOT"
        click.echo(f"its {'etcd' if scheme == 'etcd' else 'ZooKeeper'} user is {principal}, password in "
                   f"{metadata_password_file}: {where.format(p=principal)}?password_file={metadata_password_file}")


def _password_file(path: str) -> str:
    """_password_file reads the password in `path`, or writes a new random one there (mode 0600)."""
    import os
    import secrets
    from walkit.plugins.metadata.credentials import read_password_file
    if os.path.exists(path):
        return read_password_file(path)
    password = secrets.token_hex(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password


@clients.command("revoke")
@click.argument("principal")
@metadata_option
@friendly
def clients_revoke(principal: str, metadata: str | None) -> None:
    """Refuse this PRINCIPAL from now on, also on the connections it has open."""
    from walkit.security import disallow
    store = _store(metadata)
    try:
        led = _names_written_by(store, principal)      # read while it is allowed: what it may write
        disallow(store, principal)
        if hasattr(store, "refresh_acls"):
            store.refresh_acls(forget=principal)        # principal mode: its ACL entries (etcd: its role) go too
        for name in led:
            _depose(store, name)
    finally:
        store.close()
    click.echo(f"revoked {principal}")


@clients.command("list")
@metadata_option
@friendly
def clients_list(metadata: str | None) -> None:
    """List the allowed principals and their labels."""
    from walkit.security import allowed
    store = _store(metadata)
    try:
        for principal, name in sorted(allowed(store).items()):
            click.echo(f"{principal}\t{name}")
    finally:
        store.close()


# -- ACLs -------------------------------------------------------------------------------------------
@main.group()
def acl() -> None:
    """Permissions on logs: read, write or admin, per principal (owners hold admin)."""


@acl.command("grant")
@click.argument("principal")
@click.argument("level", type=click.Choice(["read", "write", "admin"]))
@click.argument("kind", type=click.Choice(["log"]))
@click.argument("name")
@metadata_option
@friendly
def acl_grant(principal: str, level: str, kind: str, name: str, metadata: str | None) -> None:
    """Grant PRINCIPAL LEVEL on log NAME and its ledgers: `walkit acl grant P read log orders`."""
    from walkit.security import grant
    store = _store(metadata)
    try:
        _check_grantor(store, name)
        grant(store, principal, level, name)
        if hasattr(store, "refresh_acls"):
            store.refresh_acls(log=name)                # principal mode: the log's ACLs (etcd: roles) follow
        if level == "read":
            _depose(store, name)
    finally:
        store.close()
    click.echo(f"granted {level} on log {name} to {principal}")


def _names_written_by(store, principal: str) -> list[str]:
    """_names_written_by lists the replicated names' logs `principal` may write (its own, its write grants)."""
    from walkit.client.log import list_logs
    from walkit.permissions import REPLICATED_PREFIX, writes
    return [name for name in list_logs(store) if name.startswith(REPLICATED_PREFIX) and writes(store, principal, name)]


def _depose(store, name: str) -> None:
    """_depose ends the election of replicated name log `name` once a principal may no longer write it: its node
    could hold the election for as long as its session lives. The candidates that may still write campaign again."""
    from walkit.election import depose
    from walkit.permissions import REPLICATED_PREFIX
    if name.startswith(REPLICATED_PREFIX) and depose(store, f"replication/{name[len(REPLICATED_PREFIX):]}"):
        click.echo(f"the election of replicated name {name[len(REPLICATED_PREFIX):]} starts again")


@acl.command("revoke")
@click.argument("principal")
@click.argument("kind", type=click.Choice(["log"]))
@click.argument("name")
@metadata_option
@friendly
def acl_revoke(principal: str, kind: str, name: str, metadata: str | None) -> None:
    """Take back what PRINCIPAL was granted on log NAME."""
    from walkit.security import revoke
    store = _store(metadata)
    try:
        _check_grantor(store, name)
        revoke(store, principal, name)
        if hasattr(store, "refresh_acls"):
            store.refresh_acls(log=name)
        _depose(store, name)
    finally:
        store.close()
    click.echo(f"revoked {principal} on log {name}")


@acl.command("list")
@click.argument("kind", type=click.Choice(["log"]))
@click.argument("name")
@metadata_option
@friendly
def acl_list(kind: str, name: str, metadata: str | None) -> None:
    """List who holds what on log NAME (its owner first)."""
    from walkit.client.log import read_log_metadata
    from walkit.security import grants
    store = _store(metadata)
    try:
        try:
            owner = read_log_metadata(store, name)[0].owner
        except Exception:  # noqa: BLE001 - a log not created yet has no owner
            owner = ""
        if owner:
            click.echo(f"{owner}\towner")
        for principal, level in sorted(grants(store, name).items()):
            click.echo(f"{principal}\t{level}")
    finally:
        store.close()
