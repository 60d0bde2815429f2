"""walkit.adapters.sqlite.statements tells what a SQL statement does before it runs, by asking SQLite.

A connection must know, before a statement runs, whether it writes the database (then it needs
the leader's write lock and a capturing Session), changes the schema (then it travels as its
own step), or controls the transaction. SQLite's own parser decides: the statement is prepared
with an authorizer recording the actions SQLite will take, then stopped before its first step
(the exec tracer returns False, as apsw.ext.query_info does). Results are cached by SQL text.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from dataclasses import dataclass

from walkit.adapters.sqlite.errors import translate

EMPTY = "empty"            # only whitespace or comments
READ = "read"              # read-only: SELECT, EXPLAIN, PRAGMA reads
WRITE = "write"            # INSERT, UPDATE, DELETE, REPLACE of the main database's tables
SCHEMA = "schema"          # CREATE/ALTER/DROP of main tables, indexes, views, triggers
CREATE_AS = "create_as"    # CREATE TABLE ... AS SELECT (its rows are not seen by sessions)
PRAGMA_SET = "pragma_set"  # PRAGMA user_version / application_id = N: part of the file's content
JOURNAL_MODE = "journal_mode"  # PRAGMA journal_mode = X: the file stays in WAL mode
LOCAL = "local"            # runs on this file only: VACUUM, ANALYZE, ATTACH, TEMP tables, other pragmas
BEGIN, COMMIT, ROLLBACK = "begin", "commit", "rollback"
SAVEPOINT, RELEASE, ROLLBACK_TO = "savepoint", "release", "rollback_to"

#: Kinds that change the replicated database: only the leader runs them.
REPLICATED = frozenset({WRITE, SCHEMA, CREATE_AS, PRAGMA_SET})
#: Pragmas whose value lives in the database file (the rest configure a connection).
FILE_PRAGMAS = frozenset({"user_version", "application_id"})
#: Pragmas that take an argument and only read (a table's columns, a check): the others set something.
_PRAGMAS_READING_AN_ARGUMENT = frozenset({"table_info", "table_xinfo", "table_list", "index_list", "index_info",
                                          "index_xinfo", "foreign_key_list", "foreign_key_check", "integrity_check",
                                          "quick_check"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})
_BEGIN_MODE = re.compile(r"^\s*BEGIN\s+(DEFERRED|IMMEDIATE|EXCLUSIVE)\b", re.IGNORECASE)
CACHE_SIZE = 512


@dataclass(frozen=True)
class Statement:
    """Statement is the first statement of some SQL text and what it does.

    `sql` is its text, `rest` the text after it, `kind` one of the constants above; `inserts`
    says it inserts rows (lastrowid changes); `name` is a savepoint's name or BEGIN's mode;
    `table` the table a CREATE TABLE ... AS creates; `pragma` a pragma's name; `parameters`
    names each parameter it takes, in order (None for a `?`), for binding as sqlite3 binds.
    """

    sql: str
    rest: str
    kind: str
    inserts: bool = False
    name: str = ""
    table: str = ""
    pragma: str = ""
    parameters: tuple = ()


def _actions(db, sql: str):
    """_actions prepares the first statement of `sql`: its text, read-only, has code, actions, parameters."""
    import apsw
    seen: dict = {}
    actions: list[tuple[int, str | None, str | None, str | None]] = []

    def tracer(cursor, first: str, bindings) -> bool:
        seen.update(first=first, readonly=cursor.is_readonly, code=cursor.has_vdbe, parameters=cursor.bindings_names)
        return False

    def authorizer(code, third, fourth, dbname, trigger) -> int:
        actions.append((code, third, fourth, dbname))
        return apsw.SQLITE_OK

    cursor = db.cursor()
    cursor.exec_trace = tracer
    previous = db.authorizer
    db.authorizer = authorizer
    try:
        cursor.execute(sql, apsw._null_bindings, can_cache=False)
    except apsw.ExecTraceAbort:
        pass
    except apsw.Error as exc:
        raise translate(exc) from None
    finally:
        db.authorizer = previous
        cursor.exec_trace = None
    if not seen:
        return "", True, False, actions, ()
    return seen["first"], seen["readonly"], seen["code"], actions, seen["parameters"]


def describe(db, sql: str) -> tuple:
    """describe is the (name, declared type) of each result column of the first statement of `sql`, prepared afresh."""
    import apsw
    described: list = []

    def tracer(cursor, first: str, bindings) -> bool:
        described[:] = cursor.get_description()
        return False
    cursor = db.cursor()
    cursor.exec_trace = tracer
    try:
        cursor.execute(sql, apsw._null_bindings, can_cache=False)
    except apsw.ExecTraceAbort:
        pass
    finally:
        cursor.exec_trace = None
    return tuple(described)


def classify(db, sql: str) -> Statement:
    """classify describes the first statement of `sql` (EMPTY if it holds none), preparing it on `db`.

    `db` may be a tuple of connections: the first that prepares it is used. Preparing a PRAGMA
    that sets something sets it on that connection (SQLite does it as it compiles the pragma), so
    a connection must come first where such a statement is meant to run.
    """
    if isinstance(db, tuple):
        for candidate in db[:-1]:
            try:
                return classify(candidate, sql)
            except Exception:  # noqa: BLE001 - the next one may know a table the first does not
                pass
        db = db[-1]
    first, readonly, has_code, actions, parameters = _actions(db, sql)
    rest = sql[len(first):] if first and sql.startswith(first) else ""
    return dataclasses.replace(_kind_of(first, rest, readonly, has_code, actions), parameters=parameters)


def _kind_of(first: str, rest: str, readonly: bool, has_code: bool, actions: list) -> Statement:
    import apsw
    if not has_code:
        return Statement(first, rest, EMPTY)
    codes = {code for code, *_ in actions}
    if apsw.SQLITE_TRANSACTION in codes:
        operation = next(third for code, third, _, _ in actions if code == apsw.SQLITE_TRANSACTION)
        mode = _BEGIN_MODE.match(first)
        kind = {"BEGIN": BEGIN, "COMMIT": COMMIT, "ROLLBACK": ROLLBACK}[operation]
        return Statement(first, rest, kind, name=mode.group(1).upper() if mode else "DEFERRED")
    if apsw.SQLITE_SAVEPOINT in codes:
        operation, name = next((third, fourth) for code, third, fourth, _ in actions if code == apsw.SQLITE_SAVEPOINT)
        kind = {"BEGIN": SAVEPOINT, "RELEASE": RELEASE, "ROLLBACK": ROLLBACK_TO}[operation]
        return Statement(first, rest, kind, name=name)
    for code, third, fourth, dbname in actions:
        if code == apsw.SQLITE_PRAGMA and fourth is not None:
            pragma = third.lower()
            if pragma in FILE_PRAGMAS and dbname in (None, "main"):
                return Statement(first, rest, PRAGMA_SET, pragma=pragma)
            if pragma == "journal_mode" and dbname in (None, "main"):
                return Statement(first, rest, JOURNAL_MODE, pragma=pragma)
            if pragma not in _PRAGMAS_READING_AN_ARGUMENT:      # a setting of this connection: it stays here
                return Statement(first, rest, LOCAL, pragma=pragma)
    if readonly:
        return Statement(first, rest, READ)
    schema = [(code, third) for code, third, fourth, dbname in actions
              if code in _SCHEMA_CODES and (third if code == apsw.SQLITE_ALTER_TABLE else dbname) == "main"]
    if schema:
        if schema[0][0] == apsw.SQLITE_CREATE_TABLE and apsw.SQLITE_SELECT in codes:
            return Statement(first, rest, CREATE_AS, table=schema[0][1])
        return Statement(first, rest, SCHEMA)
    writes = [code for code, third, _, dbname in actions
              if code in (apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE) and dbname == "main"
              and (third or "").lower() not in _SCHEMA_TABLES]
    if writes:
        return Statement(first, rest, WRITE, inserts=apsw.SQLITE_INSERT in writes)
    return Statement(first, rest, LOCAL)


def _schema_codes() -> frozenset[int]:
    import apsw
    return frozenset({apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_CREATE_TRIGGER,
                      apsw.SQLITE_CREATE_VIEW, apsw.SQLITE_DROP_INDEX, apsw.SQLITE_DROP_TABLE,
                      apsw.SQLITE_DROP_TRIGGER, apsw.SQLITE_DROP_VIEW, apsw.SQLITE_ALTER_TABLE,
                      apsw.SQLITE_CREATE_VTABLE, apsw.SQLITE_DROP_VTABLE})


_SCHEMA_CODES: frozenset[int] = frozenset()


class StatementCache:
    """StatementCache remembers what SQL texts do (like sqlite3's statement cache, by text, least recently used out)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        global _SCHEMA_CODES
        if not _SCHEMA_CODES:
            _SCHEMA_CODES = _schema_codes()
        self.size = max(1, size)
        self._known: collections.OrderedDict[str, Statement] = collections.OrderedDict()

    def classify(self, db, sql: str) -> Statement:
        """classify is `classify(db, sql)`, cached."""
        found = self._known.get(sql)
        if found is not None:
            self._known.move_to_end(sql)
            return found
        found = classify(db, sql)
        if found.kind not in (EMPTY,):
            self._known[sql] = found
            if len(self._known) > self.size:
                self._known.popitem(last=False)
        return found

    def clear(self) -> None:
        """clear forgets everything (after a schema change: a name may now mean another table)."""
        self._known.clear()


def split(db, script: str):
    """split yields the statements of `script` in order, each classified when the ones before it ran.

    It is a generator: a statement is prepared only after the previous one was executed, so it
    may use tables the script created before it. `db` is an apsw connection, or a function
    returning the one to prepare on now (a transaction moves to the leader's group as it writes).
    """
    target = db if callable(db) else lambda: db
    rest = script
    while rest and rest.strip():
        statement = classify(target(), rest)
        if statement.kind == EMPTY and not statement.sql:
            return
        yield statement
        if not statement.rest or statement.rest == rest:
            return
        rest = statement.rest
