"""walkit.adapters.kv.cli is `walkit kv`: the key-value store's commands (listed in walkit.cli.ADAPTER_COMMANDS)."""

from __future__ import annotations

import logging
import re
import sys

import click

from walkit.tls import tls_options


def _store_name(ctx, param, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
        raise click.BadParameter("use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


@click.group(name="kv")
def kv() -> None:
    """A replicated key-value store on a walkit log, served over the Redis protocol."""


@kv.command()
@click.option("--port", type=int, default=6380, show_default=True, help="RESP port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="Address other servers give clients for this one when it leads [default: HOST:PORT].")
@click.option("--data-dir", default="walkit-data", show_default=True,
              help="Where the embedded cluster keeps its data (without --metadata).")
@click.option("--metadata", envvar="WALKIT_METADATA", default=None, metavar="URI",
              help="Join the cluster of this metadata store instead of running an embedded one "
                   "[env WALKIT_METADATA].")
@click.option("--bookies", type=int, default=3, show_default=True, help="Bookies of the embedded cluster.")
@click.option("--name", default="default", show_default=True, callback=_store_name,
              help="Store name: servers with the same name on one cluster replicate one store.")
@click.option("--snapshot-every", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Write a snapshot (and truncate the log) after this many records.")
@click.option("--ensemble", "-e", type=int, default=None, help="Ensemble of the log's ledgers [default: 3].")
@click.option("--write-quorum", "-w", type=int, default=None, help="Write quorum [default: 2].")
@click.option("--ack-quorum", "-a", type=int, default=None, help="Ack quorum [default: 2].")
@click.option("--roll-entries", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Start a new ledger of the log every N entries (truncation drops whole ledgers).")
@click.option("--password", default="", help="Password of the log's and snapshots' ledgers.")
@click.option("--http-port", type=int, default=None,
              help="Serve Prometheus /metrics (client append metrics), /health and /ready on this port "
                   "(0: a free one) [default: off].")
@click.option("--requirepass", envvar="WALKIT_KV_REQUIREPASS", default=None, metavar="PASSWORD",
              help="Require AUTH PASSWORD before any other command (redis-server's requirepass: the password of "
                   "the user 'default') [env WALKIT_KV_REQUIREPASS]. Other local users can see command lines: "
                   "prefer the env or --requirepass-file.")
@click.option("--requirepass-file", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="Read the requirepass password from the first line of FILE.")
@click.option("--user", "users", multiple=True, metavar="NAME:PASSWORD",
              help="A user who may log in with AUTH NAME PASSWORD, repeatable. With users and no requirepass, "
                   "connections without credentials are refused.")
@click.option("--acl-file", envvar="WALKIT_KV_ACL_FILE", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="FILE", help="Users from a Redis ACL file: lines 'user NAME on >PASSWORD' (docs/operations/"
                                   "security.md lists the rules taken) [env WALKIT_KV_ACL_FILE].")
@tls_options
@click.option("--http-tls", is_flag=True,
              help="Serve --http-port over HTTPS only, with --tls-cert (and --tls-ca: client certificates).")
def serve(http_port, http_tls, requirepass, requirepass_file, users, acl_file, tls_cert, tls_key, tls_ca,
          **options) -> None:
    """Serve a replicated key-value store over RESP, the Redis protocol, until Ctrl-C.

    redis-cli, redis-py and redis-benchmark work unchanged. Every write is appended to a walkit
    log and answered once the log acknowledged it (walkit.replicate). Without --metadata it
    runs an embedded cluster of bookie processes under --data-dir; with --metadata URI it joins
    that cluster, and servers of the same --name elect one leader: the others follow the log,
    serve (possibly stale) reads, and answer writes with READONLY naming the leader. While a
    server loads the store at start-up, data commands are answered LOADING.

    With --requirepass (or --user, --acl-file) clients must log in first, as with redis-server:
    redis-cli -a PASSWORD, or redis-cli --user NAME --pass PASSWORD.

    With --tls-cert (and --tls-key) the port speaks TLS only: redis-cli --tls --cacert CA.pem,
    redis-py ssl=True; with --tls-ca clients must also present a certificate that CA signed.

    Example: walkit kv serve, then in another terminal: redis-cli -p 6380 SET greeting hello
    """
    from walkit.adapters.kv.auth import BadUsers, load_users
    from walkit.adapters.kv.service import ServeOptions, run
    from walkit.errors import WalkitError
    from walkit.tls import BadTls, options_context
    logging.getLogger("walkit.adapters.kv").setLevel(min(logging.getLogger().level, logging.INFO))
    try:
        options["users"] = load_users(requirepass=requirepass, requirepass_file=requirepass_file, users=users,
                                      acl_file=acl_file)
        options["tls"] = options_context(tls_cert, tls_key, tls_ca)
        if http_tls and options["tls"] is None:
            raise BadTls("--http-tls needs --tls-cert")
    except (BadUsers, BadTls, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    endpoint = None
    try:
        if http_port is not None:
            from walkit.metrics import REGISTRY, HttpEndpoint, replicas_health
            endpoint = HttpEndpoint(options["host"], http_port, [REGISTRY], health=replicas_health,
                                    tls=options["tls"] if http_tls else None)
            click.echo(f"metrics on {endpoint.scheme}://{endpoint.address}/metrics", err=True)
        status = run(ServeOptions(**options), echo=lambda line: click.echo(line, err=True))
    except (WalkitError, OSError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    finally:
        if endpoint is not None:
            endpoint.close()
    sys.exit(status)
