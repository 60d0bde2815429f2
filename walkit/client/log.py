"""walkit.client.log is the log API: one unbounded, single-writer log built from ledgers.

    log = client.open_log("orders")            # fences any previous writer
    pos = log.append(b"...")                    # walkit.Position(ledger_id, entry_id)
    log.roll(); log.truncate(before=pos); log.close()
    for record in client.read_log("orders", follow=True): record.position, record.payload

The protocol lives in the sans-IO machines walkit.core.log (the writer: open, roll, close,
truncate, retention) and walkit.core.logreader (readers); this module runs them on the client's
I/O thread and turns their outcomes into futures and iterators.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

from walkit import deletions, faults, security
from walkit.client.loop import ClientLoop, Driver, now_ms, result_within, wall_ms
from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.messages import NOOP_PAYLOAD
from walkit.core.log import LogMachine
from walkit.core.logreader import LogReader
from walkit.core.loglist import LOG_PREFIX, LogConfig, LogMetadata, LogSegment, Position, check_log_name, log_key
from walkit.errors import (ClientClosed, ConfigError, LedgerClosed, NodeExists, NoSuchKey, NoSuchLog, Timeout,
                           WalkitError)

if TYPE_CHECKING:
    from walkit.metrics import ClientMetrics

log = logging.getLogger(__name__)


class LogRecord(NamedTuple):
    """LogRecord is one record read from a log."""

    position: Position
    payload: bytes


def read_log_metadata(store, name: str) -> tuple[LogMetadata, int]:
    """read_log_metadata returns a log's metadata and version, or raises NoSuchLog."""
    try:
        value, version = store.get(log_key(name))
    except NoSuchKey:
        raise NoSuchLog(f"no log named {name!r}") from None
    return LogMetadata.from_bytes(value), version


_tokens = itertools.count(1)


class _WriterDriver(Driver):
    """_WriterDriver owns a LogMachine's futures: appends in log order, open, rolls, truncations, close."""

    def __init__(self, machine: LogMachine) -> None:
        self.machine = machine
        self.appends: deque[Future] = deque()
        self.opened: Future = Future()
        self.closed: Future = Future()
        self.requests: dict[int, Future] = {}       # roll and truncate tokens
        self.error: Exception | None = None

    def handle(self, command) -> None:
        kind = type(command)
        if kind is lev.CompleteAppends:
            appends, ledger_id = self.appends, command.ledger_id
            for entry_id in range(command.first_entry_id, command.last_entry_id + 1):
                appends.popleft().set_result(Position(ledger_id, entry_id))
        elif kind is ev.Failpoint:
            faults.failpoint(command.name)
        elif kind is lev.FailAppends:
            self.error = command.error
            while self.appends:
                self.appends.popleft().set_exception(command.error)
        elif kind is lev.RefuseAppends:
            refused = [self.appends.pop() for _ in range(command.count)]
            for future in reversed(refused):
                future.set_exception(command.error)
        elif kind is lev.LogOpened:
            self.opened.set_result(command.metadata)
        elif kind is lev.LogOpenFailed:
            self.opened.set_exception(command.error)
            self.finished = True
        elif kind is lev.RollCompleted:
            self._resolve(command.token, command.ledger_id)
        elif kind is lev.TruncateCompleted:
            self._resolve(command.token, list(command.ledger_ids))
        elif kind in (lev.RollFailed, lev.TruncateFailed):
            self._resolve(command.token, error=command.error)
        elif kind is lev.LogClosed:
            if not self.closed.done():
                self.closed.set_result(command.metadata)
            self.finished = True
        elif kind is lev.LogCloseFailed:
            if not self.closed.done():
                self.closed.set_exception(command.error)
            self.finished = self.machine.state.value == "FAILED"
        else:
            raise TypeError(f"log writer cannot handle {command!r}")

    def _resolve(self, token: int, value=None, error: Exception | None = None) -> None:
        future = self.requests.pop(token, None)
        if future is None:
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def fail(self, error: Exception) -> None:
        for future in [*self.appends, self.opened, self.closed, *self.requests.values()]:
            if not future.done():
                future.set_exception(error)
        self.appends.clear()
        self.requests.clear()
        self.finished = True


