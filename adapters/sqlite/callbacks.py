"""walkit.adapters.sqlite.callbacks wraps application callbacks so that they fail as they do under sqlite3.

apsw lets a callback's own exception out of the statement that called it; sqlite3 turns it into
an OperationalError with a fixed message ("user-defined function raised exception") and, when
`enable_callback_tracebacks(True)` was called, hands the original to `sys.unraisablehook`. The
wrappers here do the same: a failing callback raises `CallbackFailed`, which
walkit.adapters.sqlite.errors.translate turns into sqlite3's error. An aggregate is made on its
first row, as sqlite3 makes it, so an aggregate over no rows is NULL without calling finalize().
"""

from __future__ import annotations

import sys
import traceback
import types
from typing import Callable

_tracebacks = False


class CallbackFailed(Exception):
    """CallbackFailed carries the message sqlite3 gives when an application callback raised."""


def enable_callback_tracebacks(flag: bool, /) -> None:
    """enable_callback_tracebacks makes failing callbacks report their exception, as sqlite3's does."""
    global _tracebacks
    _tracebacks = bool(flag)


def report(exc: BaseException, callable_) -> None:
    """report hands a callback's exception to sys.unraisablehook when tracebacks are enabled, as sqlite3 does."""
    if not _tracebacks:
        return
    if sys.unraisablehook is sys.__unraisablehook__:
        print(f"Exception ignored in: {callable_!r}", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        return
    sys.unraisablehook(types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__,
                                             err_msg=None, object=callable_))


def scalar(func):
    """scalar wraps a create_function callable: its exception becomes 'user-defined function raised exception'."""
    def call(*args):
        try:
            return func(*args)
        except Exception as exc:  # noqa: BLE001 - sqlite3 reports every exception the same way
            report(exc, func)
            raise CallbackFailed("user-defined function raised exception") from None
    return call


def _method(instance, name: str):
    try:
        return getattr(instance, name)
    except AttributeError:
        raise CallbackFailed(f"user-defined aggregate's '{name}' method not defined") from None


def _invoke(instance, name: str, *args):
    method = _method(instance, name)
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001
        report(exc, method)
        raise CallbackFailed(f"user-defined aggregate's '{name}' method raised error") from None


class _Aggregate:
    """_Aggregate is one evaluation of a sqlite3 aggregate or window class, made at its first step."""

    def __init__(self, aggregate_class) -> None:
        self.aggregate_class = aggregate_class
        self.instance = None

    def _made(self):
        if self.instance is None:
            try:
                self.instance = self.aggregate_class()
            except Exception as exc:  # noqa: BLE001
                report(exc, self.aggregate_class)
                raise CallbackFailed("user-defined aggregate's '__init__' method raised error") from None
        return self.instance

    def step(self, *args) -> None:
        _invoke(self._made(), "step", *args)

    def inverse(self, *args) -> None:
        _invoke(self._made(), "inverse", *args)

    def value(self):
        return _invoke(self._made(), "value")

    def final(self):
        if self.instance is None:                  # no row: sqlite3 returns NULL without finalize()
            return None
        return _invoke(self.instance, "finalize")


def aggregate(aggregate_class):
    """aggregate is the apsw aggregate factory of a sqlite3 aggregate class (step(), finalize())."""
    def factory():
        made = _Aggregate(aggregate_class)
        return None, lambda _, *args: made.step(*args), lambda _: made.final()
    return factory


def window(aggregate_class):
    """window is the apsw window factory of a sqlite3 window class (step(), value(), inverse(), finalize())."""
    return lambda: _Aggregate(aggregate_class)


def authorizer(func, paused: Callable[[], bool]):
    """authorizer wraps a set_authorizer callable: an exception or a result that is not an int denies, as in sqlite3.

    While `paused()` (the connection builds a changeset) it allows everything unasked.
    """
    def call(action, arg1, arg2, dbname, source):
        if paused():
            return 0                                # SQLITE_OK
        try:
            result = func(action, arg1, arg2, dbname, source)
        except Exception as exc:  # noqa: BLE001
            report(exc, func)
            return 1                                # SQLITE_DENY
        return result if isinstance(result, int) and result in (0, 1, 2) else 1
    return call


def progress(func, paused: Callable[[], bool]):
    """progress wraps a set_progress_handler callable: a true result or an exception interrupts the statement.

    While `paused()` it is not called.
    """
    def call():
        if paused():
            return False
        try:
            return bool(func())
        except Exception as exc:  # noqa: BLE001
            report(exc, func)
            return True
    return call


def trace(func):
    """trace wraps a set_trace_callback callable: its exceptions are reported, never raised, as in sqlite3."""
    def call(sql: str) -> None:
        try:
            func(sql)
        except Exception as exc:  # noqa: BLE001
            report(exc, func)
    return call
