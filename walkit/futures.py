"""walkit.futures: LightFuture, a concurrent.futures.Future that costs less when nobody blocks on it.

    future = LightFuture()
    future.add_done_callback(print)     # no Condition is made for this
    future.set_result(7)                # nor for this
    future.result()                     # 7 (a done future is read without waiting)

Appends and replicated records make one Future each, and most of them are completed by a
callback, never waited on. The standard Future builds a threading.Condition (a Python object
around an RLock) and a list of waiters for every instance and takes the Condition in every
method; here each future holds one plain lock, and the Condition (around that same lock) and
the waiters list are made only when a second thread has to wait (`exception()` before the
future is done, `concurrent.futures.wait`, `as_completed`, a second `result()`): the first thread
blocked in `result()` sleeps on a plain lock that completion releases, which costs a third of a
Condition's wait (walkit.replicate's `submit` is one such wait per record). Fewer objects per future is less
work for the garbage collector, which otherwise takes a sixth of a client's CPU per append. A
LightFuture is a `concurrent.futures.Future` in every respect: isinstance, the module's
wait/as_completed, cancel, repr.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, TimeoutError
from concurrent.futures._base import (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, LOGGER, PENDING, RUNNING,
                                      InvalidStateError)

_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


class LightFuture(Future):
    """LightFuture is a concurrent.futures.Future that makes its Condition only when a thread waits (module doc)."""

    _gate = None            # the lock the first thread to block in result() sleeps on (made then)

    def __init__(self) -> None:  # noqa: D107 - Future's own __init__ builds the Condition this class avoids
        self._lock = threading.Lock()
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waited = False                # _condition and _waiters exist (a thread waits, or did)
        self._done_callbacks = []

    def __getattr__(self, name: str):
        # Future's waiting methods (and the module's wait/as_completed) use self._condition and
        # self._waiters: both are made on first use of either, once, the Condition around the
        # future's own lock, so the fast paths below and Future's methods exclude each other.
        # Until then neither exists and the instance dict is never materialised.
        if name not in ("_condition", "_waiters"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with self._lock:
            made = self.__dict__
            if "_condition" not in made:
                made["_waiters"] = []
                made["_condition"] = threading.Condition(self._lock)
                self._waited = True
        return made[name]

    def done(self) -> bool:
        return self._state in _DONE

    def running(self) -> bool:
        return self._state == RUNNING

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def add_done_callback(self, fn) -> None:
        with self._lock:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as Future does: a failing callback is logged, not raised
            LOGGER.exception("exception calling callback for %r", self)

    def result(self, timeout: float | None = None):
        if self._state != FINISHED and self._wait_alone(timeout) is False:
            raise TimeoutError()
        if self._state == FINISHED:
            if self._exception is not None:
                try:
                    raise self._exception
                finally:
                    self = None                 # as Future does: no cycle through the traceback
            return self._result
        return super().result(timeout)

    def _wait_alone(self, timeout: float | None) -> bool | None:
        """_wait_alone blocks the first thread that waits on a pending future on a plain lock that
        completion releases, which costs a fraction of Future's Condition. It returns None if it did
        not wait (the future is done, or another thread waits: Future's own wait then serves), else
        whether the future is done.
        """
        with self._lock:
            if self._state in _DONE:
                return None
            if self._gate is not None or self._waited:
                return None
            gate = threading.Lock()
            gate.acquire()
            self._gate = gate
        gate.acquire(True, -1 if timeout is None else max(0.0, timeout))
        return self._state in _DONE

    def _open_gate(self) -> None:
        """_open_gate wakes the thread in _wait_alone (called once, under the lock, when the future is done)."""
        gate = self._gate
        if gate is not None and gate.locked():
            gate.release()

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            with self._lock:
                self._open_gate()
        return cancelled

    def exception(self, timeout: float | None = None):
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def set_result(self, result) -> None:
        self._finish(result, None)

    def set_exception(self, exception) -> None:
        self._finish(None, exception)

    def _finish(self, result, exception) -> None:
        with self._lock:
            state = self._state
            if state not in _DONE:
                self._result = result
                self._exception = exception
                self._state = FINISHED
                self._open_gate()
                if self._waited:                # someone waits, or did: wake them as Future does
                    for waiter in self._waiters:
                        if exception is None:
                            waiter.add_result(self)
                        else:
                            waiter.add_exception(self)
                    self._condition.notify_all()
        if state in _DONE:                      # raised outside the lock: repr takes it
            raise InvalidStateError(f"{state}: {self!r}")
        self._invoke_callbacks()