class LogContext(NamedTuple):
    """LogContext is what a LogWriter needs of its client, and no more.

    `loop` runs the writer's machine, `check_entry(size, what)` refuses a record over the
    client's entry limit before it is queued (walkit.Client.check_entry), `metrics` counts
    each append's latency and outcome (walkit.metrics.ClientMetrics.timed), and
    `check_permission(name, action)` raises PermissionDenied unless the client's principal may
    still roll or truncate the log (walkit.permissions; read afresh, so revocations hold).
    """

    loop: ClientLoop
    check_entry: Callable[[int, str], None]
    metrics: "ClientMetrics"
    check_permission: Callable[[str, str], None] = lambda name, action: None


def open_log(client, name: str, *, password: bytes = b"", config: LogConfig | None = None,
             timeout: float | None = None) -> "LogWriter":
    """open_log makes this client the log's single writer (walkit.core.log); see Client.open_log."""
    check_log_name(name)
    timeout = timeout or client.timeout
    try:
        existing = read_log_metadata(client.store, name)[0]
    except NoSuchLog:
        existing = None
    client.check_log(name, "append", existing)
    if existing.config.unbounded if existing is not None else (config is not None and config.unbounded):
        return UnboundedLogWriter.open(client, name, password=password, config=config or LogConfig(unbounded=True),
                                       timeout=timeout)
    machine = LogMachine(name, master_key=master_key(password), password_check=password_check(password),
                         digest_for=lambda kind: Digest(kind, password), config=config,
                         add_timeout_ms=int(client.add_timeout * 1000), recovery_timeout_ms=int(timeout * 1000),
                         owner=client.principal, now_ms=now_ms(), wall_ms=wall_ms(),
                         max_bytes_in_flight=client.max_bytes_in_flight)
    driver = _WriterDriver(machine)
    loop = client._loop
    loop.call(lambda: loop.attach(driver, machine.start()))
    try:
        metadata = result_within(driver.opened, timeout, f"opening log {name!r}")
    except Timeout:
        # The open goes on in the I/O thread: stop it, or it could end as a writer nobody holds,
        # its ledger open at the end of the list, where readers would wait for it for good.
        with contextlib.suppress(ClientClosed):
            loop.call(lambda: loop.step(driver, ev.CloseRequested()))
        raise
    return LogWriter(LogContext(loop, client.check_entry, client.metrics, client.check_log), driver, metadata,
                     timeout)


