"""walkit.adapters.sqlite replicates a SQLite database through a walkit log, behind the sqlite3 module's interface.

    import walkit.adapters.sqlite as sqlite3          # was: import sqlite3
    conn = sqlite3.connect("app.db", name="app", metadata="sqlite:///.../metadata.db")
    with conn:
        conn.execute("INSERT INTO accounts VALUES (?, ?)", (1, 100))

Every committed transaction is a record in the log `replicated-<name>`, acknowledged by the
bookies before COMMIT returns (docs/guides/sqlite.md#guarantees). Processes that connect to the same name on one
cluster are nodes of walkit.replicate: one leads and runs the writes, the others apply the log
to their own file, serve reads and send their write transactions to the leader; when the
leader dies another is elected. Modules:

- connection.py, cursor.py, dbapi.py, statements.py, errors.py: the DB-API 2.0 interface,
  statements classified by SQLite itself; capture.py: transactions captured as apsw Session
  changesets and schema steps;
- records.py, machine.py: the transaction record and the state machine applying it to a file;
- definition.py: the functions, aggregates and collations the schema may use, registered on
  every database of the process before connect (`create_function` here);
- database.py: a file's node and write lock in this process; restore.py: point-in-time
  restores; status.py: what `walkit sqlite status` shows; skips.py: `walkit sqlite skip`;
- forwarding.py, channel.py: a follower's write transactions run on the leader;
  adoption.py: an existing SQLite file becomes a replicated database.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
import sqlite3 as _sqlite3

try:
    import apsw as _apsw
except ImportError as _missing:  # pragma: no cover - depends on the installation
    raise ImportError("walkit.adapters.sqlite needs apsw 3.50 or newer: pip install 'walkit[sqlite]'") from _missing

from walkit.adapters.sqlite.connection import Connection, check_isolation_level
from walkit.adapters.sqlite.cursor import Cursor
from walkit.adapters.sqlite.blob import Blob
from walkit.adapters.sqlite.callbacks import enable_callback_tracebacks
from walkit.adapters.sqlite.dbapi import (
    PARSE_COLNAMES, PARSE_DECLTYPES, Binary, Date, DateFromTicks, Row, Time, TimeFromTicks, Timestamp,
    TimestampFromTicks, adapt, adapters, apilevel, complete_statement, converters, enable_shared_cache, paramstyle,
    parse_uri, register_adapter, register_converter, threadsafety,
)
from walkit.adapters.sqlite.definition import create_aggregate, create_collation, create_function
from walkit.adapters.sqlite.errors import (
    CommitFailed, DatabaseError, DataError, Error, IntegrityError, InterfaceError, InternalError, MissingFunction,
    NotLeader, NotSupportedError, OperationalError, ProgrammingError, ReplicaStopped, TransactionTooLarge, Warning,
    translate,
)
from walkit.adapters.sqlite.restore import restore

if tuple(int(part) for part in _apsw.sqlite_lib_version().split(".")[:2]) < (3, 50):  # pragma: no cover
    raise ImportError(f"walkit.adapters.sqlite needs SQLite 3.50 or newer in apsw, found {_apsw.sqlite_lib_version()}")

sqlite_version = _apsw.sqlite_lib_version()
sqlite_version_info = tuple(int(part) for part in sqlite_version.split("."))
version = _sqlite3.version if hasattr(_sqlite3, "version") else "2.6.0"
version_info = tuple(int(part) for part in version.split("."))
PrepareProtocol = _sqlite3.PrepareProtocol
#: sqlite3's SQLITE_* constants (authorizer results and actions, limit categories, result codes), the same values.
_CONSTANTS = {name: getattr(_sqlite3, name) for name in dir(_sqlite3) if name.startswith("SQLITE_")}
globals().update(_CONSTANTS)

__all__ = [
    "Binary", "Blob", "CommitFailed", "Connection", "Cursor", "DataError", "DatabaseError", "Date", "DateFromTicks",
    "Error", "IntegrityError", "InterfaceError", "InternalError", "MissingFunction", "NotLeader", "NotSupportedError",
    "OperationalError", "PARSE_COLNAMES", "PARSE_DECLTYPES", "PrepareProtocol", "ProgrammingError",
    "ReplicaStopped", "Row", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "TransactionTooLarge",
    "Warning", "adapters",
    "adapt", "apilevel", "complete_statement", "connect", "converters", "create_aggregate", "create_collation",
    "create_function", "enable_callback_tracebacks", "enable_shared_cache", "paramstyle", "register_adapter",
    "register_converter", "restore", "sqlite_version", "sqlite_version_info", "threadsafety", "version",
    "version_info", *_CONSTANTS,
]


def connect(database, timeout: float = 5.0, detect_types: int = 0, isolation_level: str | None = "",
            check_same_thread: bool = True, factory=Connection, cached_statements: int = 128, uri: bool = False,
            *, name: str | None = None, client=None, metadata: str | None = None, node_id: str | None = None,
            replica: bool = False, wait_s: float = 60.0, forward_writes: bool = True,
            forward_address: str | bool | None = None, adopt: bool = False, group_commit: bool = True,
            **replicate_options) -> Connection:
    """connect opens the replicated SQLite database `name` with its local copy in file `database`.

    The sqlite3 arguments mean what they mean there (`timeout`: how long a write waits for
    another transaction of this process). `name` names the replicated database (default: the
    file's name without extension); the node joins the cluster through `client` (a walkit.Client
    of its own) or `metadata` (a metadata URI; default: the embedded cluster under
    ./walkit-data). `node_id` is how other nodes name this one (default host:pid:file).
    `replica=True` never campaigns for leadership. `wait_s` bounds how long connect waits for
    the file to catch up with the log and a leader to be known. Other keywords go to
    walkit.replicate (snapshot_every_records, retention_s, quorums, max_record_bytes, ...).

    `forward_writes=True`: a write transaction on a node that does not lead runs on the
    leader's process, and COMMIT returns once this node applied it (a round trip to the
    leader per statement; walkit.adapters.sqlite.forwarding); False: NotLeader, as before.
    `forward_address` is where this node takes other nodes' forwarded writes when it leads
    ("HOST[:PORT]"; default 127.0.0.1 when the metadata store is on this machine; False: none).

    `group_commit=True`: this connection's write transactions run in the leader's group, so
    concurrent writers share the log's round trips (walkit.adapters.sqlite.machine); a COMMIT
    returns once every transaction of its group ended and the log has them all, so a write
    transaction held open delays the COMMITs of those that joined before it. False: each of its
    write transactions waits until none is on its way and runs alone, one log round trip each (as
    a transaction that read before it wrote always does).

    `adopt=True` makes an existing SQLite file (tables, no walkit position) the database: its
    content becomes the log's first record (walkit.adapters.sqlite.adoption); refused if the
    replicated database `name` exists. ":memory:" (or "") is a private replicated database of
    this connection, under a name of its own, in a temporary file: closing the connection
    deletes the file and the log. It takes no `name` (ValueError): a name would join, and at
    close delete, the log of the database of that name.

    A committed transaction (its changeset, or a schema statement) is one record, at most
    `max_record_bytes` (default: the client's max_entry_bytes, 60 MiB, less 9 bytes). COMMIT of
    a larger one raises TransactionTooLarge (a sqlite3.DataError, as for SQLITE_TOOBIG) and
    rolls it back; it is refused, never split, and the node keeps leading.
    """
    from walkit.adapters.sqlite.database import acquire, release
    check_isolation_level(isolation_level)
    path = os.fspath(database)
    mode = "rwc"
    if uri:                                        # percent-decoded, mode=ro read-only (dbapi.parse_uri)
        path, mode = parse_uri(path)
        path = ":memory:" if mode == "memory" else path
        if mode in ("ro", "rw") and not os.path.exists(path):
            raise OperationalError("unable to open database file")
    private = path in ("", ":memory:")
    if private and name:
        raise ValueError(f"a ':memory:' database is private to its connection and its log is deleted at close, so it "
                         f"takes no name (name={name!r} would join, and at close delete, that database's log)")
    if private:                                    # a database of this connection alone (database.Database.private)
        path = os.path.join(tempfile.mkdtemp(prefix="walkit-sqlite-memory-"), "memory.db")
        name = f"memory-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        forward_address = False
        replicate_options.setdefault("snapshot_every_records", 0)
    name = name or os.path.splitext(os.path.basename(path))[0]
    try:
        shared = acquire(path, name, client=client, metadata=metadata, node_id=node_id, voting=not replica,
                         options=replicate_options, timeout=timeout, forward_address=forward_address,
                         adopt=adopt, private=private)
    except _apsw.Error as exc:                     # the file cannot be opened: sqlite3's error
        raise translate(exc) from None
    try:
        shared.wait_started(wait_s)
        extra = {"readonly": True} if mode == "ro" else {}
        if not forward_writes:
            extra["forward_writes"] = False
        if not group_commit:
            extra["group_commit"] = False
        return factory(shared, timeout=timeout, detect_types=detect_types, isolation_level=isolation_level,
                       check_same_thread=check_same_thread, cached_statements=cached_statements, **extra)
    except BaseException:
        release(shared)
        raise
