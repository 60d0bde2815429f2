"""walkit.adapters.sqlite.connection is the DB-API connection: transactions captured as changesets and replicated.

A write transaction on the leader (walkit.adapters.sqlite.database):

    first write:  take the file's write lock (NotLeader on a follower), attach an apsw Session
                  to every table of the main database
    statements:   run locally, so the transaction reads its own writes; a schema statement
                  closes the changeset so far and travels as its own step, in order
    COMMIT:       take the changeset, ROLLBACK locally, submit the record; walkit.replicate
                  appends it, waits for the log's acknowledgement and applies it on every node,
                  this one included (walkit.adapters.sqlite.machine), with the position
    ROLLBACK:     roll back locally; the log never sees the transaction

"Locally" is, for most transactions, the leader's group (walkit.adapters.sqlite.machine's module
doc): the statements run in a savepoint of the apply connection, on top of the transactions
committed before whose records are still on their way to the log, and the write lock is let go
once the record is sent, so the next writer's transaction shares the log's round trip. A
transaction runs on the connection's own SQLite connection instead, once the group has drained,
when it read before it wrote (it must see the file as it read it, or fail "database is locked"
as SQLite does) or when the connection has functions, hooks, limits or settings of its own
(`_local`: they are not on the apply connection).

So the file changes only by applying the log, on the leader as on followers. A commit hook
refuses any other commit of the main database on these connections, so a write that escaped
the capture fails loudly instead of making this file differ from the others. Transactions
follow sqlite3's rules: `isolation_level` "" / "DEFERRED" / "IMMEDIATE" / "EXCLUSIVE" open
one before INSERT/UPDATE/DELETE/REPLACE; None autocommits; explicit BEGIN, COMMIT, ROLLBACK
and SAVEPOINT work; a statement that fails undoes itself only, as in SQLite.
"""

from __future__ import annotations

import threading
import weakref

from walkit.adapters.sqlite import dbapi, definition, errors
from walkit.adapters.sqlite import statements as st
from walkit.adapters.sqlite.cursor import Cursor
from walkit.adapters.sqlite.export import Copies
from walkit.adapters.sqlite.hooks import SAVEPOINT, TRANSACTION, Hooks
from walkit.adapters.sqlite.errors import OperationalError, ProgrammingError, translate
from walkit.adapters.sqlite.capture import Open as _Open
from walkit.adapters.sqlite.capture import capture_session, only_comments, record_created_table
from walkit.adapters.sqlite.machine import GROUP_SAVEPOINTS, now_ms