class LogWriter:
    """LogWriter is the single writer of a log, returned by Client.open_log.

    `append_async` may be called from many threads; records get increasing positions and are
    acknowledged in log order. A writer that another `open_log` fenced fails its appends with
    LedgerFenced.
    """

    def __init__(self, context: LogContext, driver: _WriterDriver, metadata: LogMetadata, timeout: float) -> None:
        self._context = context
        self._loop = context.loop
        self._driver = driver
        self._machine = driver.machine
        self.name = metadata.name
        self._timeout = timeout
        self._lock = threading.Lock()
        self._submitted: list[tuple[bytes, Future]] = []
        self._closed = False

    @property
    def metadata(self) -> LogMetadata:
        """metadata is the log's metadata as this writer last wrote it."""
        return self._machine.metadata

    @property
    def ledger_id(self) -> int:
        """ledger_id is the ledger appends go to now."""
        return self._machine.ledger_id

    def append_async(self, data: bytes) -> Future:
        """append_async appends a record; the Future resolves to its Position (in log order).

        A record over the client's `max_entry_bytes` raises RecordTooLarge here, at once, before
        it is queued: the writer and the log go on as if it had not been offered.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"records are bytes, not {type(data).__name__}")
        if self._closed:
            raise LedgerClosed(f"log writer of {self.name!r} is closed")
        data = bytes(data)
        self._context.check_entry(len(data), f"a record of log {self.name!r}")
        future: Future = Future()
        self._context.metrics.timed(future)
        with self._lock:
            self._submitted.append((data, future))
            first = len(self._submitted) == 1
        if first:
            self._loop.call(self._drain)
        return future

    def _drain(self) -> None:
        with self._lock:
            submitted, self._submitted = self._submitted, []
        if not submitted:
            return
        self._driver.appends.extend(f for _, f in submitted)
        self._loop.step(self._driver, ev.AppendRequested(payloads=[p for p, _ in submitted]))

    def append(self, data: bytes, timeout: float | None = None) -> Position:
        """append appends a record and blocks until it is acknowledged; it returns its Position."""
        return result_within(self.append_async(data), timeout or self._timeout, f"append to log {self.name!r}")

    def _request(self, make_event, timeout: float | None, what: str):
        future: Future = Future()
        token = next(_tokens)

        def start() -> None:
            self._drain()                   # appends made before the request go first
            self._driver.requests[token] = future
            self._loop.step(self._driver, make_event(token))
        self._loop.call(start)
        return result_within(future, timeout or self._timeout, what)

    def roll(self, timeout: float | None = None) -> int:
        """roll starts a new ledger and returns its id once appends go there.

        The previous ledger is closed in the background; a roll waits until the ledger before
        it is closed, so at most two ledgers of the log are unclosed at any time.
        """
        self._context.check_permission(self.name, "roll")
        return self._request(lambda token: lev.RollRequested(token=token), timeout, f"rolling log {self.name!r}")

    def truncate(self, before: Position, timeout: float | None = None) -> list[int]:
        """truncate deletes the whole ledgers that end before `before`; it returns their ids.

        The ledger that holds `before` and everything after it stay, so records at or after
        `before` remain readable (and possibly some before it, in the same ledger).
        """
        self._context.check_permission(self.name, "truncate")
        return self._request(lambda token: lev.TruncateRequested(token=token, before=before), timeout,
                             f"truncating log {self.name!r}")

    def close(self, timeout: float | None = None) -> LogMetadata:
        """close waits for pending appends, closes every ledger of this writer and returns the metadata."""
        if not self._closed:
            self._closed = True

            def start() -> None:
                self._drain()
                self._loop.step(self._driver, ev.CloseRequested())
            self._loop.call(start)
        return result_within(self._driver.closed, timeout or self._timeout, f"closing log {self.name!r}")

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._machine.state.value in ("WRITING", "CLOSING"):
            self.close()


class UnboundedLogWriter:
    """UnboundedLogWriter writes a log backed by one unbounded ledger (LogConfig.unbounded).

    It has LogWriter's API. Opening creates the ledger (and the log's record naming it) or takes
    the ledger over with `reopen_ledger`: a new term fences the previous writer, its recovery
    keeps every record that may have been acknowledged, and appends continue after it. Positions
    are (the ledger, entry id); ids skip the no-op entry each takeover writes. `roll` changes
    nothing (the ledger has no end), `truncate(before)` drops the fragments below `before`, and
    `close` stops this writer without closing the ledger, so the next writer can take it over.

    The log's `roll_entries`, `roll_bytes` and `roll_age_s` (LogConfig) rotate the ledger's
    fragments instead of rolling ledgers: the writer starts a new fragment, on other bookies
    where it can (walkit.core.writer). Bookies give back the space of truncated records up to
    the last fragment's start at their next garbage collection, so these bound what a
    truncation leaves on disk as they bound a list of ledgers.

    It writes through the client's ledger API (a WriteHandle), whose appends count in the
    client's metrics; a LogWriter counts its own (LogContext).
    """

    def __init__(self, client, handle, metadata: LogMetadata, timeout: float) -> None:
        self._client = client
        self._handle = handle
        self.metadata = metadata
        self.name = metadata.name
        self.ledger_id = handle.ledger_id
        self._timeout = timeout
        self._closed = False
        self._pending: set[Future] = set()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, client, name: str, *, password: bytes, config: LogConfig, timeout: float) -> "UnboundedLogWriter":
        """open takes log `name` over, creating it (one unbounded ledger) if it does not exist."""
        store = client.store
        try:
            metadata = read_log_metadata(store, name)[0]
        except NoSuchLog:
            created = LogMetadata(name=name, config=config, created_ms=wall_ms(), owner=client.principal)
            handle = client.create_ledger(config.ensemble, config.write_quorum, config.ack_quorum, password=password,
                                          digest=config.digest, custom=dict(created.ledger_custom()), timeout=timeout,
                                          unbounded=True, **_rotation(config))
            metadata = created.with_segment(LogSegment(ledger_id=handle.ledger_id, created_ms=wall_ms()))
            try:
                store.create(log_key(name), metadata.to_bytes())
                return cls(client, handle, metadata, timeout)
            except NodeExists:                   # another writer created the log first: take it over
                client.delete_ledger(handle.ledger_id)
                metadata = read_log_metadata(store, name)[0]
        if not metadata.config.unbounded or len(metadata.segments) != 1:
            raise ConfigError(f"log {name!r} is a list of ledgers, not one unbounded ledger")
        handle = client.reopen_ledger(metadata.segments[0].ledger_id, password=password, timeout=timeout,
                                      **_rotation(metadata.config))
        return cls(client, handle, metadata, timeout)

    def append_async(self, data: bytes) -> Future:
        """append_async appends a record; the Future resolves to its Position (in log order).

        A record over the client's `max_entry_bytes` raises RecordTooLarge at once (the ledger's
        WriteHandle refuses it before queueing it); the writer goes on.
        """
        if self._closed:
            raise LedgerClosed(f"log writer of {self.name!r} is closed")
        result: Future = Future()
        inner = self._handle.append_async(data)
        with self._lock:
            self._pending.add(result)

        def done(future: Future) -> None:
            with self._lock:
                self._pending.discard(result)
            error = future.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(Position(self.ledger_id, future.result()))
        inner.add_done_callback(done)
        return result

    def append(self, data: bytes, timeout: float | None = None) -> Position:
        """append appends a record and blocks until it is acknowledged; it returns its Position."""
        return result_within(self.append_async(data), timeout or self._timeout, f"append to log {self.name!r}")

    def roll(self, timeout: float | None = None) -> int:
        """roll does nothing for an unbounded log (its one ledger has no end); it returns the ledger id."""
        return self.ledger_id

    def truncate(self, before: Position, timeout: float | None = None) -> list[int]:
        """truncate drops the records before `before` with the fragments that held them; it returns []."""
        self._client.truncate_ledger(self.ledger_id, before.entry_id)
        return []

    def close(self, timeout: float | None = None) -> LogMetadata:
        """close waits for pending appends and stops this writer; the ledger stays open for the next."""
        self._closed = True
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            try:
                result_within(future, timeout or self._timeout, f"closing log {self.name!r}")
            except WalkitError:
                pass
        return self.metadata

    def __enter__(self) -> "UnboundedLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rotation(config: LogConfig) -> dict:
    """_rotation is an unbounded log's fragment limits: its roll settings (walkit.Client.create_ledger)."""
    return {"fragment_max_entries": int(config.roll_entries), "fragment_max_bytes": int(config.roll_bytes),
            "fragment_max_age_s": config.roll_age_s}


