"""walkit.adapters.sqlite.cursor is the DB-API cursor: execute, fetch, description, rowcount, lastrowid.

Statements run through the connection (walkit.adapters.sqlite.connection), which decides what
each one needs (the leader's write lock, a transaction, a schema step). Rows of a read are
fetched lazily from apsw; before the connection ends a transaction it `detach`es its open
cursors, which keep the rows not fetched yet, so a loop that commits while it iterates works
as with sqlite3.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable

from walkit.adapters.sqlite import dbapi, statements
from walkit.adapters.sqlite.errors import ProgrammingError, translate


class Cursor:
    """Cursor runs statements on a Connection and returns their rows (sqlite3.Cursor's interface)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.row_factory = connection.row_factory
        self.description: tuple | None = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows = None           # an apsw cursor being read, or an iterator of the rows kept
        self._apsw = None
        self._columns: list[tuple[str, str | None]] = []   # (name, declared type) of each result column
        self._closed = False
        self._busy = False
        connection._track(self)

    # -- running ----------------------------------------------------------------------------------
    def execute(self, sql: str, parameters: Any = (), /) -> "Cursor":
        """execute runs one SQL statement with `parameters` (a sequence for ?, a dict for :name)."""
        with self._running():
            self.connection._execute(self, sql, parameters, single=True)
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> "Cursor":
        """executemany runs one data-changing statement once per parameter set; rowcount is the total."""
        lastrowid = self.lastrowid                 # sqlite3 leaves it as it was
        with self._running():
            total = 0
            for parameters in seq_of_parameters:
                self.connection._execute(self, sql, parameters, single=True, many=True)
                total += max(self.rowcount, 0)
            self.rowcount = total
        self.lastrowid = lastrowid
        return self

    def executescript(self, sql_script: str, /) -> "Cursor":
        """executescript commits any pending transaction, then runs the statements of `sql_script` in order."""
        if not isinstance(sql_script, str):
            raise ValueError("script argument must be unicode.")
        if "\0" in sql_script:
            raise ValueError("embedded null character")
        with self._running():
            self.connection._execute_script(self, sql_script)
        return self

    @contextlib.contextmanager
    def _running(self):
        """_running marks the cursor busy while its statement runs: a callback using it again is refused."""
        self._check()
        self._reset()
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def _run(self, statement: statements.Statement, parameters: tuple, db=None) -> None:
        """_run executes one classified statement on the connection's apsw connection (the connection decides when),
        or on `db`.

        The columns are read once the statement has stepped: a statement cached before a
        schema change is prepared again by its first step, and `description` must be the new
        one (a SELECT * after ALTER TABLE). A statement that returned no row is described by
        preparing it afresh if its columns can differ after a schema change without an error:
        a `*` (the table's columns now) or declared types (PARSE_DECLTYPES); a column named in
        the SQL is named the same, or the statement fails to prepare.
        """
        import apsw
        connection = self.connection
        db = connection._target() if db is None else db
        cursor = db.cursor()
        described: list = []

        def trace(running, sql, bindings) -> bool:
            described[:] = running.get_description()
            if connection._tracer is not None:
                connection._trace(running.expanded_sql)
            return True
        cursor.exec_trace = trace
        try:
            cursor.execute(statement.sql, parameters)
            self._apsw = cursor
            if described:
                try:
                    described = list(cursor.get_description())
                except apsw.ExecutionCompleteError:  # no row: only a `*` or a declared type can have changed
                    if "*" in statement.sql or connection.detect_types & dbapi.PARSE_DECLTYPES:
                        described = list(statements.describe(db, statement.sql))
                detect = connection.detect_types
                self.description = tuple((dbapi.column_name(name, detect), None, None, None, None, None, None)
                                         for name, _ in described)
                self._columns = described
                self._rows = cursor
            if statement.kind not in (statements.READ, statements.EMPTY):
                self._rows = iter(list(cursor)) if described else None   # a write runs to its end now
                self.rowcount = db.changes() if statement.kind == statements.WRITE else -1
                if db is not connection._db and statement.kind == statements.WRITE:
                    connection._changes_elsewhere += self.rowcount
            self.lastrowid = db.last_insert_rowid()   # after any statement, as sqlite3 sets it
        except Exception as exc:  # noqa: BLE001 - apsw's and callbacks' errors become DB-API errors
            self._rows = None
            raise translate(exc) from None

    def _take(self, columns: list | None, rows: list, rowcount: int, lastrowid: int | None) -> None:
        """_take is the result of a statement the leader ran for this cursor (walkit.adapters.sqlite.forwarding)."""
        if columns is not None:
            detect = self.connection.detect_types
            self.description = tuple((dbapi.column_name(name, detect), None, None, None, None, None, None)
                                     for name, _ in columns)
            self._columns = [tuple(column) for column in columns]
            self._rows = iter([tuple(row) for row in rows])
        self.rowcount = rowcount
        if lastrowid is not None:
            self.lastrowid = lastrowid

    # -- fetching ---------------------------------------------------------------------------------
    def _convert(self, values: tuple):
        connection = self.connection
        if connection.text_factory is not str:
            factory = connection.text_factory
            values = tuple(factory(v.encode()) if isinstance(v, str) else v for v in values)
        if connection.detect_types:
            values = self._apply_converters(values)
        factory = self.row_factory
        return factory(self, values) if factory is not None else values

    def _apply_converters(self, values: tuple) -> tuple:
        out = list(values)
        detect = self.connection.detect_types
        for i, value in enumerate(values):
            if value is None or i >= len(self._columns):
                continue
            converter = dbapi.converter_for(*self._columns[i], detect)
            if converter is not None:
                out[i] = converter(dbapi.as_bytes(value))
        return tuple(out)

    def _next_raw(self):
        rows = self._rows
        if rows is None:
            return None
        try:
            return next(rows)
        except StopIteration:
            self._rows = None
            return None
        except Exception as exc:  # noqa: BLE001 - apsw's and callbacks' errors become DB-API errors
            self._rows = None
            raise translate(exc) from None

    def _drain(self) -> None:
        """_drain runs the current statement to its end and forgets it (executescript)."""
        while self._next_raw() is not None:
            pass
        self._reset()

    def fetchone(self):
        """fetchone returns the next row, or None when there are no more."""
        self._check()
        raw = self._next_raw()
        return None if raw is None else self._convert(raw)

    def fetchmany(self, size: int | None = None) -> list:
        """fetchmany returns up to `size` (default arraysize) next rows."""
        self._check()
        size = self.arraysize if size is None else size
        out = []
        while len(out) < size:
            raw = self._next_raw()
            if raw is None:
                break
            out.append(self._convert(raw))
        return out

    def fetchall(self) -> list:
        """fetchall returns the remaining rows."""
        self._check()
        out = []
        while (raw := self._next_raw()) is not None:
            out.append(self._convert(raw))
        return out

    def __iter__(self) -> "Cursor":
        return self

    def __next__(self):
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    # -- the rest of the interface ----------------------------------------------------------------
    def detach(self) -> None:
        """detach keeps the rows not fetched yet in memory (the connection is about to end a transaction)."""
        import apsw
        if self._apsw is not None and self._rows is self._apsw:
            try:
                self._rows = iter(list(self._apsw))
            except apsw.Error:
                self._rows = None
        self._apsw = None

    def setinputsizes(self, sizes) -> None:
        """setinputsizes does nothing (DB-API 2.0)."""

    def setoutputsize(self, size, column=None) -> None:
        """setoutputsize does nothing (DB-API 2.0)."""

    def close(self) -> None:
        """close ends the cursor; using it afterwards raises ProgrammingError."""
        self._reset()
        self._closed = True

    def _reset(self) -> None:
        if self._apsw is not None:
            try:
                self._apsw.close()
            except Exception:  # noqa: BLE001 - closing an apsw cursor that failed
                pass
        self._apsw = None
        self._rows = None
        self.description = None
        self.rowcount = -1
        self._columns = []

    def _check(self) -> None:
        if self._closed:
            raise ProgrammingError("Cannot operate on a closed cursor.")
        if self._busy:
            raise ProgrammingError("Recursive use of cursors not allowed.")
        self.connection._check()
