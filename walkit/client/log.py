"""walkit.client.log is the log API: one unbounded, single-writer log built from ledgers.

    log = client.open_log("orders")            # fences any previous writer
    pos = log.append(b"...")                    # walkit.Position(ledger_id, entry_id)
    log.roll(); log.truncate(before=pos); log.close()
    for record in client.read_log("orders", follow=True): record.position, record.payload

Opening follows seed 000 ("Ledgers to logs"): read the ledger list, fence and recover the last
two ledgers, create a ledger, add it to the list by compare-and-swap, and serve no write before
that CAS succeeded; a conflicting CAS starts over (a bounded number of times). Rolling creates a
ledger, adds it by CAS, switches appends to it, then closes the previous one in the background.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, NamedTuple

from walkit.core.loglist import LOG_PREFIX, LogConfig, LogMetadata, LogSegment, Position, check_log_name, log_key
from walkit.errors import (
    BadVersion, LedgerFenced, LogContention, LogTruncated, NodeExists, NoSuchKey, NoSuchLedger, NoSuchLog,
    WalkitError,
)
from walkit.faults import fault_point

log = logging.getLogger("walkit.log")

#: How many times open_log starts over after losing a CAS race before it gives up.
OPEN_ATTEMPTS = 10


class LogRecord(NamedTuple):
    """LogRecord is one record read from a log."""

    position: Position
    payload: bytes


def _now_ms() -> int:
    return int(time.time() * 1000)


def read_log_metadata(store, name: str) -> tuple[LogMetadata, int]:
    """read_log_metadata returns a log's metadata and version, or raises NoSuchLog."""
    try:
        value, version = store.get(log_key(name))
    except NoSuchKey:
        raise NoSuchLog(f"no log named {name!r}") from None
    return LogMetadata.from_bytes(value), version


def open_log(client, name: str, *, password: bytes = b"", config: LogConfig | None = None,
             timeout: float | None = None) -> "LogWriter":
    """open_log makes this client the log's single writer (see the module doc); see Client.open_log."""
    check_log_name(name)
    store = client.store
    for attempt in range(OPEN_ATTEMPTS):
        try:
            metadata, version = read_log_metadata(store, name)
        except NoSuchLog:
            metadata = LogMetadata(name=name, config=config or LogConfig(), created_ms=_now_ms())
            try:
                version = store.create(log_key(name), metadata.to_bytes())
            except NodeExists:
                continue                      # created by a racing writer: read theirs
        recovered = _recover_tail(client, metadata, password, timeout)
        empty = set(metadata.ledger_ids) - set(recovered.ledger_ids)      # dropped: they hold no entry
        metadata = recovered
        cfg = metadata.config
        handle = client.create_ledger(cfg.ensemble, cfg.write_quorum, cfg.ack_quorum, password=password,
                                      digest=cfg.digest, custom={"log": name}, timeout=timeout)
        fault_point("log.open.after_create")
        proposed = metadata.with_segment(LogSegment(handle.ledger_id, created_ms=_now_ms()))
        try:
            version = store.put(log_key(name), proposed.to_bytes(), version)
        except BadVersion:
            log.info("log %s changed while opening (attempt %d); starting over", name, attempt + 1)
            _discard(client, handle)
            continue
        _delete_quietly(client, empty)         # out of the list now, so nobody reads them
        return LogWriter(client, proposed, version, handle, password, timeout)
    raise LogContention(f"could not open log {name!r}: the ledger list changed {OPEN_ATTEMPTS} times "
                        "while opening (another writer keeps opening it)")


def _recover_tail(client, metadata: LogMetadata, password: bytes, timeout) -> LogMetadata:
    """_recover_tail fences and closes the last two ledgers and records where they end.

    Two, because a writer that was rolling may still write to the second-to-last ledger while
    the last one is already in the list (seed 000). Recovered ledgers that hold no entry are
    dropped from the list.
    """
    for segment in metadata.segments[-2:]:
        if segment.is_closed:
            continue
        try:
            handle = client.open_ledger(segment.ledger_id, password=password, recover=True, timeout=timeout)
        except NoSuchLedger:
            metadata = metadata.without({segment.ledger_id})
            continue
        last = handle.last_add_confirmed
        size = sum(len(e.payload) for e in handle.read()) if last >= 0 else 0
        closed = LogSegment(segment.ledger_id, created_ms=segment.created_ms, last_entry_id=last,
                            entries=last + 1, size=size, closed_ms=_now_ms())
        metadata = metadata.updated(closed)
    return metadata.without({s.ledger_id for s in metadata.segments if s.entries == 0})


def _discard(client, handle) -> None:
    try:
        handle.close()
        client.delete_ledger(handle.ledger_id)
    except WalkitError as exc:
        log.warning("could not discard unused ledger %d: %s", handle.ledger_id, exc)


