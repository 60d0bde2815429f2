"""walkit.adapters.sqlite.definition holds the functions, aggregates and collations that are part of a database's definition.

A schema can call application code: a partial index `WHERE f(x)`, an index on `f(x)`, a
`CHECK (g(x))`, a generated column, a trigger or a view calling a Python function, a column
`COLLATE c`. Every node applies the log with such a schema, so every node needs that code
before its first record, and the same code. So these are registered on the database, in every
process, before connect:

    import walkit.adapters.sqlite as sqlite3
    sqlite3.create_function("slug", 1, slugify, deterministic=True)
    conn = sqlite3.connect("app.db", name="app")

A definition registered here is on every connection of every replicated database of this
process, and on the connection that applies the log. `Connection.create_function` and its
siblings stay sqlite3's: that connection only; what it computes travels as values, but a schema
statement that needs it fails at the client ("no such function: f"), because the leader
applies every record as the followers will, with the database's definitions only, before it is
appended (walkit.adapters.sqlite.machine). `missing(db)` tells which definition a file's schema
needs that this process lacks: a node refuses to open, naming it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Callable

from walkit.adapters.sqlite import callbacks

_lock = threading.Lock()
#: (kind, name, narg) -> how to register it on an apsw connection.
_registered: dict[tuple[str, str, int], Callable] = {}
#: Called with each new registration (walkit.adapters.sqlite.database registers it on the open databases).
listeners: list[Callable[[Callable], None]] = []

_MISSING = ((re.compile(r"no such function: ([^\s()]+)"), "function"),
            (re.compile(r"unknown function: ([^\s()]+)\(\)"), "function"),
            (re.compile(r"no such collation sequence: (\S+)"), "collation"))


def _add(key: tuple[str, str, int], register: Callable) -> None:
    with _lock:
        _registered[key] = register
        targets = list(listeners)
    for listener in targets:
        listener(register)


def create_function(name: str, narg: int, func, *, deterministic: bool = False) -> None:
    """create_function registers SQL function `name` on every replicated database of this process (see the module doc).

    Call it before connect, in every process that connects to a database whose schema uses it.
    """
    _add(("function", name.lower(), narg),
         lambda db: db.create_scalar_function(name, func, narg, deterministic=deterministic))


def create_aggregate(name: str, n_arg: int, aggregate_class) -> None:
    """create_aggregate registers aggregate `name` (a class with step() and finalize()) on every replicated database.

    It behaves as sqlite3's Connection.create_aggregate (walkit.adapters.sqlite.callbacks.aggregate):
    over no rows it is NULL, and a failing method is sqlite3's OperationalError.
    """
    _add(("aggregate", name.lower(), n_arg),
         lambda db: db.create_aggregate_function(name, callbacks.aggregate(aggregate_class), n_arg))


def create_collation(name: str, callable_) -> None:
    """create_collation registers collation `name` on every replicated database of this process."""
    _add(("collation", name.lower(), -1), lambda db: db.create_collation(name, callable_))


def register_all(db) -> None:
    """register_all registers every definition of this process on apsw connection `db`."""
    with _lock:
        registrations = list(_registered.values())
    for register in registrations:
        register(db)


@dataclass(frozen=True)
class Missing:
    """Missing is a definition a schema uses and a connection lacks: a `what` ("function", "collation") called `name`."""

    what: str
    name: str
    used_by: str = ""

    @property
    def message(self) -> str:
        """message is what SQLite says when a statement needs it, as sqlite3 reports it."""
        if self.what == "collation":
            return f"no such collation sequence: {self.name}"
        return f"no such function: {self.name}"


def missing_in(error: BaseException, used_by: str = "") -> Missing | None:
    """missing_in is the function or collation an SQLite error says is missing, else None."""
    for pattern, what in _MISSING:
        found = pattern.search(str(error))
        if found:
            return Missing(what, found.group(1), used_by)
    return None


def missing(db) -> Missing | None:
    """missing compiles what the schema of `db` runs (each table's writes with its triggers, each view) to find a definition it lacks.

    Nothing is executed: EXPLAIN compiles a statement's CHECK constraints, index expressions,
    generated columns and triggers. Triggers are compiled even on a connection that runs with
    them off (the apply connection): they run on the leader's connections.
    """
    import apsw
    was = db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, -1)
    db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 1)
    try:
        objects = db.execute("SELECT type, name, sql FROM sqlite_schema WHERE type IN ('table', 'view') "
                             "AND name NOT LIKE 'sqlite_%'").fetchall()
        for kind, name, sql in objects:
            if kind == "table" and (sql or "").upper().startswith("CREATE VIRTUAL"):
                continue
            for statement in _statements(db, kind, name):
                try:
                    db.execute("EXPLAIN " + statement).fetchall()
                except apsw.SQLError as exc:
                    lacking = missing_in(exc, f"{kind} {name}")
                    if lacking is not None:
                        return lacking
                    raise
    finally:
        db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, was)
    return None


def _statements(db, kind: str, name: str) -> list[str]:
    quoted = '"' + name.replace('"', '""') + '"'
    if kind == "view":
        return [f"SELECT * FROM {quoted}"]
    columns = [row[1] for row in db.execute(f"PRAGMA table_xinfo({quoted})") if row[6] in (0, 1)]
    assignments = ", ".join(f'"{c}" = "{c}"' for c in (col.replace('"', '""') for col in columns))
    return [f"INSERT INTO {quoted} DEFAULT VALUES", f"UPDATE {quoted} SET {assignments}", f"DELETE FROM {quoted}"]
