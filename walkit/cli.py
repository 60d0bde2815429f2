"""walkit.cli is the `walkit` command line (click).

Every command that needs a cluster takes `--metadata URI` (or WALKIT_METADATA); without it, it
uses the embedded default under ./walkit-data, the one `walkit local` runs.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time

import click

from walkit.errors import WalkitError

DEFAULT_DATA_DIR = "walkit-data"


def default_metadata() -> str:
    """default_metadata is the embedded cluster's metadata URI under ./walkit-data."""
    return f"sqlite://{os.path.abspath(os.path.join(DEFAULT_DATA_DIR, 'metadata.db'))}"


def _friendly(fn):
    """_friendly turns walkit errors into one-line messages and exit status 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WalkitError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    return wrapper


metadata_option = click.option(
    "--metadata", "metadata", envvar="WALKIT_METADATA", default=None, metavar="URI",
    help="Metadata store: sqlite:///path, zk://host:port/root or etcd://host:port/root "
         "[env WALKIT_METADATA; default: the embedded cluster under ./walkit-data].")
password_option = click.option("--password", default="", help="Ledger password.")


def _client(metadata: str | None):
    from walkit.client.api import Client
    return Client(metadata or default_metadata())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """walkit: a replicated write-ahead log (Apache BookKeeper's protocol in Python).

    Start an embedded cluster with `walkit local`, then create, append to and read ledgers
    from another terminal. Every command has --help.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


# -- bookie ----------------------------------------------------------------------------------
@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML file with bookie settings (keys as below, with underscores); flags override it.")
@metadata_option
@click.option("--storage", default=None, metavar="URI",
              help="Entry storage: files:///dir, sqlite:///path/bookie.db or memory:// "
                   "[default: files under ./walkit-data/bookie-PORT].")
@click.option("--host", default=None, help="Interface to listen on [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="TCP port; 0 picks a free one [default: 3181].")
@click.option("--max-frame-bytes", type=int, default=None,
              help="Largest request frame accepted; larger ones get BAD_REQUEST [default: 64 MiB].")
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
@click.option("--exit-with-parent", is_flag=True, hidden=True,
              help="Exit when the parent process dies (used by LocalCluster).")
@_friendly
def bookie(config_path, metadata, exit_with_parent, **flags) -> None:
    """Run one bookie (a storage server) until SIGTERM or Ctrl-C.

    The bookie registers itself in the metadata store, serves adds and reads on a ZeroMQ ROUTER
    socket at HOST:PORT, acknowledges an add only once its storage synced it (one sync per
    group of requests), turns read-only when its disk fills up, and deletes the data of
    ledgers whose metadata is gone. Settings come from --config, then the flags.
    """
    from walkit.bookie.server import BookieConfig, BookieServer
    logging.getLogger("walkit").setLevel(min(logging.getLogger().level, logging.INFO))
    config = BookieConfig.load(config_path, defaults={"metadata": default_metadata()}, metadata=metadata,
                               parent_pid=os.getppid() if exit_with_parent else None, **flags)
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
@_friendly
def local(bookies, data_dir, storage, metadata, demo) -> None:
    """Run an embedded cluster: BOOKIES bookie processes and a metadata store, until Ctrl-C."""
    from walkit.local import LocalCluster
    with LocalCluster(bookies=bookies, data_dir=data_dir, storage=storage, metadata=metadata) as cluster:
        click.echo(f"walkit local cluster: {bookies} bookies at {', '.join(cluster.addresses)}")
        click.echo(f"metadata: {cluster.metadata_url}")
        if demo:
            _demo(cluster.metadata_url, bookies)
        try:
            # Inside the try: a Ctrl-C right after this line is a clean stop too, not "Aborted!".
            click.echo("Ctrl-C to stop.")
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            click.echo("stopping")


def _demo(metadata_url: str, bookies: int = 3) -> None:
    from walkit.client.api import Client
    ensemble = min(3, bookies)                  # the demo runs on clusters of 1 or 2 bookies too
    with Client(metadata_url) as client:
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


# -- ledger ----------------------------------------------------------------------------------
@main.group()
def ledger() -> None:
    """Create, append to, read, inspect, list and delete ledgers."""


def _quorum_options(fn):
    for option in reversed([
        click.option("--ensemble", "-e", type=int, default=3, show_default=True, help="Ensemble size E."),
        click.option("--write-quorum", "-w", type=int, default=2, show_default=True, help="Write quorum Qw."),
        click.option("--ack-quorum", "-a", type=int, default=2, show_default=True, help="Ack quorum Qa."),
        click.option("--digest", type=click.Choice(["crc32c", "hmac-sha256", "none"]), default="crc32c",
                     show_default=True, help="Entry digest."),
    ]):
        fn = option(fn)
    return fn


def _write_ledger(metadata, ensemble, write_quorum, ack_quorum, digest, password, payloads) -> tuple[int, int]:
    with _client(metadata) as client:
        writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=password, digest=digest)
        futures = [writer.append_async(p) for p in payloads]
        for future in futures:
            future.result()
        writer.close()
        return writer.ledger_id, len(futures)


@ledger.command()
@metadata_option
@password_option
@_quorum_options
@click.argument("data", nargs=-1)
@_friendly
def create(metadata, password, ensemble, write_quorum, ack_quorum, digest, data) -> None:
    """Create a ledger holding DATA (one entry per argument; none: empty) and close it.

    Prints the new ledger id. Ledgers have a single writer and cannot be reopened for
    writing, so every ledger written from the command line is written by one command.
    """
    ledger_id, count = _write_ledger(metadata, ensemble, write_quorum, ack_quorum, digest, password,
                                     [d.encode() for d in data])
    click.echo(ledger_id)


@ledger.command()
@metadata_option
@password_option
@_quorum_options
@click.option("--file", "-f", "source", type=click.File("rb"), default="-", show_default=True,
              help="Read entries from this file, one per line ('-': standard input).")
@_friendly
def append(metadata, password, ensemble, write_quorum, ack_quorum, digest, source) -> None:
    """Append the lines of a file or stdin, one entry each, to a new ledger, then close it.

    The appends are pipelined. Prints the ledger id and the number of entries on stderr.
    Example: seq 1000 | walkit ledger append
    """
    payloads = [line.rstrip(b"\n") for line in source]
    ledger_id, count = _write_ledger(metadata, ensemble, write_quorum, ack_quorum, digest, password, payloads)
    click.echo(ledger_id)
    click.echo(f"appended {count} entries to ledger {ledger_id}", err=True)


@ledger.command()
@metadata_option
@password_option
@click.argument("ledger_id", type=int)
@click.option("--first", type=int, default=0, show_default=True, help="First entry to read.")
@click.option("--last", type=int, default=None, help="Last entry to read [default: the last confirmed one].")
@click.option("--recover", is_flag=True, help="Fence and recover the ledger first (stops its writer).")
@click.option("--format", "fmt", type=click.Choice(["text", "hex", "json"]), default="text", show_default=True)
@_friendly
def read(metadata, password, ledger_id, first, last, recover, fmt) -> None:
    """Print the entries of LEDGER_ID, one per line: entry id, then payload."""
    with _client(metadata) as client:
        reader = client.open_ledger(ledger_id, password=password, recover=recover)
        for entry in reader.read(first, last):
            if fmt == "json":
                click.echo(json.dumps({"entry_id": entry.entry_id,
                                       "payload": entry.payload.decode("utf-8", "backslashreplace")}))
            elif fmt == "hex":
                click.echo(f"{entry.entry_id}\t{entry.payload.hex()}")
            else:
                click.echo(f"{entry.entry_id}\t{entry.payload.decode('utf-8', 'backslashreplace')}")


@ledger.command()
@metadata_option
@click.argument("ledger_id", type=int)
@_friendly
def info(metadata, ledger_id) -> None:
    """Print the metadata of LEDGER_ID as JSON."""
    with _client(metadata) as client:
        click.echo(json.dumps(json.loads(client.ledger_metadata(ledger_id).to_bytes()), indent=2))


@ledger.command(name="list")
@metadata_option
@_friendly
def list_ledgers(metadata) -> None:
    """List ledger ids with their state and last entry."""
    with _client(metadata) as client:
        for ledger_id in client.list_ledgers():
            try:
                md = client.ledger_metadata(ledger_id)
            except WalkitError:
                continue            # deleted while listing
            last = "-" if md.last_entry_id is None else md.last_entry_id
            click.echo(f"{ledger_id}\t{md.state}\tlast={last}\tE={md.ensemble_size} Qw={md.write_quorum} "
                       f"Qa={md.ack_quorum}")


@ledger.command()
@metadata_option
@click.argument("ledger_id", type=int)
@_friendly
def delete(metadata, ledger_id) -> None:
    """Delete LEDGER_ID; bookies drop its data at their next garbage collection."""
    with _client(metadata) as client:
        client.delete_ledger(ledger_id)
        click.echo(f"deleted ledger {ledger_id}")


# -- log -------------------------------------------------------------------------------------
@main.group(name="log")
def log_group() -> None:
    """Append to, read, tail, inspect and truncate logs (unbounded, single-writer)."""


def _print_record(record, fmt: str) -> None:
    payload = record.payload
    if fmt == "json":
        click.echo(json.dumps({"position": str(record.position),
                               "payload": payload.decode("utf-8", "backslashreplace")}))
    elif fmt == "hex":
        click.echo(f"{record.position}\t{payload.hex()}")
    else:
        click.echo(f"{record.position}\t{payload.decode('utf-8', 'backslashreplace')}")


format_option = click.option("--format", "fmt", type=click.Choice(["text", "hex", "json"]), default="text",
                             show_default=True, help="How payloads are printed.")


@log_group.command(name="append")
@metadata_option
@password_option
@click.argument("name")
@click.argument("data", nargs=-1)
@click.option("--file", "-f", "source", type=click.File("rb"), default=None,
              help="Append the lines of this file ('-': standard input) instead of DATA.")
@click.option("--roll-entries", type=int, default=0, help="Roll to a new ledger every N records (new logs).")
@_friendly
def log_append(metadata, password, name, data, source, roll_entries) -> None:
    """Append DATA (one record per argument) or lines of a file to log NAME.

    Opening the log for writing fences its previous writer. Prints each record's position
    (LEDGER:ENTRY).
    """
    payloads = [d.encode() for d in data] if source is None else [line.rstrip(b"\n") for line in source]
    with _client(metadata) as client:
        options = {"roll_entries": roll_entries} if roll_entries else {}
        with client.open_log(name, password=password, **options) as writer:
            futures = [writer.append_async(p) for p in payloads]
            for future in futures:
                click.echo(str(future.result()))


@log_group.command(name="read")
@metadata_option
@password_option
@click.argument("name")
@click.option("--from", "start", default=None, metavar="LEDGER:ENTRY", help="Start at this position.")
@click.option("--follow", is_flag=True, help="Keep reading new records as they are appended (Ctrl-C to stop).")
@format_option
@_friendly
def log_read(metadata, password, name, start, follow, fmt) -> None:
    """Print the records of log NAME in order: position, then payload."""
    from walkit.core.log import Position
    with _client(metadata) as client:
        position = Position.parse(start) if start else None
        try:
            for record in client.read_log(name, start=position, follow=follow, password=password):
                _print_record(record, fmt)
        except KeyboardInterrupt:
            pass


@log_group.command(name="tail")
@metadata_option
@password_option
@click.argument("name")
@format_option
@_friendly
def log_tail(metadata, password, name, fmt) -> None:
    """Print records appended to log NAME from now on, as they arrive (Ctrl-C to stop)."""
    from walkit.core.log import Position
    with _client(metadata) as client:
        segments = client.log_metadata(name).segments
        start = None
        if segments:
            last = segments[-1]
            if last.is_closed:
                start = Position(last.ledger_id + 1, 0)
            else:
                lac = client.open_ledger(last.ledger_id, password=password).last_add_confirmed
                start = Position(last.ledger_id, lac + 1)
        try:
            for record in client.read_log(name, start=start, follow=True, password=password):
                _print_record(record, fmt)
        except KeyboardInterrupt:
            pass


@log_group.command(name="list")
@metadata_option
@_friendly
def log_list(metadata) -> None:
    """List logs with their number of ledgers."""
    with _client(metadata) as client:
        for name in client.list_logs():
            try:
                segments = client.log_metadata(name).segments
            except WalkitError:
                continue
            click.echo(f"{name}\tledgers={len(segments)}")


@log_group.command(name="info")
@metadata_option
@click.argument("name")
@_friendly
def log_info(metadata, name) -> None:
    """Print the metadata of log NAME (config and ledgers) as JSON."""
    with _client(metadata) as client:
        click.echo(json.dumps(json.loads(client.log_metadata(name).to_bytes()), indent=2))


@log_group.command(name="truncate")
@metadata_option
@password_option
@click.argument("name")
@click.option("--before", required=True, metavar="LEDGER:ENTRY",
              help="Delete the whole ledgers that end before this position.")
@_friendly
def log_truncate(metadata, password, name, before) -> None:
    """Delete the ledgers of log NAME that end before a position (this fences the log's writer)."""
    from walkit.core.log import Position
    with _client(metadata) as client:
        with client.open_log(name, password=password) as writer:
            deleted = writer.truncate(before=Position.parse(before))
        click.echo(f"deleted ledgers: {', '.join(map(str, deleted)) or 'none'}")


# -- bench -----------------------------------------------------------------------------------
@main.command()
@click.option("--bookies", type=int, default=3, show_default=True, help="Bookie processes.")
@click.option("--ensemble", "-e", type=int, default=3, show_default=True, help="Ensemble size E.")
@click.option("--write-quorum", "-w", type=int, default=2, show_default=True, help="Write quorum Qw.")
@click.option("--ack-quorum", "-a", type=int, default=2, show_default=True, help="Ack quorum Qa.")
@click.option("--size", type=int, default=1024, show_default=True, help="Payload bytes per entry.")
@click.option("--entries", type=int, default=50000, show_default=True, help="Appends in the throughput phase.")
@click.option("--window", type=int, default=1000, show_default=True, help="Appends in flight.")
@click.option("--storage", default="files", show_default=True, help="Bookie storage: files, sqlite, memory.")
@click.option("--runs", type=int, default=3, show_default=True, help="Runs per phase; medians are reported.")
@click.option("--peers", default="", metavar="LIST",
              help="Also run peers through the same harness: comma-separated etcd,nats,zookeeper.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw throughput over time and latency to this PNG (needs matplotlib).")
@_friendly
def bench(bookies, ensemble, write_quorum, ack_quorum, size, entries, window, storage, runs, peers,
          json_path, plot_path) -> None:
    """Benchmark appends (throughput, latency), catch-up reads and recovery on a LocalCluster.

    Every phase runs RUNS times on fresh bookie processes; medians are printed. With --peers,
    etcd (3 members), NATS JetStream (R3) and ZooKeeper run the same appends, back to back, and
    a table of ratios is printed.
    """
    from walkit import bench as harness
    config = harness.BenchConfig(bookies=bookies, ensemble=ensemble, write_quorum=write_quorum,
                                 ack_quorum=ack_quorum, size=size, entries=entries, window=window,
                                 storage=storage, runs=runs)
    config.validate()
    total = runs * (entries + config.latency_entries)
    with click.progressbar(length=total, label="walkit appends", file=sys.stderr) as bar:
        result = harness.run(config, progress=bar.update)
    if peers:
        from walkit.bench_peers import run_peers
        result["peers"] = run_peers([p.strip() for p in peers.split(",") if p.strip()], config)
    for line in harness.summary_lines(result):
        click.echo(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    if plot_path:
        harness.plot(result, plot_path)
        click.echo(f"plot: {plot_path}")


# -- bookies, plugins ------------------------------------------------------------------------
@main.group()
def bookies() -> None:
    """Inspect the registered bookies."""


@bookies.command(name="list")
@metadata_option
@_friendly
def list_bookies(metadata) -> None:
    """List live bookies: address, mode and storage."""
    with _client(metadata) as client:
        live = client.bookies()
        if not live:
            click.echo("no live bookies (start some with `walkit local` or `walkit bookie`)", err=True)
        for address, info in sorted(live.items()):
            click.echo(f"{address}\t{'read-only' if info.read_only else 'writable'}\t{info.storage}")


@main.command()
def plugins() -> None:
    """List the installed storage and metadata plugins (URI schemes)."""
    from walkit.plugins import METADATA_GROUP, STORAGE_GROUP, available
    for title, group in (("storage", STORAGE_GROUP), ("metadata", METADATA_GROUP)):
        click.echo(f"{title}:")
        for scheme, entry_point in sorted(available(group).items()):
            click.echo(f"  {scheme}://\t{entry_point.value}")


from walkit.adapters.kv.cli import kv as _kv  # noqa: E402 - the key-value store's commands
main.add_command(_kv)


if __name__ == "__main__":
    main(sys.argv[1:])
