"""walkit.adapters.sqlite.hooks holds what a program attaches to one connection: functions, hooks, limits.

They are sqlite3's and stay on the connection that set them: its statements see them, the log
does not. A function defined here computes values that travel in the changeset; a schema that
calls one needs it on the database (walkit.adapters.sqlite.definition). The authorizer and the
progress handler are paused while the connection builds a changeset (`_capturing`), because
the Session module reads the rows it records through this connection. Callbacks are wrapped by
walkit.adapters.sqlite.callbacks so that they fail as under sqlite3. On a follower, a write
transaction forwarded to the leader (walkit.adapters.sqlite.forwarding) runs on a connection
of the leader's process: none of this connection's functions and hooks apply to it.
"""

from __future__ import annotations

import contextlib
import sqlite3

from walkit.adapters.sqlite import callbacks
from walkit.adapters.sqlite.errors import DatabaseError, NotSupportedError, ProgrammingError, translate

_NO_EXTENSIONS = ("loading a SQLite extension is not supported: C code loaded into one connection (its functions, "
                  "collations, virtual tables) is not on the other nodes, and walkit cannot see what it writes")
#: The authorizer's action codes and answers that _ending uses.
TRANSACTION, SAVEPOINT = sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT
_DENY, _IGNORE = sqlite3.SQLITE_DENY, sqlite3.SQLITE_IGNORE
#: SQLite's run-time limit categories, SQLITE_LIMIT_LENGTH (0) to SQLITE_LIMIT_WORKER_THREADS (11).
_LIMIT_CATEGORIES = 12


class Hooks:
    """Hooks is the part of Connection that defines functions and sets hooks and limits (sqlite3.Connection's).

    It uses the connection's `_db` (apsw), `_check()`, `_tracer` and `_hooks_paused`. Each of them but the
    trace callback and getlimit sets `_local`: the connection's write transactions then run on
    its own SQLite connection, where they are, not in the leader's group (walkit.adapters.sqlite.connection).
    """

    def create_function(self, name: str, narg: int, func, *, deterministic: bool = False) -> None:
        """create_function defines SQL function `name` on this connection only; its results travel as values.

        A schema that calls it (an index, a CHECK, a trigger, a view) needs it on every node:
        register it on the database with walkit.adapters.sqlite.create_function before connect
        (walkit.adapters.sqlite.definition); otherwise such a statement fails here, "no such function".
        """
        self._check()
        self._local = True
        self._db.create_scalar_function(name, None if func is None else callbacks.scalar(func), narg,
                                        deterministic=deterministic)

    def create_aggregate(self, name: str, n_arg: int, aggregate_class) -> None:
        """create_aggregate defines aggregate `name` (a class with step() and finalize()) on this connection."""
        self._check()
        self._local = True
        self._db.create_aggregate_function(name, None if aggregate_class is None
                                           else callbacks.aggregate(aggregate_class), n_arg)

    def create_window_function(self, name: str, num_params: int, aggregate_class, /) -> None:
        """create_window_function defines window function `name` (step, value, inverse, finalize); None removes it."""
        self._check()
        self._local = True
        try:
            self._db.create_window_function(name, None if aggregate_class is None
                                            else callbacks.window(aggregate_class), num_params)
        except Exception as exc:  # noqa: BLE001 - apsw's errors become DB-API errors
            raise translate(exc) from None

    def create_collation(self, name: str, callable_, /) -> None:
        """create_collation defines collation `name` on this connection only; None removes it."""
        self._check()
        if callable_ is not None and not callable(callable_):
            raise TypeError("parameter must be callable")
        self._local = True
        self._db.create_collation(name, callable_)

    # -- hooks of this connection (local: they see this connection's statements, never the log's) ------
    def set_authorizer(self, authorizer_callback, /) -> None:
        """set_authorizer calls `authorizer_callback(action, arg1, arg2, dbname, source)` as statements are prepared.

        It returns SQLITE_OK, SQLITE_DENY or SQLITE_IGNORE; None removes it. It governs this
        connection's statements; the log is applied on every node without it.
        """
        self._check()
        self._local = True
        self._authorizer = None if authorizer_callback is None else callbacks.authorizer(
            authorizer_callback, lambda: self._hooks_paused > 0)
        self._db.authorizer = self._authorizer

    def set_progress_handler(self, progress_handler, n: int) -> None:
        """set_progress_handler calls `progress_handler()` every `n` SQLite instructions; a true result interrupts."""
        self._check()
        self._local = True
        if progress_handler is None or n <= 0:
            self._db.set_progress_handler(None)
        else:
            self._db.set_progress_handler(callbacks.progress(progress_handler, lambda: self._hooks_paused > 0), n)

    def set_trace_callback(self, trace_callback, /) -> None:
        """set_trace_callback calls `trace_callback(sql)` with each statement this connection runs; None stops it.

        It sees what sqlite3 would show (the statements, the implicit BEGIN and COMMIT); the
        replication's own statements and the statements run by triggers are not shown.
        """
        self._check()
        self._tracer = None if trace_callback is None else callbacks.trace(trace_callback)

    def getlimit(self, category: int, /) -> int:
        """getlimit is this connection's run-time limit `category` (sqlite3.SQLITE_LIMIT_*)."""
        return self.setlimit(category, -1)

    def setlimit(self, category: int, limit: int, /) -> int:
        """setlimit sets this connection's limit `category` (negative: unchanged) and returns the previous value."""
        self._check()
        if not 0 <= category < _LIMIT_CATEGORIES:
            raise ProgrammingError("'category' is out of bounds")
        if limit >= 0:
            self._local = True
        return self._db.limit(category, limit)

    def enable_load_extension(self, enabled: bool, /) -> None:
        """enable_load_extension is refused: see load_extension."""
        self._check()
        raise NotSupportedError(_NO_EXTENSIONS)

    def load_extension(self, path: str, /, *, entrypoint: str | None = None) -> None:
        """load_extension is refused: C code loaded into one connection is not on the nodes that apply the log."""
        self._check()
        raise NotSupportedError(_NO_EXTENSIONS)

    @contextlib.contextmanager
    def _capturing(self):
        """_capturing pauses this connection's authorizer and progress handler while a changeset is built.

        The Session module reads the rows it records with statements of its own on this
        connection: an authorizer answering SQLITE_IGNORE would record NULLs in the log, a
        progress handler would interrupt the capture. COMMIT's local ROLLBACK (the record is
        applied from the log) runs paused too: a hook refusing transactions must not leave the
        local transaction open once the record is built.
        """
        self._hooks_paused += 1
        try:
            yield
        finally:
            self._hooks_paused -= 1

    def _ending(self, text: str, action: int, operation: str, savepoint: str | None = None) -> bool:
        """_ending asks the authorizer about a statement that ends the transaction, and traces it; False: do nothing.

        walkit ends a transaction without running that statement (a COMMIT goes through the
        log), so the authorizer is asked here as SQLite asks when it prepares one: SQLITE_DENY
        raises DatabaseError "not authorized" and the transaction stays open; SQLITE_IGNORE
        makes the statement a no-op.
        """
        if self._authorizer is not None:
            verdict = self._authorizer(action, operation, savepoint, None, None)
            if verdict == _DENY:
                raise DatabaseError("not authorized")
            if verdict == _IGNORE:
                return False
        self._trace(text)
        return True

    def _trace(self, sql: str) -> None:
        """_trace shows `sql` to the set_trace_callback callable, if any."""
        if self._tracer is not None:
            self._tracer(sql)