class _ReaderDriver(Driver):
    """_ReaderDriver hands a LogReader's records to the reading thread through a queue.

    Items are (ledger id, entries), None at the end, or an exception.
    """

    def __init__(self, machine: LogReader) -> None:
        self.machine = machine
        self.queue: queue.Queue = queue.Queue()
        self.caught_up: Position | None = None

    def handle(self, command) -> None:
        kind = type(command)
        if kind is lev.DeliverRecords:
            self.queue.put((command.ledger_id, command.entries))
        elif kind is ev.CompleteRead:
            self.queue.put(None)
            self.finished = True
        elif kind is ev.FailRead:
            self.queue.put(command.error)
            self.finished = True
        elif kind is lev.ReaderCaughtUp:
            self.caught_up = command.position
        elif kind is lev.ReaderRetrying:
            pass                                # retried by the reader; the iterator just waits longer
        else:
            raise TypeError(f"log reader cannot handle {command!r}")

    def fail(self, error: Exception) -> None:
        self.queue.put(error)
        self.finished = True


def read_log(client, name: str, *, start: Position | None = None, follow: bool = False, password: bytes = b"",
             poll_s: float = 1.0) -> "LogReading":
    """read_log returns an iterator of the records of a log from `start` (default: the oldest), in order.

    Without `follow` it stops at the end: the last entry of closed ledgers and the LAC of an
    unclosed one. If truncation removes records the reader has not read yet, it raises
    LogTruncated (a replica then reloads from a snapshot) rather than skip them. With `follow`
    it never stops: it tails the open ledger with long-poll LAC reads, moves on when that ledger
    is closed, and survives a writer handover (walkit.core.logreader). `close()` ends it, from
    any thread.
    """
    check_log_name(name)
    client.check_log(name, "read")
    machine = LogReader(name, password=password, start=start, follow=follow, poll_ms=max(1, int(poll_s * 1000)),
                        read_timeout_ms=client._loop.request_timeout_ms,
                        speculative_ms=client.speculative_read_ms, now_ms=now_ms())
    return LogReading(client, machine, follow, client.timeout + (poll_s if follow else 0))


