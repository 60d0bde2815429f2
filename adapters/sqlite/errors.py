"""walkit.adapters.sqlite.errors holds the DB-API exceptions and turns apsw's errors into them.

The exception classes are the standard `sqlite3` module's own, so a program that catches
`sqlite3.IntegrityError` catches it from walkit too. The replication errors are both: a
NotLeader is a walkit.errors.NotLeader (with `.leader`) and a sqlite3.OperationalError; a
TransactionTooLarge is a walkit.errors.RecordTooLarge and a sqlite3.DataError.
"""

from __future__ import annotations

import sqlite3

from walkit.errors import NotLeader as _WalkitNotLeader
from walkit.errors import RecordTooLarge, WalkitError

Warning = sqlite3.Warning  # noqa: A001 - DB-API 2.0 name
Error = sqlite3.Error
InterfaceError = sqlite3.InterfaceError
DatabaseError = sqlite3.DatabaseError
DataError = sqlite3.DataError
OperationalError = sqlite3.OperationalError
IntegrityError = sqlite3.IntegrityError
InternalError = sqlite3.InternalError
ProgrammingError = sqlite3.ProgrammingError
NotSupportedError = sqlite3.NotSupportedError


class NotLeader(_WalkitNotLeader, OperationalError):
    """NotLeader is raised for a write on a node that does not lead the database; `leader` names the leader.

    Nothing was written: the transaction is rolled back. Connect to the leader (or wait for this
    node to be elected) and try again.
    """


class CommitFailed(WalkitError, OperationalError):
    """CommitFailed is raised when COMMIT could not be confirmed by the log; the transaction is rolled back locally.

    Like a timeout, the transaction may or may not be in the log: if it is, every node applies
    it, this one included. `leader` names the leader as last known, if leadership was lost.
    """

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


#: SQLite's result code for "string or blob too big" (SQLITE_TOOBIG).
SQLITE_TOOBIG = 18


class TransactionTooLarge(RecordTooLarge, DataError):
    """TransactionTooLarge is raised by COMMIT for a transaction whose record is over the node's `max_record_bytes`.

    Nothing reached the log and the transaction is rolled back locally; the node keeps its role
    and the next transaction commits as usual. Transactions are refused, never split: commit the
    change in smaller transactions. It is a DataError because sqlite3 raises DataError for
    SQLITE_TOOBIG ("string or blob too big"), SQLite's own answer to a value over its size
    limit (SQLITE_MAX_LENGTH), and `sqlite_errorcode` / `sqlite_errorname` say SQLITE_TOOBIG.
    It is also a walkit.errors.RecordTooLarge (`size`, `limit`, `setting`).
    """

    def __init__(self, message: str, size: int = 0, limit: int = 0, setting: str = "") -> None:
        super().__init__(message, size, limit, setting)
        self.sqlite_errorcode = SQLITE_TOOBIG
        self.sqlite_errorname = "SQLITE_TOOBIG"


class ReplicaStopped(WalkitError, DatabaseError):
    """ReplicaStopped is raised once this node's copy stopped applying the log (a changeset did not apply).

    `position` is the log position of the record that failed and `table` the table it failed on
    (None if the failure was not in a table). The file is left as it was before that record.
    """

    def __init__(self, message: str, position=None, table: str | None = None) -> None:
        super().__init__(message)
        self.position = position
        self.table = table


class MissingFunction(ReplicaStopped):
    """MissingFunction is raised when this node lacks a function or collation its database's schema uses.

    `function` names it. Functions the schema uses are part of the database's definition:
    register them with walkit.adapters.sqlite.create_function (create_aggregate,
    create_collation) before connect, in every process; the node refuses to open without them,
    and its file stays as it was, so it opens once they are registered.
    """

    def __init__(self, message: str, function: str, position=None) -> None:
        super().__init__(message, position)
        self.function = function


#: apsw exception class name -> (DB-API class, what sqlite3 would have said when apsw's text differs).
_TRANSLATION = {
    "ConstraintError": IntegrityError, "MismatchError": IntegrityError,
    "TooBigError": DataError, "RangeError": ProgrammingError,
    "BindingsError": ProgrammingError, "ThreadingViolation": ProgrammingError,
    "CursorClosedError": ProgrammingError, "ConnectionClosedError": ProgrammingError,
    "SQLError": OperationalError, "BusyError": OperationalError, "LockedError": OperationalError,
    "ReadOnlyError": OperationalError, "CantOpenError": OperationalError, "FullError": OperationalError,
    "InterruptError": OperationalError, "IOError": OperationalError, "ProtocolError": OperationalError,
    "AbortError": OperationalError, "AuthError": DatabaseError, "PermissionsError": OperationalError,
    "CorruptError": DatabaseError, "NotADBError": DatabaseError, "FormatError": DatabaseError,
    "InternalError": InternalError, "MisuseError": ProgrammingError, "NoLFSError": OperationalError,
    "NotFoundError": OperationalError, "SchemaChangeError": OperationalError, "ExecutionCompleteError": ProgrammingError,
    "ExtensionLoadingError": OperationalError, "VFSNotImplementedError": NotSupportedError,
    "NoMemError": OperationalError, "EmptyError": OperationalError,
}


def translate(exc: BaseException) -> BaseException:
    """translate returns the DB-API exception for apsw exception `exc` (other exceptions come back as they are).

    An application callback that failed (walkit.adapters.sqlite.callbacks) becomes sqlite3's
    OperationalError ("user-defined function raised exception").

    The message is SQLite's own (`sqlite3_errmsg`, as the sqlite3 module reports it), and the
    result code is kept as `sqlite_errorcode` / `sqlite_errorname`.
    """
    import apsw

    from walkit.adapters.sqlite.callbacks import CallbackFailed
    if isinstance(exc, CallbackFailed):
        return OperationalError(str(exc))
    if not isinstance(exc, apsw.Error):
        return exc
    name = type(exc).__name__
    cls = _TRANSLATION.get(name, DatabaseError)
    message = str(exc)
    prefix = f"{name}: "
    if message.startswith(prefix):
        message = message[len(prefix):]
    if name == "BusyError" and message in ("", "database is locked", "BusyError"):
        message = "database is locked"
    error = cls(message)
    code = getattr(exc, "extendedresult", None)
    if code is not None:
        error.sqlite_errorcode = code
        error.sqlite_errorname = apsw.mapping_extended_result_codes.get(code) or apsw.mapping_result_codes.get(code & 0xFF)
    return error
