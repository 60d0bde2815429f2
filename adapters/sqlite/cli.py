"""walkit.adapters.sqlite.cli is `walkit sqlite`: the replicated SQLite database's shell, replica, restore, status and skip.

Every command takes --metadata URI (default: the embedded cluster under ./walkit-data, the one
`walkit local` runs). NAME is the replicated database's name, as given to
walkit.adapters.sqlite.connect(..., name=NAME).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import tempfile
import threading

import click

from walkit.cli.common import client_for, metadata_option


def _sqlite_errors(fn):
    """_sqlite_errors turns walkit and SQLite errors, and a missing apsw, into one-line messages."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import sqlite3
        from walkit.errors import WalkitError
        try:
            import apsw  # noqa: F401
        except ImportError:
            raise click.ClickException("walkit sqlite needs apsw 3.50 or newer: pip install 'walkit[sqlite]'") from None
        try:
            return fn(*args, **kwargs)
        except (WalkitError, sqlite3.Error, OSError, ValueError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    return wrapper


@click.group(name="sqlite")
def sqlite() -> None:
    """Replicated SQLite: every committed transaction is in the walkit log before COMMIT returns.

    Programs use walkit.adapters.sqlite.connect(FILE, name=NAME) in place of sqlite3.connect;
    these commands keep a plain copy up to date, restore any past state, show the status, and
    give a SQL prompt.
    """


@sqlite.command()
@metadata_option
@click.argument("name")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--node-id", default=None, help="How other nodes name this replica [default: host:pid:FILE].")
@click.option("--http-port", type=int, default=None,
              help="Serve Prometheus /metrics, /health and /ready (ready once it applied a transaction) "
                   "on 127.0.0.1 at this port (0: a free one) [default: off].")
def replica(metadata, name, file, node_id, http_port) -> None:
    """Keep FILE, a plain SQLite file, up to date with database NAME until Ctrl-C.

    FILE applies every committed transaction in log order (WAL mode), so any SQLite client,
    e.g. `sqlite3 FILE 'SELECT ...'`, reads it while it is updated. A new FILE starts from the
    latest snapshot. The replica never becomes the leader. Writing FILE with another program
    makes it differ from the log: the replica then stops, naming the position and table.

    Example: walkit sqlite replica app app-replica.db
    """
    _sqlite_errors(_replica)(metadata, name, file, node_id, http_port)


def _replica(metadata, name, file, node_id, http_port=None) -> None:
    import walkit.adapters.sqlite as sq
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    conn = sq.connect(file, name=name, metadata=metadata, node_id=node_id, replica=True, check_same_thread=False)
    endpoint = None
    try:
        click.echo(f"replica of {name} in {os.path.abspath(file)}: applied {conn.position or 'nothing yet'}, "
                   f"leader {conn.leader or 'unknown'}", err=True)
        database = conn._database
        if http_port is not None:
            from walkit.metrics import REGISTRY, HttpEndpoint
            endpoint = HttpEndpoint("127.0.0.1", http_port, [REGISTRY],
                                    health=lambda: (not stop.is_set(), f"replica of {name}"),
                                    ready=lambda: (conn.position is not None, f"applied {conn.position}"))
            click.echo(f"metrics on http://{endpoint.address}/metrics", err=True)
        while not stop.wait(0.5):
            database.check()
    finally:
        if endpoint is not None:
            endpoint.close()
        conn.close()
    click.echo(f"replica of {name} stopped at {conn.position}", err=True)


@sqlite.command()
@metadata_option
@click.argument("name")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--position", default=None, metavar="L:E",
              help="Restore the state after log entry L:E (ledger:entry, as `walkit sqlite status` shows).")
@click.option("--time", "at_time", default=None, metavar="ISO8601",
              help="Restore the state with every transaction committed at or before this time, "
                   "e.g. 2025-01-31T12:00:00Z (no zone: UTC).")
@click.option("--password", default="", help="Password of the database's ledgers.")
def restore(metadata, name, out, position, at_time, password) -> None:
    """Write database NAME as it was at a log position or a time to the new file OUT.

    Without --position or --time it restores the latest state. Restores start from the newest
    snapshot before the target and apply the log after it; a node's retention_s keeps what
    restores within that window need. OUT is a plain SQLite file that passes PRAGMA
    integrity_check.

    Example: walkit sqlite restore app app-noon.db --time 2025-01-31T12:00:00Z
    """
    _sqlite_errors(_restore)(metadata, name, out, position, at_time, password)


