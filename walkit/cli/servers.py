"""walkit.cli.servers: `walkit bookie`, `walkit local`, `walkit bookies list` and `walkit plugins`."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict

import click

from walkit.cli.common import DEFAULT_DATA_DIR, client_for, default_metadata, friendly, main, metadata_option


# -- bookie ----------------------------------------------------------------------------------
@main.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML file with bookie settings (keys as below, with underscores); flags override it.")
@metadata_option
@click.option("--storage", default=None, metavar="URI",
              help="Entry storage: files:///dir, sqlite:///path/bookie.db or memory:// "
                   "[default: files under ./walkit-data/bookie-PORT].")
@click.option("--host", default=None, help="Interface to listen on [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="TCP port; 0 picks a free one [default: 3181].")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Interface and port to listen on in one value (--host and --port; it wins over them); "
                   "0.0.0.0:3181 listens on every interface (with --advertise when the metadata store is on "
                   "another machine).")
@click.option("--advertise", default=None, metavar="HOST[:PORT]",
              help="Address registered for clients to dial, when it is not --host:--port (--host 0.0.0.0, "
                   "containers, NAT); the port defaults to --port [default: --host:--port; with --host 0.0.0.0, "
                   "127.0.0.1 if the metadata store is local, else the bookie refuses to start].")
@click.option("--bookie-id", default=None, metavar="ID",
              help="The name ledgers know this bookie by (BookKeeper's bookie id): letters, digits and . _ - : "
                   "only. It stays when the address changes, so a bookie restarted elsewhere with its storage "
                   "keeps its ledgers [default: the id its storage was formatted with; on a new storage, the "
                   "advertised address].")
@click.option("--max-frame-bytes", type=int, default=None,
              help="Largest request frame accepted; larger ones get BAD_REQUEST [default: 64 MiB].")
@click.option("--max-requests-per-frame", type=int, default=None,
              help="Most requests one frame may hold; more get TOO_MANY_REQUESTS [default: 4096].")
@click.option("--max-long-poll-ms", type=int, default=None,
              help="Longest a long-poll read is held; longer timeouts are shortened [default: 60000].")
@click.option("--max-long-polls", type=int, default=None,
              help="Long polls waiting at once; one more gets TOO_MANY_REQUESTS [default: 10000].")
@click.option("--max-batch-frames", type=int, default=None,
              help="Most frames taken per group commit round [default: 1024].")
@click.option("--group-wait-ms", type=float, default=None,
              help="After the first add of a group, wait this long for more before the sync "
                   "(BookKeeper's journalMaxGroupWaitMSec) [default: 0].")
@click.option("--group-max-entries", type=int, default=None,
              help="Stop waiting once this many entries await the sync [default: 20000].")
@click.option("--gc-interval", "gc_interval_s", type=float, default=None,
              help="Seconds between garbage collections of deleted ledgers and compactions [default: 60].")
@click.option("--disk-usage-threshold", type=float, default=None,
              help="Fraction of the disk in use at which the bookie turns read-only [default: 0.95].")
@click.option("--disk-usage-lwm", type=float, default=None,
              help="Fraction of the disk in use below which it is writable again [default: 0.90].")
@click.option("--disk-check-interval", "disk_check_interval_s", type=float, default=None,
              help="Seconds between disk usage checks [default: 5].")
@click.option("--disk-min-free-mb", type=float, default=None,
              help="Megabytes that must stay free: with less the bookie turns read-only, and it is "
                   "writable again with twice as much (and below --disk-usage-lwm) [default: 64].")
@click.option("--curve-key", default=None, metavar="FILE",
              help="Secure the bookie with this CurveZMQ key pair (a NAME.key_secret file from `walkit keys new`): "
                   "only clients on the allow-list connect, and each may use only the ledgers it is granted "
                   "[default: no security].")
@click.option("--rack", default=None, metavar="NAME",
              help="Rack or zone of this bookie; ensembles spread write sets over racks [default: none].")
@click.option("--http-port", type=int, default=None,
              help="Serve Prometheus /metrics, /health and /ready on this port (0: a free one) [default: off].")
@click.option("--autorecovery/--no-autorecovery", default=None,
              help="Run an auditor candidate and a replication worker in the bookie [default: on].")
@click.option("--lost-bookie-delay", type=float, default=None, metavar="SECONDS",
              help="A bookie unregistered this long is lost and its data re-replicated [default: 60].")
@click.option("--open-ledger-grace", type=float, default=None, metavar="SECONDS",
              help="How long an unclosed ledger's writer may keep a lost bookie before the ledger is "
                   "recovered [default: 30].")
@click.option("--audit-rate", type=float, default=None,
              help="Metadata reads per second the auditor may make [default: 500].")
@click.option("--periodic-check-interval", type=float, default=None, metavar="SECONDS",
              help="Seconds between the auditor's checks of every ledger; 0: never [default: 86400].")
@click.option("--verify-fraction", type=float, default=None,
              help="Share of entries the periodic check reads besides each fragment's first and last [default: 0].")
@click.option("--recovery-password", "recovery_passwords", multiple=True, default=None, metavar="PASSWORD",
              help="A ledger password re-replication may use (repeat for several) [default: the empty password].")
@click.option("--min-racks", type=int, default=None,
              help="Racks each write set must span after a re-replication [default: 1].")
@click.option("--exit-with-parent", is_flag=True, hidden=True,
              help="Exit when the parent process dies (used by LocalCluster).")
@click.pass_context
@friendly
def bookie(ctx, config_path, metadata, exit_with_parent, recovery_passwords, **flags) -> None:
    """Run one bookie (a storage server) until SIGTERM or Ctrl-C.

    The bookie registers itself in the metadata store, serves adds and reads on a ZeroMQ ROUTER
    socket at HOST:PORT, acknowledges an add only once its storage synced it (one sync per
    group of requests), turns read-only when its disk fills up, and deletes the data of
    ledgers whose metadata is gone. Settings come from --config, then the flags.

    Unless --no-autorecovery, the bookie also takes part in auto-recovery: one bookie of the
    cluster is elected auditor and marks the ledgers of bookies lost for --lost-bookie-delay
    seconds, and every bookie's worker copies their entries to new bookies.

    `walkit bookie sanity` checks running bookies instead (see its --help).
    """
    if ctx.invoked_subcommand is not None:
        return
    from walkit.bookie.server import BookieConfig, BookieServer
    logging.getLogger("walkit").setLevel(min(logging.getLogger().level, logging.INFO))
    config = BookieConfig.load(config_path, defaults={"metadata": default_metadata()}, metadata=metadata,
                               parent_pid=os.getppid() if exit_with_parent else None,
                               recovery_passwords=list(recovery_passwords) or None, **flags)
    server = BookieServer(config)
    server.serve_forever()
    if server.failed is not None:
        raise click.ClickException(f"storage failed: {server.failed}")


# -- local -----------------------------------------------------------------------------------
@main.command()
@click.option("--bookies", type=int, default=3, show_default=True, help="Number of bookie processes.")
@click.option("--data-dir", default=DEFAULT_DATA_DIR, show_default=True, help="Where the cluster keeps its data.")
@click.option("--storage", default="files", show_default=True,
              help="Bookie storage: files, sqlite, memory, or a storage URI ({i} = bookie index).")
@click.option("--metadata", default="sqlite", show_default=True,
              help="'sqlite' (a file in --data-dir) or a metadata URI.")
@click.option("--demo", is_flag=True, help="Write a ledger and read it back once the cluster is up.")
@click.option("--security", is_flag=True,
              help="Run the bookies with CurveZMQ and an allow-list; prints the client key pair to use "
                   "(walkit --key FILE ...). Off by default.")
@friendly
def local(bookies, data_dir, storage, metadata, demo, security) -> None:
    """Run an embedded cluster: BOOKIES bookie processes and a metadata store, until Ctrl-C."""
    from walkit.local import LocalCluster
    with LocalCluster(bookies=bookies, data_dir=data_dir, storage=storage, metadata=metadata,
                      security=security) as cluster:
        click.echo(f"walkit local cluster: {bookies} bookies at {', '.join(cluster.addresses)}")
        from walkit.plugins.metadata.credentials import redact
        click.echo(f"metadata: {redact(cluster.metadata_url)}")
        if security:
            click.echo(f"security: on; client key pair {cluster.client_key} "
                       f"(walkit --key {cluster.client_key} ...)")
        if demo:
            _demo(cluster.metadata_url, bookies, cluster.client_key)
        try:
            # Inside the try: a Ctrl-C right after this line is a clean stop too, not "Aborted!".
            click.echo("Ctrl-C to stop.")
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            click.echo("stopping")


def _demo(metadata_url: str, bookies: int = 3, key: str | None = None) -> None:
    from walkit.client.api import Client
    ensemble = min(3, bookies)                  # the demo runs on clusters of 1 or 2 bookies too
    with Client(metadata_url, key=key) as client:
        writer = client.create_ledger(ensemble=ensemble, write_quorum=min(2, ensemble),
                                      ack_quorum=min(2, ensemble), password=b"demo")
        started = time.perf_counter()
        futures = [writer.append_async(f"entry {i}".encode()) for i in range(1000)]
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - started
        writer.close()
        click.echo(f"demo: wrote 1000 entries to ledger {writer.ledger_id} in {elapsed * 1000:.0f} ms "
                   f"({1000 / elapsed:,.0f} entries/s)")
        reader = client.open_ledger(writer.ledger_id, password=b"demo")
        entries = list(reader.read())
        click.echo(f"demo: read back {len(entries)} entries; first {entries[0].payload!r}, "
                   f"last {entries[-1].payload!r}")
        ensembles = client.ledger_metadata(writer.ledger_id).ensembles
        click.echo(f"demo: ledger {writer.ledger_id} is CLOSED on bookies {', '.join(ensembles[0])}")


# -- bookies, plugins ------------------------------------------------------------------------
@main.group()
def bookies() -> None:
    """Inspect, check and decommission the bookies."""


def bookie_mode(info) -> str:
    """bookie_mode is how a registration reads: writable, read-only or draining (being decommissioned)."""
    return "draining" if info.draining else "read-only" if info.read_only else "writable"


@bookies.command(name="list")
@metadata_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of text.")
@friendly
def list_bookies(metadata, as_json) -> None:
    """List live bookies: id, mode, storage, rack and the address clients dial.

    A bookie's id is what ledgers name it by (by default the address it first advertised); the
    last column is where it listens now (`walkit bookie --advertise`).
    """
    with client_for(metadata) as client:
        live = client.bookies()
        if as_json:
            click.echo(json.dumps([{**asdict(info), "mode": bookie_mode(info)} for _, info in sorted(live.items())]))
            return
        if not live:
            click.echo("no live bookies (start some with `walkit local` or `walkit bookie`)", err=True)
        for address, info in sorted(live.items()):
            click.echo(f"{address}\t{bookie_mode(info)}\t{info.storage}\t{info.rack or '-'}\t{info.dial}")


@main.command()
def plugins() -> None:
    """List the installed storage and metadata plugins (URI schemes)."""
    from walkit.plugins import METADATA_GROUP, STORAGE_GROUP, available
    for title, group in (("storage", STORAGE_GROUP), ("metadata", METADATA_GROUP)):
        click.echo(f"{title}:")
        for scheme, entry_point in sorted(available(group).items()):
            click.echo(f"  {scheme}://\t{entry_point.value}")