class LogReading:
    """LogReading iterates over a log's records (see read_log); `close()` stops it from any thread.

    `caught_up` is the last position a following reader had delivered when it found nothing
    newer confirmed (None before that happened).
    """

    def __init__(self, client, machine: LogReader, follow: bool, stall_s: float) -> None:
        self.name = machine.name
        self._loop = loop = client._loop
        self._driver = driver = _ReaderDriver(machine)
        self._follow = follow
        self._stall_s = stall_s
        self._batch: list = []
        self._ledger_id = -1
        self._last_taken = -1                # the last entry of the batch handed out last
        self._closed = False
        loop.call(lambda: loop.attach(driver, machine.start()))

    @property
    def caught_up(self) -> Position | None:
        return self._driver.caught_up

    def __iter__(self) -> "LogReading":
        return self

    def __next__(self) -> LogRecord:
        while not self._batch:
            if self._closed:
                raise StopIteration
            if self._ledger_id >= 0:
                self._consumed()
            try:
                item = self._driver.queue.get(timeout=None if self._follow else self._stall_s)
            except queue.Empty:
                raise Timeout(f"reading log {self.name!r} stalled for {self._stall_s:g} s") from None
            if item is None:
                self._closed = True
                raise StopIteration
            if isinstance(item, BaseException):
                self._closed = True
                raise item
            self._ledger_id, entries = item
            self._last_taken = entries[-1].entry_id
            ledger = self._driver.machine.ledger
            if ledger is not None and ledger.unbounded:       # the no-ops that end takeovers are not records
                entries = [e for e in entries if e.payload != NOOP_PAYLOAD]
            self._batch = entries[::-1]
        entry = self._batch.pop()
        return LogRecord(Position(self._ledger_id, entry.entry_id), entry.payload)

    def _consumed(self) -> None:
        """_consumed tells the reader that every record handed out so far was taken (the read window)."""
        loop, driver = self._loop, self._driver
        consumed = ev.EntriesConsumed(upto=self._last_taken, ledger_id=self._ledger_id)
        try:
            loop.call(lambda: loop.step(driver, consumed))
        except WalkitError:
            pass

    def close(self) -> None:
        """close stops the reader; a thread waiting in next() gets StopIteration."""
        if self._closed:
            return
        self._closed = True
        loop, driver = self._loop, self._driver
        driver.queue.put(None)

        def stop() -> None:
            driver.machine.done = True
            driver.finished = True
            loop._drivers.discard(driver)
        try:
            loop.call(stop)
        except WalkitError:
            pass

    def __enter__(self) -> "LogReading":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed:
            self.close()


def list_logs(store) -> list[str]:
    """list_logs returns the names of all logs, sorted."""
    return store.children(LOG_PREFIX)


def delete_log(client, name: str) -> None:
    """delete_log removes a log and all its ledgers; it needs admin on the log (walkit.permissions).

    Its ledgers go with it whoever wrote them: the permission on the log covers them. A listed ledger of
    another log, or of no log and someone other than the log's owner, stays (with a warning): the log's
    list is written by its writers, and deleting the log deletes only what is the log's.
    """
    metadata, version = read_log_metadata(client.store, name)
    client.check_log(name, "delete", metadata)
    client.store.delete(log_key(name), version)
    try:
        security.forget_log(client.store, name)    # a grant on it is none on the next log of that name
    except WalkitError as exc:                     # a principal's store: the bookies that deleted it did it
        log.debug("the grants on log %r stay for the bookies (or the operator) to delete: %s", name, exc)
    deletions.delete_log_ledgers(client.store, metadata)
    from walkit.plugins.metadata.principals import is_principal
    if not is_principal(getattr(client.store, "user", None)):   # a principal's store: the bookies did it
        deletions.forget_name(client.store, metadata)             # a replicated name's snapshots, pointer, election