class Connection(Hooks, Copies):
    """Connection is a DB-API 2.0 connection to a replicated SQLite file (sqlite3.Connection's interface).

    Made by walkit.adapters.sqlite.connect. Its callbacks and hooks are walkit.adapters.sqlite.hooks.Hooks,
    its copies (iterdump, serialize, backup) walkit.adapters.sqlite.export.Copies. Besides sqlite3's interface: `is_leader`, `leader`,
    `position` (the log position this file applied) and `read_barrier()`.
    """

    Error, Warning, InterfaceError, DatabaseError, DataError = errors.Error, errors.Warning, errors.InterfaceError, \
        errors.DatabaseError, errors.DataError
    OperationalError, IntegrityError, InternalError, ProgrammingError, NotSupportedError = errors.OperationalError, \
        errors.IntegrityError, errors.InternalError, errors.ProgrammingError, errors.NotSupportedError

    def __init__(self, database, *, timeout: float = 5.0, detect_types: int = 0, isolation_level: str | None = "",
                 check_same_thread: bool = True, cached_statements: int = 128, readonly: bool = False,
                 forward_writes: bool = True, group_commit: bool = True) -> None:
        import apsw
        check_isolation_level(isolation_level)
        self._database = database
        self._db = apsw.Connection(database.path, flags=apsw.SQLITE_OPEN_READONLY if readonly
                                   else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
        self._readonly = readonly
        self._tracer = None
        self._authorizer = None
        self._hooks_paused = 0
        self._db.set_busy_timeout(int(timeout * 1000))
        self._db.set_commit_hook(_weak_hook(self))     # no cycle: a connection dropped is closed at once (__del__)
        definition.register_all(self._db)
        database.connections.add(self)
        self._timeout = timeout
        self._forward_writes = forward_writes
        self._group_commit = group_commit              # its write transactions join the leader's group (module doc)
        self._remote = None                            # a forwarding.Forwarder once a write went to the leader
        self.detect_types = detect_types
        self.row_factory = None
        self.text_factory = str
        self._isolation_level = isolation_level
        self._check_same_thread = check_same_thread
        self._thread = threading.get_ident()
        self._statements = st.StatementCache(cached_statements)
        self._txn: _Open | None = None
        self._cursors: weakref.WeakSet[Cursor] = weakref.WeakSet()
        self._closed = False
        self._lock = threading.RLock()
        self._allow_commit = False
        #: It has functions, hooks, limits or settings of its own: its write transactions run on it (module doc).
        self._local = False
        self._changes_elsewhere = 0                    # rows its transactions changed in the leader's group

    # -- sqlite3's interface ------------------------------------------------------------------------
    def cursor(self, factory=Cursor) -> Cursor:
        """cursor returns a new cursor of this connection, made by `factory` (a Cursor subclass)."""
        self._check()
        cursor = factory(self)
        if not isinstance(cursor, Cursor):
            raise TypeError(f"factory must return a cursor, not {type(cursor).__name__}")
        return cursor

    def execute(self, sql: str, parameters=()) -> Cursor:
        """execute runs one statement on a new cursor and returns it."""
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters) -> Cursor:
        """executemany runs one statement per parameter set on a new cursor and returns it."""
        return self.cursor().executemany(sql, seq_of_parameters)

    def executescript(self, sql_script: str) -> Cursor:
        """executescript runs a script of statements on a new cursor and returns it."""
        return self.cursor().executescript(sql_script)

    @property
    def in_transaction(self) -> bool:
        """in_transaction is True while a transaction is open."""
        return self._txn is not None or self._forwarding()

    @property
    def isolation_level(self) -> str | None:
        """isolation_level: None autocommits; otherwise a transaction opens before INSERT/UPDATE/DELETE/REPLACE."""
        return self._isolation_level

    @isolation_level.setter
    def isolation_level(self, value: str | None) -> None:
        check_isolation_level(value)
        if value is None and self.in_transaction:
            self.commit()
        self._isolation_level = value

    @property
    def total_changes(self) -> int:
        """total_changes counts the rows this connection changed."""
        return self._db.total_changes() + self._changes_elsewhere

    def commit(self) -> None:
        """commit makes the open transaction durable in the log and applied here; no transaction: nothing happens.

        On failure (NotLeader, CommitFailed) the transaction is rolled back locally.
        """
        with self._lock:
            self._check()
            if self._txn is not None and not self._ending("COMMIT", TRANSACTION, "COMMIT"):
                return
            self._commit()

    def _commit(self) -> None:
        with self._lock:
            if self._forwarding():
                return self._remote.commit()
            txn = self._txn
            if txn is None:
                return
            self._detach_cursors()
            if not txn.locked:                       # nothing of the main database was written
                self._txn = None
                self._local_commit()
                return
            database = self._database
            member, sent, read = txn.member, None, False
            try:
                with self._capturing():                # the replication's own statements: no hook refuses them
                    txn.flush()
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                if txn.record.steps:
                    txn.record.commit_ms = now_ms()
                    txn.record.node = database.node_id
                    if member is None:
                        database.submit(txn.record.encode())      # tried, appended, applied
                    else:
                        sent = database.send(member, txn.record.encode())     # tried, on its way
                elif member is not None:
                    database.machine.leave(member)
                    read = True                        # it wrote nothing, and read the members before it
            except BaseException:
                if member is not None and sent is None:
                    database.machine.leave(member)
                raise
            finally:
                self._txn = None
                database.write_lock.release()
            if sent is not None:
                database.finish(member, sent)          # in the log, then committed here with its group
            elif read:
                database.read_through(member)

    def rollback(self) -> None:
        """rollback abandons the open transaction; the log never sees it."""
        with self._lock:
            self._check()
            if self._txn is not None and not self._ending("ROLLBACK", TRANSACTION, "ROLLBACK"):
                return
            with self._capturing():                    # asked above; the ROLLBACK below is walkit's
                self._end_locally()

    def close(self) -> None:
        """close rolls back an open transaction and closes the connection (from the thread that made it, as sqlite3)."""
        self._check_thread()
        self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._end_locally()
            finally:
                self._closed = True
                for cursor in list(self._cursors):
                    cursor._reset()
                if self._remote is not None:
                    self._remote.close()
                self._db.close()
                self._release()

    def _release(self) -> None:
        """_release ends this connection's use of its database: the last one stops the node."""
        from walkit.adapters.sqlite.database import release
        release(self._database)

    def __del__(self) -> None:
        """__del__ closes a connection dropped without close(), as sqlite3 does: its node goes with its last one."""
        if getattr(self, "_closed", True):
            return
        try:
            self._close()                              # any thread: the collector's, not the creator's
        except Exception:  # noqa: BLE001 - nothing to tell in a finalizer; the node was released or is gone
            pass

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
        return False

    def interrupt(self) -> None:
        """interrupt makes the running statement fail with 'interrupted'."""
        if self._closed:
            raise ProgrammingError("Cannot operate on a closed database.")
        self._target().interrupt()

    # -- blobs: read in place (walkit.adapters.sqlite.blob) ----------------------------------------------
    def blobopen(self, table: str, column: str, row: int, /, *, readonly: bool = False, name: str = "main"):
        """blobopen opens the blob in `table`.`column` of rowid `row` for reading (walkit.adapters.sqlite.blob.Blob).

        A blob of the replicated database cannot be written in place (a write would bypass the
        log): its write() raises NotSupportedError; write with UPDATE instead. TEMP and attached
        databases' blobs are this connection's own and writable.
        """
        self._check()
        from walkit.adapters.sqlite.blob import Blob
        replicated = name.lower() == "main"
        try:
            db = self._target() if replicated else self._db
            return Blob(self, db.blob_open(name, table, column, row, not readonly and not replicated),
                        writable=not readonly, replicated=replicated)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from None

    # -- walkit's additions ---------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """is_leader is True while this node's connections may write."""
        return self._database.is_leader

    @property
    def leader(self) -> str | None:
        """leader is the node id of the leader, as last known."""
        return self._database.leader

    @property
    def position(self):
        """position is the walkit.Position of the last log entry applied to this file (None before any)."""
        from walkit.core.loglist import Position
        at = self._database.machine.position
        return None if at is None else Position(at[0], at[1])

    def read_barrier(self, timeout: float | None = None) -> None:
        """read_barrier waits until this file applied every transaction committed before the call (any node)."""
        self._database.node.read_barrier(timeout)

    # -- running statements (cursors call these) ------------------------------------------------------
    def _execute(self, cursor: Cursor, sql: str, parameters, *, single: bool, many: bool = False) -> None:
        if not isinstance(sql, str):
            raise TypeError(f"execute() argument 1 must be str, not {type(sql).__name__}")
        if "\0" in sql:
            raise ProgrammingError("the query contains a null character")
        with self._lock:
            self._check()
            self._database.check()                 # a stopped replica serves nothing: its data is behind
            if self._forwarding():                   # the leader runs the transaction: it knows its tables
                return self._remote.run(cursor, sql, parameters, "many" if many else "one")
            statement = self._statements.classify(self._preparing(), sql)
            if single and statement.rest and not only_comments(statement.rest):
                raise ProgrammingError("You can only execute one statement at a time.")
            if many and statement.kind not in (st.WRITE,):
                raise ProgrammingError("executemany() can only execute DML statements.")
            self._run(cursor, statement, dbapi.bind(statement.parameters, parameters), implicit=True)

    def _execute_script(self, cursor: Cursor, script: str) -> None:
        with self._lock:
            self._check()
            if self.in_transaction and self._isolation_level is not None:
                self.commit()
            for statement in st.split(self._preparing, script):
                if self._forwarding() or self._forwards(statement):     # the rest of the script runs on the leader
                    self._forwarder().begin(cursor, statement.sql + statement.rest, (), "script")
                    return
                self._run(cursor, statement, (), implicit=False)
                cursor._drain()

    def _run(self, cursor: Cursor, statement: st.Statement, parameters, *, implicit: bool) -> None:
        kind = statement.kind
        if self._forwards(statement):
            return self._forwarder().begin(cursor, statement.sql, parameters)
        txn = self._txn
        if txn is not None and not txn.locked and kind not in _STARTS_NOTHING:
            txn.ran = True                         # a read or a savepoint here: it stays on this connection
        try:
            if kind in (st.READ, st.SAVEPOINT, st.RELEASE, st.ROLLBACK_TO, st.BEGIN, st.COMMIT, st.ROLLBACK,
                        st.EMPTY, st.JOURNAL_MODE, st.LOCAL):
                self._run_control(cursor, statement, parameters)
            else:
                self._run_write(cursor, statement, parameters, implicit)
        finally:
            if self._txn is not None and not self._target().in_transaction:
                self._end_locally()                # SQLite rolled the transaction back itself

    def _run_control(self, cursor: Cursor, statement: st.Statement, parameters) -> None:
        kind = statement.kind
        if kind in (st.SAVEPOINT, st.RELEASE, st.ROLLBACK_TO) and statement.name.lower().startswith(GROUP_SAVEPOINTS):
            raise OperationalError(f"savepoint names starting {GROUP_SAVEPOINTS!r} are walkit's (the leader's group "
                                   f"of transactions): no such savepoint: {statement.name}")
        if kind == st.READ:
            cursor._run(statement, parameters)
        elif kind == st.BEGIN:
            if self._txn is not None:
                raise OperationalError("cannot start a transaction within a transaction")
            self._trace(statement.sql.strip())
            self._begin()
            if statement.name in ("IMMEDIATE", "EXCLUSIVE"):
                if self._forward_writes and not self._database.is_leader:
                    self._forwarder().begin(cursor, None, ())
                else:
                    self._write_locked()
        elif kind == st.COMMIT:
            if self._txn is None:
                raise OperationalError("cannot commit - no transaction is active")
            if self._ending(statement.sql.strip(), TRANSACTION, "COMMIT"):
                self._commit()
        elif kind == st.ROLLBACK:
            if self._txn is None:
                raise OperationalError("cannot rollback - no transaction is active")
            if self._ending(statement.sql.strip(), TRANSACTION, "ROLLBACK"):
                with self._capturing():
                    self._end_locally()
        elif kind == st.SAVEPOINT:
            started = self._txn is None
            cursor._run(statement, parameters)
            if started:
                self._txn = _Open(savepoint=statement.name)
        elif kind == st.RELEASE and self._txn is not None and self._txn.savepoint \
                and statement.name.lower() == self._txn.savepoint.lower():
            if self._ending(statement.sql.strip(), SAVEPOINT, "RELEASE", statement.name):
                self._commit()                     # releasing the outermost savepoint commits
        elif kind == st.JOURNAL_MODE:               # the file stays in WAL mode: readers go on reading
            cursor._run(st.Statement("PRAGMA journal_mode", "", st.READ), ())
        elif kind == st.LOCAL:
            self._local = True                     # its settings, TEMP tables, attached files: not the group's
            self._allow_commit = True
            try:
                cursor._run(statement, parameters, self._db)       # never the apply connection's
            finally:
                self._allow_commit = False
        elif kind != st.EMPTY:
            cursor._run(statement, parameters)

    def _run_write(self, cursor: Cursor, statement: st.Statement, parameters, implicit: bool) -> None:
        if self._readonly:
            raise OperationalError("attempt to write a readonly database")
        autocommit = self._txn is None and not (implicit and statement.kind == st.WRITE
                                                and self._isolation_level is not None)
        if self._txn is None:
            if not autocommit:
                self._trace(f"BEGIN {self._isolation_level}")
            self._begin()
        try:
            self._write_locked()
            if statement.kind == st.WRITE:
                cursor._run(statement, parameters)
            else:
                self._run_schema(cursor, statement, parameters)
        except BaseException:
            if autocommit:
                self._end_locally()
            raise
        if autocommit:
            self._commit()

    def _run_schema(self, cursor: Cursor, statement: st.Statement, parameters) -> None:
        """_run_schema runs a schema statement as its own step, between the changesets before and after it."""
        txn = self._txn
        with self._capturing():
            txn.flush()
        try:
            cursor._run(statement, parameters)
            with self._capturing():
                if statement.kind == st.CREATE_AS:
                    record_created_table(self._target(), txn, statement.table)
                else:
                    txn.record.add_sql(statement.sql)
        finally:
            with self._capturing():
                txn.session = capture_session(self._target())
            self._statements.clear()

    # -- transactions ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        try:
            self._db.execute("BEGIN")
        except Exception as exc:  # noqa: BLE001 - apsw errors become DB-API errors
            raise translate(exc) from None
        self._txn = _Open()

    def _write_locked(self) -> None:
        """_write_locked makes the open transaction a write transaction: the leader's lock and a Session."""
        txn = self._txn
        if txn.locked:
            return
        database = self._database
        database.check()
        if not database.is_leader:
            raise database.not_leader()
        if not database.write_lock.acquire(timeout=self._timeout):
            raise OperationalError("database is locked")
        try:
            if self._joins():
                txn.member = database.join(self._timeout)
                if txn.member is None:
                    raise OperationalError("database is locked")
            elif not database.machine.drain(self._timeout):     # the group holds the file's write lock
                raise OperationalError("database is locked")
            database.check()
            if not database.is_leader:
                raise database.not_leader()
            with self._capturing():
                txn.session = capture_session(self._target())
        except BaseException:
            if txn.member is not None:
                database.machine.leave(txn.member)
                txn.member = None
            database.write_lock.release()
            raise
        txn.locked = True

    def _joins(self) -> bool:
        """_joins tells whether the transaction starting to write runs in the leader's group (module doc)."""
        import apsw
        txn = self._txn
        return (self._group_commit and not self._local and not txn.savepoint and not txn.ran
                and self._db.txn_state("main") == apsw.SQLITE_TXN_NONE)

    def _preparing(self):
        """_preparing is where a statement is classified (statements.classify): this connection's own first, as
        a PRAGMA setting takes effect as it is prepared; then the apply connection, which knows a member's
        new tables."""
        target = self._target()
        return self._db if target is self._db else (self._db, target)

    def _target(self):
        """_target is the apsw connection the open transaction's statements run on: the apply connection for a
        member of the leader's group, else this connection's own."""
        txn = self._txn
        return self._db if txn is None or txn.member is None else self._database.machine.db

    def _end_locally(self) -> None:
        """_end_locally rolls the open transaction back here (and on the leader, if it went there) and lets the write lock go."""
        if self._remote is not None:
            self._remote.rollback()
        txn, self._txn = self._txn, None
        if txn is None:
            return
        self._detach_cursors()
        try:
            if txn.session is not None:
                txn.session.close()
            if txn.member is not None:
                self._database.machine.leave(txn.member)
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        finally:
            if txn.locked:
                self._database.write_lock.release()

    def _local_commit(self) -> None:
        """_local_commit ends a transaction that wrote nothing replicated (reads, TEMP tables)."""
        if not self._db.in_transaction:
            return
        self._allow_commit = True
        try:
            self._db.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from None
        finally:
            self._allow_commit = False

    def _commit_hook(self) -> bool:
        """_commit_hook refuses (True) a local commit that writes the main database outside the log."""
        import apsw
        if self._allow_commit:
            return False
        return self._db.txn_state("main") == apsw.SQLITE_TXN_WRITE

    # -- writes from a follower (walkit.adapters.sqlite.forwarding) --------------------------------------
    def _forwards(self, statement: st.Statement) -> bool:
        """_forwards is True if `statement` writes the database and goes to the leader: this node does not lead.

        A transaction that wrote here while this node led stays here (its COMMIT raises NotLeader):
        moving it would leave its first writes behind.
        """
        return (statement.kind in st.REPLICATED and self._forward_writes and not self._readonly
                and not self._database.is_leader and (self._txn is None or not self._txn.locked))

    def _forwarding(self) -> bool:
        """_forwarding is True while this connection's transaction is open on the leader."""
        return self._remote is not None and self._remote.active

    def _forwarder(self):
        if self._remote is None:
            from walkit.adapters.sqlite.forwarding import Forwarder
            self._remote = Forwarder(self)
        return self._remote

    def _detach_cursors(self) -> None:
        for cursor in list(self._cursors):
            cursor.detach()

    def _track(self, cursor: Cursor) -> None:
        self._cursors.add(cursor)

    def _check(self) -> None:
        if self._closed:
            raise ProgrammingError("Cannot operate on a closed database.")
        self._check_thread()

    def _check_thread(self) -> None:
        if self._check_same_thread and threading.get_ident() != self._thread:
            raise ProgrammingError("SQLite objects created in a thread can only be used in that same thread. "
                                   f"The object was created in thread id {self._thread} and this is thread id "
                                   f"{threading.get_ident()}.")


#: Statements after which a transaction that has not written yet may still join the leader's group.
_STARTS_NOTHING = st.REPLICATED | {st.EMPTY, st.BEGIN, st.COMMIT, st.ROLLBACK}


def check_isolation_level(value) -> None:
    """check_isolation_level refuses what sqlite3 refuses as an isolation_level, with sqlite3's errors."""
    if value is not None and not isinstance(value, str):
        raise TypeError("isolation_level must be str or None")
    if value is not None and value.upper() not in ("", "DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
        raise ValueError("isolation_level string must be '', 'DEFERRED', 'IMMEDIATE', or 'EXCLUSIVE'")


def _weak_hook(connection: Connection):
    """_weak_hook is `connection._commit_hook` held weakly, so the apsw connection does not keep it alive."""
    ref = weakref.ref(connection)

    def hook() -> bool:
        alive = ref()
        return alive._commit_hook() if alive is not None else False
    return hook
