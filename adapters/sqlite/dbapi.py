"""walkit.adapters.sqlite.dbapi holds the module-level DB-API 2.0 pieces that sqlite3 programs use.

Row (sqlite3.Row's behaviour), the type constructors, adapters (Python value -> SQLite value)
and converters (declared type or column name -> Python value) with sqlite3's defaults for
date and datetime, so `register_adapter` / `register_converter` and `detect_types` work.
"""

from __future__ import annotations

import collections.abc
import datetime
import re
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
_BASE_TYPES = (int, float, str, bytearray)
#: True once an adapter was registered for int, float, str or bytearray: then every value is adapted (sqlite3's rule).
_base_type_adapted = False
_NO_ALTERNATIVE = object()


def register_adapter(kind: type, adapter: Callable[[Any], Any], /) -> None:
    """register_adapter makes values of type `kind` bind as `adapter(value)` (sqlite3.register_adapter).

    As in sqlite3, an adapter for int, float, str or bytearray makes every value go through adapt().
    """
    global _base_type_adapted
    if kind in _BASE_TYPES:
        _base_type_adapted = True
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




def adapt(obj: Any, proto: Any = sqlite3.PrepareProtocol, alt: Any = _NO_ALTERNATIVE, /) -> Any:
    """adapt is `obj` adapted for `proto` (sqlite3.adapt): a registered adapter, `proto.__adapt__`, `obj.__conform__`.

    Without any, it is `alt` if given, else ProgrammingError "can't adapt".
    """
    adapter = adapters.get((type(obj), proto))
    if adapter is not None:
        return adapter(obj)
    for method, argument in ((getattr(proto, "__adapt__", None), obj), (getattr(obj, "__conform__", None), proto)):
        if method is not None:
            try:
                adapted = method(argument)
            except TypeError:                      # sqlite3 goes on to the next way
                adapted = None
            if adapted is not None:
                return adapted
    if alt is not _NO_ALTERNATIVE:
        return alt
    raise sqlite3.ProgrammingError("can't adapt")


def _bindable(value: Any, index: int) -> Any:
    """_bindable is one parameter as SQLite binds it, adapted as sqlite3 adapts it (`index` counts from 1)."""
    if _base_type_adapted or type(value) not in _BASE_TYPES:
        value = adapt(value, sqlite3.PrepareProtocol, value)
    if value is None or isinstance(value, (int, float, str)):
        if isinstance(value, int) and not -2**63 <= value < 2**63:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    try:
        return memoryview(value)                   # any other object with the buffer protocol is a blob
    except TypeError:
        raise sqlite3.ProgrammingError(f"Error binding parameter {index}: type {type(value).__name__!r} is not "
                                       f"supported") from None


def bind(names: tuple, parameters: Any) -> tuple:
    """bind is the values for a statement's parameters (`names`: each one's name, None if positional), in order.

    sqlite3's rules: a tuple, a list or any other sequence that is not a dict is indexed and
    must hold one value per parameter; a dict (or a subclass) is looked up by name; anything
    else is refused.
    """
    if _is_sequence(parameters):
        supplied = len(parameters)
        if supplied != len(names):
            raise sqlite3.ProgrammingError(f"Incorrect number of bindings supplied. The current statement uses "
                                           f"{len(names)}, and there are {supplied} supplied.")
        return tuple(_bindable(parameters[i], i + 1) for i in range(supplied))
    if isinstance(parameters, dict):
        values = []
        for i, name in enumerate(names, 1):
            if name is None:
                raise sqlite3.ProgrammingError(f"Binding {i} has no name, but you supplied a dictionary (which has "
                                               f"only names).")
            try:
                value = parameters[name]
            except LookupError:
                raise sqlite3.ProgrammingError(f"You did not supply a value for binding parameter :{name}.") from None
            values.append(_bindable(value, i))
        return tuple(values)
    raise sqlite3.ProgrammingError("parameters are of unsupported type")


def _is_sequence(parameters: Any) -> bool:
    """_is_sequence is CPython's PySequence_Check: the type defines __getitem__ and is not a dict."""
    return not isinstance(parameters, dict) and hasattr(type(parameters), "__getitem__")


def parse_uri(uri: str) -> tuple[str, str]:
    """parse_uri is the file path and the access mode ("ro", "rw", "rwc", "memory") of a `file:` URI.

    The path and the parameters are percent-decoded; `file://localhost/p` and `file:///p` name
    /p; an unknown mode is OperationalError "no such access mode: X", as in sqlite3.
    """
    from urllib.parse import parse_qsl, unquote
    if not uri.startswith("file:"):
        return uri, "rwc"
    rest = uri[len("file:"):].split("#", 1)[0]
    path, _, query = rest.partition("?")
    if path.startswith("//"):
        authority, slash, path = path[2:].partition("/")
        if authority not in ("", "localhost"):
            raise sqlite3.OperationalError(f"invalid uri authority: {authority}")
        path = slash + path
    mode = "rwc"
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "mode":
            if value not in ("ro", "rw", "rwc", "memory"):
                raise sqlite3.OperationalError(f"no such access mode: {value}")
            mode = value
    return unquote(path), mode


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


collections.abc.Sequence.register(Row)     # as sqlite3 registers its Row


def column_name(name: str, detect_types: int) -> str:
    """column_name is a result column's name in `description`: under PARSE_COLNAMES, without its ' [type]' (sqlite3)."""
    if detect_types & PARSE_COLNAMES and "[" in name:
        name = name[:name.index("[")]
        return name[:-1] if name.endswith(" ") else name
    return name


def converter_for(name: str | None, decltype: str | None, detect_types: int) -> Callable[[bytes], Any] | None:
    """converter_for is the converter of a result column, found as sqlite3 finds it.

    PARSE_COLNAMES first: the text between the column name's first '[' and the next ']'; then
    PARSE_DECLTYPES: the declared type up to its first blank or '('; both case-insensitive.
    """
    if detect_types & PARSE_COLNAMES and name and "[" in name:
        start = name.index("[") + 1
        end = name.find("]", start)
        if end >= 0:
            found = converters.get(name[start:end].upper())
            if found is not None:
                return found
    if detect_types & PARSE_DECLTYPES and decltype:
        return converters.get(re.split(r"[ (]", decltype, maxsplit=1)[0].upper())
    return None


def enable_shared_cache(enable: bool) -> None:
    """enable_shared_cache is refused: shared-cache mode is a setting of SQLite's C library, not of a database."""
    raise sqlite3.NotSupportedError("enable_shared_cache() sets SQLite's C library (deprecated in sqlite3); "
                                    "walkit.adapters.sqlite connections do not share a cache")


def complete_statement(statement: str) -> bool:
    """complete_statement is True if `statement` holds complete SQL statements (ends with a semicolon)."""
    import apsw
    return apsw.complete(statement)