def _restore(metadata, name, out, position, at_time, password) -> None:
    from walkit.adapters.sqlite.restore import restore as run_restore
    with client_for(metadata) as client:
        done = run_restore(name, out, position=position, time=at_time, client=client, password=password)
    click.echo(f"restored {name} at {done.position or 'the start'} ({done.records} transactions after "
               f"{'snapshot ' + str(done.snapshot) if done.snapshot else 'the start of the log'}) into {done.path}")


@sqlite.command()
@metadata_option
@click.argument("name")
def status(metadata, name) -> None:
    """Show database NAME: its leader, its nodes (role, applied position, lag, file), log and snapshot.

    Example: walkit sqlite status app
    """
    _sqlite_errors(_status)(metadata, name)


def _status(metadata, name) -> None:
    from walkit.adapters.sqlite.status import gather
    with client_for(metadata) as client:
        for line in gather(client, name).lines():
            click.echo(line)


@sqlite.command()
@metadata_option
@click.argument("name")
@click.argument("position")
@click.option("--yes", is_flag=True, help="Record the skip without asking, after showing the record.")
def skip(metadata, name, position, yes) -> None:
    """Skip the record at POSITION of database NAME on every node that cannot apply it.

    POSITION is the record a stopped node names (L:E or L:E#R, from the error or `walkit sqlite
    status`). The record is shown first. The skip is itself a record of the log: it is recorded
    only when no node leads the database (every voting node stopped at it) and no running node
    reports having applied it; then the stopped nodes, started again, move past it without
    changing their files, and so does every node and restore after them. What the record would
    have changed is lost: inspect it first, and prefer replacing a node's file from a snapshot
    when other nodes applied it.

    Example: walkit sqlite skip app 12:340
    """
    _sqlite_errors(_skip)(metadata, name, position, yes)


def _skip(metadata, name, position, yes) -> None:
    from walkit.adapters.sqlite import skips
    from walkit.adapters.sqlite.status import gather
    at = skips.parse(position)
    with client_for(metadata) as client:
        found = skips.inspect(client, name, at)
        click.echo(f"record {skips.show(at)} of {name}:")
        for line in found.lines:
            click.echo(f"  {line}")
        applied_by = [node["node_id"] for node in gather(client, name).nodes
                      if not node.get("stopped") and node.get("applied") and skips.parse(node["applied"]) >= at]
        if not yes:
            click.confirm("Skip it on every node that cannot apply it? Its changes are lost", abort=True)
        entry = skips.record_skip(client, name, at, applied_by, node_id=f"walkit-sqlite-skip:{os.getpid()}")
    click.echo(f"recorded the skip of {skips.show(at)} in the log of {name} at {entry}; start the stopped nodes "
               f"again: they move past it")


@sqlite.command()
@metadata_option
@click.argument("name")
@click.option("--file", "path", default=None, type=click.Path(dir_okay=False),
              help="This shell's copy of the database [default: a temporary file, caught up from the log].")
@click.option("--command", "-c", "commands", multiple=True, metavar="SQL",
              help="Run SQL and exit instead of prompting (repeatable).")
@click.option("--node-id", default=None, help="How other nodes name this shell's node.")
def shell(metadata, name, path, commands, node_id) -> None:
    """A SQL prompt on database NAME: statements end with ';', results print as a table.

    The shell is a node of NAME: it catches up with the log, then reads its copy after a read
    barrier (it sees every committed transaction). Writes run when it leads (no other node is
    alive to lead); otherwise they are refused with the leader's name. Dot commands: .tables,
    .schema [TABLE], .status, .quit. Reads SQL from stdin when it is not a terminal.

    Example: walkit sqlite shell app -c "SELECT count(*) FROM accounts"
    """
    _sqlite_errors(_shell)(metadata, name, path, commands, node_id)


def _shell(metadata, name, path, commands, node_id) -> None:
    import walkit.adapters.sqlite as sq
    from walkit.adapters.sqlite.shell import Shell
    scratch = None
    if path is None:
        scratch = tempfile.mkdtemp(prefix="walkit-sqlite-shell-")
        path = os.path.join(scratch, f"{name}.db")
    conn = None
    try:
        conn = sq.connect(path, name=name, metadata=metadata, node_id=node_id, isolation_level=None)
        session = Shell(conn, echo=click.echo)
        if commands:
            ok = all([session.run(sql) for sql in commands])
            sys.exit(0 if ok else 1)
        interactive = sys.stdin.isatty()
        if interactive:
            click.echo(f"walkit sqlite shell: {name} ({'leader: writes go here' if conn.is_leader else 'leader: ' + str(conn.leader)}). "
                       "End statements with ';'. .help for help.")
        session.loop(sys.stdin, interactive)
    finally:
        if conn is not None:
            conn.close()
        if scratch is not None:                        # also when connect refused the database
            import shutil
            shutil.rmtree(scratch, ignore_errors=True)
