"""walkit.cli.logs: `walkit log append|read|tail|list|info|truncate|delete`."""

from __future__ import annotations

import json

import click

from walkit.cli.common import echo_payload, format_option, client_for, friendly, main, metadata_option, password_option
from walkit.errors import WalkitError


# -- log -------------------------------------------------------------------------------------
@main.group(name="log")
def log_group() -> None:
    """Append to, read, tail, inspect, truncate and delete logs (unbounded, single-writer)."""


@log_group.command(name="append")
@metadata_option
@password_option
@click.argument("name")
@click.argument("data", nargs=-1)
@click.option("--file", "-f", "source", type=click.File("rb"), default=None,
              help="Append the lines of this file ('-': standard input) instead of DATA.")
@click.option("--roll-entries", type=int, default=0, help="Roll to a new ledger every N records (new logs).")
@friendly
def log_append(metadata, password, name, data, source, roll_entries) -> None:
    """Append DATA (one record per argument) or lines of a file to log NAME.

    Opening the log for writing fences its previous writer. Prints each record's position
    (LEDGER:ENTRY).
    """
    payloads = [d.encode() for d in data] if source is None else [line.rstrip(b"\n") for line in source]
    with client_for(metadata) as client:
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
@friendly
def log_read(metadata, password, name, start, follow, fmt) -> None:
    """Print the records of log NAME in order: position, then payload."""
    from walkit.core.loglist import Position
    with client_for(metadata) as client:
        _print_records(client, name, Position.parse(start) if start else None, follow, password, fmt)


def _print_records(client, name: str, start, follow: bool, password: str, fmt: str) -> None:
    """_print_records prints the records of a log from `start` until its end (or Ctrl-C when following)."""
    try:
        for record in client.read_log(name, start=start, follow=follow, password=password):
            echo_payload("position", record.position, record.payload, fmt)
    except KeyboardInterrupt:
        pass


@log_group.command(name="tail")
@metadata_option
@password_option
@click.argument("name")
@format_option
@friendly
def log_tail(metadata, password, name, fmt) -> None:
    """Print records appended to log NAME from now on, as they arrive (Ctrl-C to stop)."""
    from walkit.core.loglist import Position
    with client_for(metadata) as client:
        segments = client.log_metadata(name).segments
        start = None
        if segments:
            last = segments[-1]
            if last.is_closed:
                start = Position(last.ledger_id + 1, 0)
            else:
                lac = client.open_ledger(last.ledger_id, password=password).last_add_confirmed
                start = Position(last.ledger_id, lac + 1)
        _print_records(client, name, start, True, password, fmt)


@log_group.command(name="list")
@metadata_option
@friendly
def log_list(metadata) -> None:
    """List logs with their number of ledgers."""
    with client_for(metadata) as client:
        for name in client.list_logs():
            try:
                segments = client.log_metadata(name).segments
            except WalkitError:
                continue
            click.echo(f"{name}\tledgers={len(segments)}")


@log_group.command(name="info")
@metadata_option
@click.argument("name")
@friendly
def log_info(metadata, name) -> None:
    """Print the metadata of log NAME (config and ledgers) as JSON."""
    with client_for(metadata) as client:
        click.echo(json.dumps(json.loads(client.log_metadata(name).to_bytes()), indent=2))


@log_group.command(name="truncate")
@metadata_option
@password_option
@click.argument("name")
@click.option("--before", required=True, metavar="LEDGER:ENTRY",
              help="Delete the whole ledgers that end before this position.")
@friendly
def log_truncate(metadata, password, name, before) -> None:
    """Delete the ledgers of log NAME that end before a position (this fences the log's writer)."""
    from walkit.core.loglist import Position
    with client_for(metadata) as client:
        with client.open_log(name, password=password) as writer:
            deleted = writer.truncate(before=Position.parse(before))
        click.echo(f"deleted ledgers: {', '.join(map(str, deleted)) or 'none'}")


@log_group.command(name="delete")
@metadata_option
@click.argument("name")
@friendly
def log_delete(metadata, name) -> None:
    """Delete log NAME and its ledgers (a replicated name's log: its snapshots and election too).

    It needs admin on the log: its owner, or an admin grant (`walkit acl grant`). Bookies drop the
    ledgers' data at their next garbage collection.
    """
    with client_for(metadata) as client:
        client.delete_log(name)
        click.echo(f"deleted log {name}")
