"""walkit.adapters.sqlite.dbapi holds the module-level DB-API 2.0 pieces that sqlite3 programs use.

Row (sqlite3.Row's behaviour), the type constructors, adapters (Python value -> SQLite value)
and converters (declared type or column name -> Python value) with sqlite3's defaults for
date and datetime, so `register_adapter` / `register_converter` and `detect_types` work.
"""

from __future__ import annotations

import datetime
import sqlite3
import time
from typing import Any, Callable

apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"
PARSE_DECLTYPES = sqlite3.PARSE_DECLTYPES
PARSE_COLNAMES = sqlite3.PARSE_COLNAMES

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = memoryview


def DateFromTicks(ticks: float) -> datetime.date:  # noqa: N802 - DB-API 2.0 name
    """DateFromTicks is the local date of a Unix time (DB-API 2.0)."""
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:  # noqa: N802
    """TimeFromTicks is the local time of day of a Unix time (DB-API 2.0)."""
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:  # noqa: N802
    """TimestampFromTicks is the local date and time of a Unix time (DB-API 2.0)."""
    return Timestamp(*time.localtime(ticks)[:6])


#: (type, sqlite3.PrepareProtocol) -> adapter, as sqlite3.adapters.
adapters: dict[tuple[type, Any], Callable[[Any], Any]] = {}
#: Upper-case type name -> converter of bytes, as sqlite3.converters.
converters: dict[str, Callable[[bytes], Any]] = {}
_NATIVE = (int, float, str, bytes, type(None))


def register_adapter(kind: type, adapter: Callable[[Any], Any]) -> None:
    """register_adapter makes values of type `kind` bind as `adapter(value)` (sqlite3.register_adapter)."""
    adapters[(kind, sqlite3.PrepareProtocol)] = adapter


def register_converter(name: str, converter: Callable[[bytes], Any]) -> None:
    """register_converter converts columns of type `name` (case-insensitive) with `converter(bytes)`."""
    converters[name.upper()] = converter


def _adapt_date(value: datetime.date) -> str:
    return value.isoformat()


def _adapt_datetime(value: datetime.datetime) -> str:
    return value.isoformat(" ")


def _convert_date(value: bytes) -> datetime.date:
    return datetime.date(*map(int, value.split(b"-")))


def _convert_timestamp(value: bytes) -> datetime.datetime:
    datepart, timepart = value.split(b" ")
    year, month, day = map(int, datepart.split(b"-"))
    timepart_full = timepart.split(b".")
    hours, minutes, seconds = map(int, timepart_full[0].split(b":"))
    micro = int(f"{timepart_full[1].decode():0<6.6}") if len(timepart_full) == 2 else 0
    return datetime.datetime(year, month, day, hours, minutes, seconds, micro)


register_adapter(datetime.date, _adapt_date)
register_adapter(datetime.datetime, _adapt_datetime)
register_converter("date", _convert_date)
register_converter("timestamp", _convert_timestamp)


def adapt(value: Any) -> Any:
    """adapt turns one parameter into a value SQLite binds (int, float, str, bytes-like, None).

    Registered adapters come first, then objects with `__conform__`; anything else unbindable
    is a ProgrammingError, as in sqlite3.
    """
    if type(value) in _NATIVE:
        return value
    adapter = adapters.get((type(value), sqlite3.PrepareProtocol))
    if adapter is not None:
        return adapter(value)
    conform = getattr(value, "__conform__", None)
    if conform is not None:
        converted = conform(sqlite3.PrepareProtocol)
        if converted is not None:
            return converted
    if isinstance(value, (int, float, str, bytes, bytearray, memoryview)):
        return value
    raise sqlite3.ProgrammingError(f"Error binding parameter: type {type(value).__name__!r} is not supported")


def adapt_parameters(parameters: Any) -> Any:
    """adapt_parameters adapts a sequence or a mapping of parameters (named style)."""
    if parameters is None:
        return ()
    if isinstance(parameters, dict) or (hasattr(parameters, "keys") and hasattr(parameters, "__getitem__")):
        return {key: adapt(parameters[key]) for key in parameters.keys()}
    if isinstance(parameters, (str, bytes)):
        raise sqlite3.ProgrammingError("parameters are of unsupported type")
    try:
        return tuple(adapt(value) for value in parameters)
    except TypeError:
        raise sqlite3.ProgrammingError("parameters are of unsupported type") from None


def as_bytes(value: Any) -> bytes:
    """as_bytes is a column value as the bytes sqlite3 hands converters."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


class Row:
    """Row is a result row readable by index and by case-insensitive column name (sqlite3.Row)."""

    __slots__ = ("_names", "_values")

    def __init__(self, cursor, values: tuple) -> None:
        self._names = tuple(column[0] for column in cursor.description or ())
        self._values = tuple(values)

    def keys(self) -> list[str]:
        """keys lists the column names."""
        return list(self._names)

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self._values[key]
        lowered = key.lower()
        for name, value in zip(self._names, self._values):
            if name.lower() == lowered:
                return value
        raise IndexError("No item with that key")

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return self._names == other._names and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._names) ^ hash(self._values)

    def __repr__(self) -> str:
        return f"<walkit.adapters.sqlite.Row object at {id(self):#x}>"


def complete_statement(statement: str) -> bool:
    """complete_statement is True if `statement` holds complete SQL statements (ends with a semicolon)."""
    import apsw
    return apsw.complete(statement)
