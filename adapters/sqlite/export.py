"""walkit.adapters.sqlite.export makes copies of a replicated database: iterdump, serialize and backup.

A copy reads the database and never writes it, so it needs nothing from the log. Each copy is
what `sqlite3` would make of a plain database holding the same tables: the table in which a
node keeps its applied log position (walkit.adapters.sqlite.machine.POSITION_TABLE) is left
out, and a copied file is in rollback-journal mode, not in the WAL mode replicated files use.
So a dump or a backup of a replicated database restores into plain `sqlite3`.
"""

from __future__ import annotations

import sqlite3
import sqlite3.dump

from walkit.adapters.sqlite.errors import NotSupportedError, translate
from walkit.adapters.sqlite.machine import POSITION_TABLE

_POSITION_LINES = (f"CREATE TABLE {POSITION_TABLE}", f'CREATE TABLE "{POSITION_TABLE}"',
                   f'INSERT INTO "{POSITION_TABLE}" ')


def dump(connection):
    """dump yields the statements of sqlite3's dump of `connection` (sqlite3.Connection.iterdump), run on it.

    sqlite3 dumps through the connection's own cursors, so the dump sees the connection's open
    transaction as sqlite3's does; the position table's statements are left out.
    """
    for line in sqlite3.dump._iterdump(connection):     # the standard library's: the same text as sqlite3's
        if not line.startswith(_POSITION_LINES):
            yield line


def plain_copy(db, name: str = "main") -> sqlite3.Connection:
    """plain_copy is database `name` of apsw connection `db` in a sqlite3 in-memory database, as a plain file.

    The serialized file says WAL mode in its header (bytes 18 and 19 are 2); a database in
    memory cannot be in WAL mode, so they are set to 1 (rollback journal), which is what
    `PRAGMA journal_mode=DELETE` writes there.
    """
    try:
        data = bytearray(db.serialize(name) or b"")
    except Exception as exc:  # noqa: BLE001 - apsw's errors become DB-API errors
        raise translate(exc) from None
    if len(data) >= 20:
        data[18:20] = b"\x01\x01"
    copy = sqlite3.connect(":memory:", isolation_level=None)
    if data:
        copy.deserialize(bytes(data))
    if name.lower() == "main":
        copy.execute(f'DROP TABLE IF EXISTS "{POSITION_TABLE}"')
    return copy


def plain_bytes(db, name: str = "main") -> bytes:
    """plain_bytes is database `name` of apsw connection `db` as the bytes of a plain SQLite file."""
    copy = plain_copy(db, name)
    try:                                           # no VACUUM: it would run the schema's functions, not here
        return copy.serialize()
    finally:
        copy.close()


def copy_into(connection, target, *, pages: int, progress, name: str, sleep: float) -> None:
    """copy_into copies database `name` of `connection` into `target` with sqlite3's own backup() and its steps.

    The target must be a sqlite3.Connection: writing a replicated database except through its
    log is refused (NotSupportedError), as it would be for deserialize().
    """
    if not isinstance(target, sqlite3.Connection):
        if type(target).__module__.startswith("walkit."):
            raise NotSupportedError("backup() into a replicated database would replace it outside the log; back up "
                                    "into a sqlite3.Connection, then copy the rows with INSERT statements")
        raise TypeError(f"backup() argument 'target' must be sqlite3.Connection, not {type(target).__name__}")
    copy = plain_copy(connection._db, name)
    try:
        copy.backup(target, pages=pages, progress=progress, name="main", sleep=sleep)
    finally:
        copy.close()


class Copies:
    """Copies is the part of Connection that copies the database out; it uses `_db` and `_check()`."""

    def iterdump(self):
        """iterdump yields the SQL statements that rebuild the database, as sqlite3 yields them (no walkit table)."""
        self._check()
        return dump(self)

    def serialize(self, *, name: str = "main") -> bytes:
        """serialize is the database `name` as the bytes of a plain SQLite file (no walkit table, not in WAL mode)."""
        self._check()
        return plain_bytes(self._db, name)

    def deserialize(self, data, /, *, name: str = "main") -> None:
        """deserialize would replace the whole database outside the log: NotSupportedError."""
        self._check()
        raise NotSupportedError("deserialize() would replace the replicated database outside the log; load the rows "
                                "with INSERT statements (or executescript of a dump) instead")

    def backup(self, target, *, pages: int = -1, progress=None, name: str = "main", sleep: float = 0.250) -> None:
        """backup copies the database `name` into `target`, a sqlite3.Connection, as sqlite3's backup() does."""
        self._check()
        copy_into(self, target, pages=pages, progress=progress, name=name, sleep=sleep)