def _delete_quietly(client, ledger_ids: set[int]) -> None:
    for ledger_id in ledger_ids:
        try:
            client.delete_ledger(ledger_id)
        except WalkitError:
            pass


class LogWriter:
    """LogWriter is the single writer of a log, returned by Client.open_log.

    `append_async` may be called from many threads; records get increasing positions. A writer
    that another `open_log` fenced fails its appends with LedgerFenced.
    """

    def __init__(self, client, metadata: LogMetadata, version: int, handle, password: bytes, timeout) -> None:
        self._client = client
        self.name = metadata.name
        self._metadata = metadata
        self._version = version
        self._handle = handle
        self._password = password
        self._timeout = timeout or client.timeout
        self._lock = threading.RLock()          # appends and rolls
        self._meta_lock = threading.Lock()      # CAS of this log's metadata
        self._entries = 0
        self._bytes = 0
        self._opened_ms = _now_ms()
        self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"walkit-log-{self.name}")
        self._closing: list[Future] = []
        self._closed = False

    @property
    def metadata(self) -> LogMetadata:
        """metadata is the log's metadata as this writer last wrote it."""
        return self._metadata

    @property
    def ledger_id(self) -> int:
        """ledger_id is the ledger appends go to now."""
        return self._handle.ledger_id

    def append_async(self, data: bytes) -> Future:
        """append_async appends a record; the Future resolves to its Position."""
        with self._lock:
            if self._closed:
                raise WalkitError(f"log writer of {self.name!r} is closed")
            if self._should_roll(len(data)):
                self._roll_locked()
            handle = self._handle
            self._entries += 1
            self._bytes += len(data)
            inner = handle.append_async(data)
        outer: Future = Future()
        ledger_id = handle.ledger_id

        def done(future: Future) -> None:
            error = future.exception()
            if error is None:
                outer.set_result(Position(ledger_id, future.result()))
            else:
                outer.set_exception(error)
        inner.add_done_callback(done)
        return outer

    def append(self, data: bytes, timeout: float | None = None) -> Position:
        """append appends a record and blocks until it is acknowledged; it returns its Position."""
        from walkit.client.api import _wait
        return _wait(self.append_async(data), timeout or self._timeout, f"append to log {self.name!r}")

    # -- rolling ------------------------------------------------------------------------------
    def _should_roll(self, size: int) -> bool:
        cfg = self._metadata.config
        if self._entries == 0:
            return False
        return bool((cfg.roll_entries and self._entries >= cfg.roll_entries)
                    or (cfg.roll_bytes and self._bytes + size > cfg.roll_bytes)
                    or (cfg.roll_age_s and _now_ms() - self._opened_ms >= cfg.roll_age_s * 1000))

    def roll(self) -> int:
        """roll starts a new ledger now and returns its id; the previous one is closed in the background."""
        with self._lock:
            self._roll_locked()
            return self._handle.ledger_id

    def _roll_locked(self) -> None:
        """_roll_locked does seed 000's "Rolling ledgers": create, CAS the list, then close the old one."""
        cfg = self._metadata.config
        new = self._client.create_ledger(cfg.ensemble, cfg.write_quorum, cfg.ack_quorum, password=self._password,
                                         digest=cfg.digest, custom={"log": self.name}, timeout=self._timeout)
        fault_point("log.roll.after_create")
        try:
            self._update(lambda md: md.with_segment(LogSegment(new.ledger_id, created_ms=_now_ms())))
        except WalkitError:
            _discard(self._client, new)
            raise
        fault_point("log.roll.after_cas")
        old, entries, size = self._handle, self._entries, self._bytes
        self._handle, self._entries, self._bytes, self._opened_ms = new, 0, 0, _now_ms()
        self._closing.append(self._closer.submit(self._close_segment, old, entries, size))
        self._apply_retention()

    def _close_segment(self, handle, entries: int, size: int) -> None:
        """_close_segment closes a rolled-over ledger and records where it ends."""
        try:
            closed = handle.close(self._timeout)
        except WalkitError as exc:
            log.warning("log %s: closing ledger %d failed: %s", self.name, handle.ledger_id, exc)
            return
        last = closed.last_entry_id
        segment = LogSegment(handle.ledger_id, created_ms=closed.created_ms, last_entry_id=last, entries=last + 1,
                             size=size if last + 1 == entries else None, closed_ms=_now_ms())
        try:
            self._update(lambda md: md.updated(segment) if md.segment(segment.ledger_id) else md)
            self._apply_retention()          # the ledger's size is known now
        except WalkitError as exc:
            log.warning("log %s: recording the end of ledger %d failed: %s", self.name, handle.ledger_id, exc)

    def _update(self, change) -> LogMetadata:
        """_update CASes `change(metadata)`; a conflict means another writer took the log over."""
        with self._meta_lock:
            proposed = change(self._metadata)
            try:
                self._version = self._client.store.put(log_key(self.name), proposed.to_bytes(), self._version)
            except BadVersion:
                raise LedgerFenced(f"log {self.name!r} was opened by another writer") from None
            self._metadata = proposed
            return proposed

    # -- truncation and retention -----------------------------------------------------------
    def truncate(self, before: Position) -> list[int]:
        """truncate deletes the whole ledgers that end before `before`; it returns their ids.

        The ledger that holds `before` and everything after it stay, so records at or after
        `before` remain readable (and possibly some before it, in the same ledger).
        """
        doomed = {s.ledger_id for s in self._metadata.before(before)}
        return self._remove(doomed)

    def _apply_retention(self) -> None:
        doomed = {s.ledger_id for s in self._metadata.expired(_now_ms())}
        if doomed:
            self._remove(doomed)

    def _remove(self, ledger_ids: set[int]) -> list[int]:
        if not ledger_ids:
            return []
        self._update(lambda md: md.without(ledger_ids))
        _delete_quietly(self._client, ledger_ids)
        return sorted(ledger_ids)

    def close(self, timeout: float | None = None) -> LogMetadata:
        """close closes the current ledger and waits for rolled ledgers to close; it returns the metadata."""
        with self._lock:
            if self._closed:
                return self._metadata
            self._closed = True
            handle, entries, size = self._handle, self._entries, self._bytes
        for pending in self._closing:
            pending.result(timeout or self._timeout)
        self._close_segment(handle, entries, size)
        self._closer.shutdown(wait=True)
        return self._metadata

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(client, name: str, *, start: Position | None = None, follow: bool = False, password: bytes = b"",
             poll_s: float = 1.0) -> Iterator[LogRecord]:
    """read_log yields the records of a log from `start` (default: the oldest), in order.

    Without `follow` it stops at the end: the last entry of closed ledgers and the LAC of the
    open one. If truncation removes records the reader has not read yet, it raises LogTruncated
    (a replica then reloads from a snapshot) rather than skip them. With `follow` it never stops: it tails the open ledger with long-poll LAC reads,
    moves on when the next ledger appears, and survives a writer handover (the new writer closes
    the old ledger at its true end, which the reader then reads up to).
    """
    check_log_name(name)
    next_position = start
    expected: int | None = None          # the ledger that must come next, as the metadata last said
    changed = threading.Event()
    watch = client.store.watch(log_key(name), lambda key: changed.set()) if follow else None
    try:
        while True:
            metadata, _ = read_log_metadata(client.store, name)
            changed.clear()
            ids = metadata.ledger_ids
            gone = expected if expected is not None else (
                next_position.ledger_id if next_position is not None and next_position.entry_id > 0 else None)
            if gone is not None and gone not in ids and (not ids or ids[0] > gone):
                raise LogTruncated(f"log {name!r} was truncated past the reader's position "
                                   f"{next_position}: ledger {gone} is gone")
            segments = [s for s in metadata.segments if next_position is None or s.ledger_id >= next_position.ledger_id]
            if not segments:
                if not follow:
                    return
                changed.wait(poll_s)
                continue
            segment = segments[0]
            first = next_position.entry_id if next_position and next_position.ledger_id == segment.ledger_id else 0
            try:
                for record in _read_segment(client, segment, first, follow, password, poll_s):
                    next_position = Position(record.position.ledger_id, record.position.entry_id + 1)
                    yield record
            except NoSuchLedger:
                raise LogTruncated(f"log {name!r}: ledger {segment.ledger_id} was deleted while being read") from None
            next_position = Position(segment.ledger_id + 1, 0)
            expected = next((i for i in ids if i > segment.ledger_id), None)
            if not follow and segment is metadata.segments[-1]:
                return
    finally:
        if watch is not None:
            watch.cancel()


def _read_segment(client, segment: LogSegment, first: int, follow: bool, password: bytes,
                  poll_s: float) -> Iterator[LogRecord]:
    """_read_segment yields one ledger's records from `first`; when following, until it is closed."""
    handle = client.open_ledger(segment.ledger_id, password=password)
    ledger_id = segment.ledger_id
    next_entry = first
    while True:
        lac = handle.last_add_confirmed
        if lac >= next_entry:
            for entry in handle.read(next_entry, lac):
                yield LogRecord(Position(ledger_id, entry.entry_id), entry.payload)
            next_entry = lac + 1
        if handle.is_closed or not follow:
            return
        handle.wait_for_lac(above=next_entry - 1, timeout=poll_s)
        if handle.is_closed and handle.last_add_confirmed < next_entry:
            return


def list_logs(store) -> list[str]:
    """list_logs returns the names of all logs, sorted."""
    return store.children(LOG_PREFIX)


def delete_log(client, name: str) -> None:
    """delete_log removes a log and all its ledgers."""
    metadata, version = read_log_metadata(client.store, name)
    client.store.delete(log_key(name), version)
    _delete_quietly(client, set(metadata.ledger_ids))
