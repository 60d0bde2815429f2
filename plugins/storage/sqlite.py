"""walkit.plugins.storage.sqlite keeps a bookie's entries in one SQLite file (``sqlite:///path/bookie.db``).

Three tables: ``entries`` (ledger_id, entry_id, data), ``ledgers`` (ledger_id, fenced,
master_key, explicit_lac, term, truncated_term, truncated_at, first_entry: the ledger's
`delete_entries` point) and ``identity`` (the disk identity, walkit.bookie.identity: in the
same file, so a new file is a new disk). The database runs in WAL mode with
``synchronous=FULL`` and ``auto_vacuum=INCREMENTAL``. The group commit is one transaction: the
first `put`, `set_ledger_state`, `delete_ledger` or `delete_entries` after a sync opens it,
`sync()` commits it (a WAL append and an fsync). Reads use the same connection, so they see
the open transaction's changes.

`compact()` gives the pages freed by deleted ledgers and entries back to the file system
(incremental vacuum, then a WAL checkpoint that truncates the WAL); the bookie calls it
periodically.
"""

from __future__ import annotations

import os
import sqlite3

from walkit.core.bookie import LedgerState
from walkit.errors import ConfigError, StorageError
from walkit.plugins.storage.options import Option, check_options, split_uri

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL,
    entry_id INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (ledger_id, entry_id)
);
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id INTEGER PRIMARY KEY,
    fenced INTEGER NOT NULL DEFAULT 0,
    master_key BLOB NOT NULL DEFAULT x'',
    explicit_lac INTEGER NOT NULL DEFAULT -1,
    term INTEGER NOT NULL DEFAULT 0,
    truncated_term INTEGER NOT NULL DEFAULT 0,
    truncated_at INTEGER NOT NULL DEFAULT 0,
    first_entry INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    value BLOB NOT NULL
);
"""

OPTIONS = {
    "cache_mb": Option(float, 64),          # SQLite page cache
    "timeout": Option(float, 10),           # seconds to wait for a lock held by another process
}


class SqliteStorage:
    """SqliteStorage is the ``sqlite://`` EntryStorage: one transaction per group commit."""

    durable = True

    def __init__(self, path: str, **options) -> None:
        """__init__ opens (creating if needed) the database at `path`; see OPTIONS for `options`."""
        settings = check_options("sqlite", OPTIONS, options)
        self.path = path
        self.fsyncs = 0
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=settings["timeout"], isolation_level=None,
                                       check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"sqlite storage: cannot open {path!r}: {exc}") from None
        try:
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")    # only takes effect on a new file
            if self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
                raise ConfigError(f"sqlite storage: {path!r} cannot use WAL mode")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA cache_size={-int(settings['cache_mb'] * 1024)}")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(ledgers)")}
            for column in ("term", "truncated_term", "truncated_at", "first_entry"):
                if column not in columns:       # a file made before unbounded ledgers (or entry deletes)
                    self._db.execute(f"ALTER TABLE ledgers ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error as exc:
            self._db.close()
            raise StorageError(f"sqlite storage {path}: {exc}") from exc
        self._in_transaction = False
        self._known: set[int] = set()
        self._firsts: dict[int, int] = {}       # ledger -> its entries below this were deleted
        for ledger_id, first in self._db.execute("SELECT ledger_id, first_entry FROM ledgers"):
            self._known.add(ledger_id)
            if first:
                self._firsts[ledger_id] = first

    @classmethod
    def from_uri(cls, uri: str, **options) -> "SqliteStorage":
        """from_uri opens ``sqlite:///abs/bookie.db`` or ``sqlite://rel/bookie.db`` (?cache_mb=&timeout=)."""
        from walkit.plugins import path_of
        base, query = split_uri(uri)
        return cls(path_of(base), **{**query, **options})

    def _write(self, sql: str, args: tuple) -> None:
        """_write runs a change inside the group's transaction, opening it if needed."""
        try:
            if not self._in_transaction:
                self._db.execute("BEGIN IMMEDIATE")
                self._in_transaction = True
            self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StorageError(f"sqlite storage {self.path}: {exc}") from exc

    def _know(self, ledger_id: int) -> None:
        """_know makes sure a ledger has a row (with the default state) once it has an entry."""
        if ledger_id not in self._known:
            self._write("INSERT OR IGNORE INTO ledgers (ledger_id) VALUES (?)", (ledger_id,))
            self._known.add(ledger_id)

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """put stores (or overwrites) an entry in the open transaction; durable after sync()."""
        if ledger_id < 0 or entry_id < 0:
            raise ValueError(f"ledger and entry ids must not be negative, got {ledger_id}, {entry_id}")
        if entry_id < self._firsts.get(ledger_id, 0):
            return                              # below the ledger's delete_entries point: stays deleted
        self._know(ledger_id)
        self._write("INSERT OR REPLACE INTO entries (ledger_id, entry_id, data) VALUES (?, ?, ?)",
                    (ledger_id, entry_id, bytes(data)))

    def sync(self) -> None:
        """sync commits the open transaction (WAL append + fsync), if there is one."""
        if not self._in_transaction:
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"sqlite storage {self.path}: commit failed: {exc}") from exc
        self._in_transaction = False
        self.fsyncs += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """get returns an entry's bytes, or None if the entry is not stored."""
        row = self._db.execute("SELECT data FROM entries WHERE ledger_id = ? AND entry_id = ?",
                               (ledger_id, entry_id)).fetchone()
        return None if row is None else row[0]

    def last_entry(self, ledger_id: int) -> int:
        """last_entry returns the highest entry id stored for a ledger (an index lookup), or -1."""
        row = self._db.execute("SELECT MAX(entry_id) FROM entries WHERE ledger_id = ?", (ledger_id,)).fetchone()
        return -1 if row[0] is None else row[0]

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        """ledger_state returns a ledger's state, or None if the ledger is unknown here."""
        row = self._db.execute("SELECT fenced, master_key, explicit_lac, term, truncated_term, truncated_at "
                               "FROM ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
        return None if row is None else LedgerState(fenced=bool(row[0]), master_key=bytes(row[1]),
                                                    explicit_lac=row[2], term=row[3], truncated=(row[4], row[5]))

    def set_ledger_state(self, ledger_id: int, state: LedgerState) -> None:
        """set_ledger_state records a ledger's state in the open transaction; durable after sync()."""
        self._write("INSERT INTO ledgers (ledger_id, fenced, master_key, explicit_lac, term, truncated_term, "
                    "truncated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ledger_id) DO UPDATE SET "
                    "fenced = excluded.fenced, master_key = excluded.master_key, explicit_lac = excluded.explicit_lac, "
                    "term = excluded.term, truncated_term = excluded.truncated_term, "
                    "truncated_at = excluded.truncated_at",          # (first_entry stays)
                    (ledger_id, int(state.fenced), bytes(state.master_key), state.explicit_lac, state.term,
                     *state.truncated))
        self._known.add(ledger_id)

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger removes a ledger's entries and state; compact() gives the pages back."""
        self._write("DELETE FROM entries WHERE ledger_id = ?", (ledger_id,))
        self._write("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))
        self._known.discard(ledger_id)
        self._firsts.pop(ledger_id, None)

    def delete_entries(self, ledger_id: int, before: int) -> None:
        """delete_entries removes a ledger's entries below `before` (open transaction); compact() frees the pages."""
        if before <= self._firsts.get(ledger_id, 0) or ledger_id not in self._known:
            return
        self._write("DELETE FROM entries WHERE ledger_id = ? AND entry_id < ?", (ledger_id, before))
        self._write("UPDATE ledgers SET first_entry = ? WHERE ledger_id = ?", (before, ledger_id))
        self._firsts[ledger_id] = before

    def identity(self) -> bytes | None:
        """identity returns the disk identity (walkit.bookie.identity) kept in the file, or None."""
        row = self._db.execute("SELECT value FROM identity WHERE id = 1").fetchone()
        return None if row is None else bytes(row[0])

    def set_identity(self, data: bytes) -> None:
        """set_identity writes the disk identity and commits it (with anything buffered) before it returns."""
        self._write("INSERT OR REPLACE INTO identity (id, value) VALUES (1, ?)", (bytes(data),))
        self.sync()

    def ledgers(self) -> list[int]:
        """ledgers lists the ids of the ledgers known here, sorted."""
        return sorted(self._known)

    def compact(self) -> int:
        """compact syncs, returns free pages to the file system and truncates the WAL; returns bytes freed."""
        self.sync()
        before = _size(self.path)
        try:
            self._db.executescript("PRAGMA incremental_vacuum;")   # execute() would free one page only
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"sqlite storage {self.path}: compaction failed: {exc}") from exc
        return max(0, before - _size(self.path))

    def close(self) -> None:
        """close commits the open transaction, as the files backend's final checkpoint does, and closes."""
        try:
            self.sync()
        finally:
            self._db.close()


def _size(path: str) -> int:
    """_size returns the bytes a SQLite database uses on disk, its WAL included."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
