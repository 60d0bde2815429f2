"""walkit.cli.ledgers: `walkit ledger create|append|read|info|list|delete`."""

from __future__ import annotations

import json

import click

from walkit.cli.common import echo_payload, format_option, client_for, friendly, main, metadata_option, password_option
from walkit.errors import WalkitError


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
    with client_for(metadata) as client:
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
@friendly
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
@friendly
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
@format_option
@click.option("--json", "as_json", is_flag=True, help="Same as --format json: one JSON object per entry.")
@friendly
def read(metadata, password, ledger_id, first, last, recover, fmt, as_json) -> None:
    """Print the entries of LEDGER_ID, one per line: entry id, then payload."""
    fmt = "json" if as_json else fmt
    with client_for(metadata) as client:
        reader = client.open_ledger(ledger_id, password=password, recover=recover)
        for entry in reader.read(first, last):
            echo_payload("entry_id", entry.entry_id, entry.payload, fmt)


@ledger.command()
@metadata_option
@click.argument("ledger_id", type=int)
@click.option("--json", "as_json", is_flag=True,
              help="One line of JSON: the metadata, each fragment's entry range, and the ledger's "
                   "under-replication mark (null if none).")
@friendly
def info(metadata, ledger_id, as_json) -> None:
    """Print the metadata of LEDGER_ID as JSON (indented; --json: one line with more detail)."""
    with client_for(metadata) as client:
        md = client.ledger_metadata(ledger_id)
        doc = json.loads(md.to_bytes())
        if not as_json:
            click.echo(json.dumps(doc, indent=2))
            return
        from walkit.autorecovery import UnderReplication
        starts = md.fragment_starts
        ends = [s - 1 for s in starts[1:]] + [md.last_entry_id]
        mark = UnderReplication(client.store).get(ledger_id)
        click.echo(json.dumps({"metadata": doc,
                               "fragments": [{"first": s, "last": e, "bookies": list(md.ensembles[s])}
                                             for s, e in zip(starts, ends)],
                               "under_replicated": json.loads(mark[0].to_bytes()) if mark else None}))


@ledger.command(name="list")
@metadata_option
@friendly
def list_ledgers(metadata) -> None:
    """List ledger ids with their state and last entry."""
    with client_for(metadata) as client:
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
@friendly
def delete(metadata, ledger_id) -> None:
    """Delete LEDGER_ID; bookies drop its data at their next garbage collection."""
    with client_for(metadata) as client:
        client.delete_ledger(ledger_id)
        click.echo(f"deleted ledger {ledger_id}")
