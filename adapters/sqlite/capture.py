"""walkit.adapters.sqlite.capture is what a write transaction records: Sessions, changesets and schema steps.

An open write transaction (`Open`) has an apsw Session attached to every table of the main
database (tables without a PRIMARY KEY by rowid); a schema statement closes the changeset so
far and is recorded as its own step. CREATE TABLE ... AS SELECT is invisible to sessions, so
it is recorded as the table's definition and a changeset inserting its rows.
"""

from __future__ import annotations

import re

from walkit.adapters.sqlite.machine import POSITION_TABLE
from walkit.adapters.sqlite.records import Transaction

_COMMENTS = re.compile(r"(\s+|;|--[^\n]*(\n|$)|/\*.*?(\*/|$))", re.DOTALL)


def only_comments(text: str) -> bool:
    """only_comments is True if `text` holds no statement (whitespace, semicolons and comments)."""
    return not _COMMENTS.sub("", text)


class Open:
    """Open is the transaction a connection has open: its Session, the record being built, the lock."""

    __slots__ = ("session", "record", "locked", "savepoint", "member", "ran")

    def __init__(self, savepoint: str | None = None) -> None:
        self.session = None
        self.record = Transaction()
        self.locked = False
        self.savepoint = savepoint
        self.member = None          # a walkit.adapters.sqlite.machine.Member: it runs in the leader's group
        self.ran = False            # a statement ran on the connection's own SQLite connection before it wrote

    def flush(self) -> None:
        """flush moves the Session's changeset into the record and ends the Session."""
        if self.session is not None:
            self.record.add_changeset(self.session.changeset())
            self.session.close()
            self.session = None


def capture_session(db):
    """capture_session is an apsw Session recording every table of the main database but the position table."""
    import apsw
    session = apsw.Session(db, "main")
    session.config(apsw.SQLITE_SESSION_OBJCONFIG_ROWID, 1)
    session.table_filter(lambda table: table != POSITION_TABLE)
    session.attach()
    return session


def record_created_table(db, txn: Open, table: str) -> None:
    """record_created_table records CREATE TABLE ... AS SELECT as the table's definition and its rows' values."""
    import apsw
    rows = db.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE",
                      (table,)).fetchall()
    name, sql = rows[0]
    txn.record.add_sql(sql)
    builder = apsw.ChangesetBuilder()
    try:
        builder.schema(db, "main")
        quoted = '"' + name.replace('"', '""') + '"'
        for row in db.execute(f"SELECT rowid, * FROM {quoted}"):
            builder.add_insert(name, False, row)
        txn.record.add_changeset(builder.output())
    finally:
        builder.close()
