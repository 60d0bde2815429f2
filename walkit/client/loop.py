"""walkit.client.loop is the client's I/O thread: it owns the transport and every core machine.

Other threads never touch a machine; they hand work to the loop with `call(fn)`. Each round the
loop waits on the transport, runs the queued calls, turns bookie responses into events for the
machine that sent the request, passes time (Ticked) to every machine, and executes the
machines' commands: requests are queued per bookie and leave as ONE frame per bookie per round,
so thousands of pipelined adds become a handful of messages. Metadata operations run on a small
thread pool and come back as events.

Requests that get no answer within `request_timeout_ms`, or whose bookie is down, are answered
by the loop itself with status UNREACHABLE, so every machine sees every request end.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from walkit.core import events as ev
from walkit.core.messages import AddRequest, ErrorResponse, ReadLacRequest, ReadRequest, Status, WriteLacRequest
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import BadVersion, ClientClosed, NoSuchKey, NoSuchLedger, WalkitError
from walkit.registry import BookieRegistry
from walkit.wire.codec import DEFAULT_MAX_REQUESTS, WireError, decode_responses, encode_requests

log = logging.getLogger("walkit.client")


def now_ms() -> int:
    """now_ms is the monotonic clock the client's machines run on, in milliseconds."""
    return int(time.monotonic() * 1000)


class Driver:
    """Driver pairs a core machine with the shell-side effects of its completion commands.

    Subclasses implement `handle(command)` for the commands the loop does not execute itself
    (completing futures, delivering entries) and `fail(error)` for client shutdown.
    """

    machine: object
    finished = False

    def handle(self, command) -> None:
        raise NotImplementedError

    def fail(self, error: Exception) -> None:
        """fail ends the driver's work with `error` (the client is closing)."""
        self.finished = True


class ClientLoop:
    """ClientLoop runs the I/O thread of one Client."""

    def __init__(self, transport, store, *, request_timeout_ms: int = 10000, tick_ms: int = 10) -> None:
        self.transport = transport
        self.store = store
        self.registry = BookieRegistry(store)
        self.request_timeout_ms = request_timeout_ms
        self.tick_ms = tick_ms
        self._inbox: deque[Callable[[], None]] = deque()
        self._drivers: set[Driver] = set()
        self._inflight: dict[int, tuple[str, Driver, object]] = {}
        self._by_bookie: dict[str, set[int]] = {}
        self._deadlines: deque[tuple[int, int]] = deque()      # (deadline ms, txn), in send order
        self._outgoing: dict[str, list] = {}
        self._txns = itertools.count(1)
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="walkit-meta")
        self._thread = threading.Thread(target=self._run, name="walkit-io", daemon=True)
        self._thread.start()

    # -- API for other threads -------------------------------------------------------------
    def call(self, fn: Callable[[], None]) -> None:
        """call runs `fn()` on the I/O thread, soon and in call order."""
        if self._stopping:
            raise ClientClosed("the client is closed")
        self._inbox.append(fn)
        self.transport.wake()

    def stop(self) -> None:
        """stop fails every unfinished driver with ClientClosed and ends the thread."""
        if self._stopping:
            return
        self._stopping = True
        self.transport.wake()
        self._thread.join(timeout=10)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    # -- API for the I/O thread ------------------------------------------------------------
    def attach(self, driver: Driver, commands: list) -> None:
        """attach starts tracking `driver` and executes its machine's first commands."""
        self._drivers.add(driver)
        self.execute(driver, commands)

    def step(self, driver: Driver, event) -> None:
        """step feeds `event` to the driver's machine and executes the resulting commands."""
        self.execute(driver, driver.machine.step(event))

    def execute(self, driver: Driver, commands: list) -> None:
        """execute carries out machine commands; completion commands go to the driver."""
        for command in commands:
            kind = type(command)
            if kind is ev.SendAdds:
                self._queue(command.bookie, driver, AddRequest(
                    txn=next(self._txns), ledger_id=command.ledger_id, master_key=command.master_key,
                    entries=command.entries, recovery=command.recovery))
            elif kind is ev.SendRead:
                self._queue(command.bookie, driver, ReadRequest(
                    txn=next(self._txns), ledger_id=command.ledger_id, entry_ids=command.entry_ids,
                    fence=command.fence, master_key=command.master_key))
            elif kind is ev.SendReadLac:
                self._queue(command.bookie, driver, ReadLacRequest(
                    txn=next(self._txns), ledger_id=command.ledger_id, fence=command.fence,
                    master_key=command.master_key, previous_lac=command.previous_lac,
                    timeout_ms=command.timeout_ms))
            elif kind is ev.SendWriteLac:
                self._queue(command.bookie, driver, WriteLacRequest(
                    txn=next(self._txns), ledger_id=command.ledger_id, master_key=command.master_key,
                    lac=command.lac))
            elif kind is ev.WriteMetadata:
                self._executor.submit(self._write_metadata, driver, command)
            elif kind is ev.ChooseBookies:
                self._executor.submit(self._choose_bookies, driver, command)
            else:
                driver.handle(command)
        if driver.finished:
            self._drivers.discard(driver)

    # -- requests --------------------------------------------------------------------------
    def _queue(self, bookie: str, driver: Driver, request) -> None:
        txn = request.txn
        self._inflight[txn] = (bookie, driver, request)
        self._by_bookie.setdefault(bookie, set()).add(txn)
        timeout = self.request_timeout_ms + getattr(request, "timeout_ms", 0)
        self._deadlines.append((now_ms() + timeout, txn))
        self._outgoing.setdefault(bookie, []).append(request)

    def _flush(self) -> None:
        while self._outgoing:
            outgoing, self._outgoing = self._outgoing, {}
            for bookie, requests in outgoing.items():
                for start in range(0, len(requests), DEFAULT_MAX_REQUESTS):   # bookies refuse larger frames
                    chunk = requests[start:start + DEFAULT_MAX_REQUESTS]
                    if not self.transport.send(bookie, encode_requests(chunk)):
                        for request in chunk:
                            self._unreachable(request.txn, f"bookie {bookie} is down")

    def _unreachable(self, txn: int, why: str) -> None:
        found = self._inflight.pop(txn, None)
        if found is None:
            return
        bookie, driver, request = found
        self._by_bookie[bookie].discard(txn)
        event = _failure_event(bookie, request, Status.UNREACHABLE, why)
        if event is not None:
            self.step(driver, event)

    def _on_frame(self, bookie: str, frame: bytes) -> None:
        try:
            responses = decode_responses(frame)
        except WireError as exc:
            log.warning("undecodable reply from bookie %s: %s", bookie, exc)
            return
        for response in responses:
            found = self._inflight.pop(response.txn, None)
            if found is None:
                if isinstance(response, ErrorResponse):
                    log.warning("bookie %s refused a frame: %s", bookie, response.message)
                continue                    # late answer to a request that already timed out
            _, driver, request = found
            self._by_bookie[bookie].discard(response.txn)
            event = _response_event(bookie, request, response)
            if event is not None:
                self.step(driver, event)

    # -- metadata (on the executor) ----------------------------------------------------------
    def _write_metadata(self, driver: Driver, command: ev.WriteMetadata) -> None:
        metadata = command.metadata
        key = ledger_key(metadata.ledger_id)
        try:
            try:
                version = self.store.put(key, metadata.to_bytes(), command.expected_version)
                event = ev.MetadataWritten(metadata=metadata, version=version)
            except BadVersion:
                value, version = self.store.get(key)
                event = ev.MetadataConflict(metadata=LedgerMetadata.from_bytes(value), version=version)
        except NoSuchKey:
            event = ev.MetadataFailed(ledger_id=metadata.ledger_id,
                                      error=NoSuchLedger(f"ledger {metadata.ledger_id} was deleted"))
        except WalkitError as exc:
            event = ev.MetadataFailed(ledger_id=metadata.ledger_id, error=exc)
        self._post(lambda: self.step(driver, event))

    def _choose_bookies(self, driver: Driver, command: ev.ChooseBookies) -> None:
        try:
            live = self.registry.live()
        except WalkitError as exc:
            log.warning("cannot list bookies: %s", exc)
            live = {}
        bookies = self.registry.writable(command.exclude, live)
        back = frozenset(b for b in command.recheck if b in live and not live[b].read_only)

        def deliver() -> None:
            for bookie in back:          # registered again: connect now rather than at ZeroMQ's next retry
                self.transport.revive(bookie)
            self.step(driver, ev.BookiesChosen(ledger_id=command.ledger_id, bookies=bookies, back=back))
        self._post(deliver)

    def _post(self, fn: Callable[[], None]) -> None:
        if not self._stopping:
            self._inbox.append(fn)
            self.transport.wake()

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = 0
        while not self._stopping:
            try:
                wait = max(0, next_tick - now_ms()) if not self._inbox else 0
                frames, down = self.transport.poll(wait)
                while self._inbox:
                    self._inbox.popleft()()
                for bookie, frame in frames:
                    self._on_frame(bookie, frame)
                for bookie in down:
                    for txn in list(self._by_bookie.get(bookie, ())):
                        self._unreachable(txn, f"lost the connection to bookie {bookie}")
                now = now_ms()
                if now >= next_tick:
                    next_tick = now + self.tick_ms
                    self._tick(now)
                self._flush()
            except Exception:  # noqa: BLE001 - the I/O thread must survive a bug in one machine
                log.exception("client I/O loop error")
        error = ClientClosed("the client was closed")
        for driver in list(self._drivers):
            driver.fail(error)
        self._drivers.clear()

    def _tick(self, now: int) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, txn = deadlines.popleft()
            if txn in self._inflight:
                self._unreachable(txn, "no answer in time")
        tick = ev.Ticked(now_ms=now)
        for driver in list(self._drivers):
            self.step(driver, tick)


def _response_event(bookie: str, request, response):
    """_response_event turns a bookie's response to `request` into a machine event."""
    status = response.status
    if isinstance(response, ErrorResponse) or status != Status.OK:
        return _failure_event(bookie, request, status, response.message)
    kind = type(request)
    if kind is AddRequest:
        return ev.AddsAcked(bookie=bookie, ledger_id=request.ledger_id, entry_ids=response.entry_ids)
    if kind is ReadRequest:
        got = {e.entry_id for e in response.entries}
        missing = [i for i in request.entry_ids if i not in got]
        return ev.EntriesRead(bookie=bookie, ledger_id=request.ledger_id, entries=response.entries,
                              missing=missing, lac=response.lac)
    if kind is ReadLacRequest:
        return ev.LacRead(bookie=bookie, ledger_id=request.ledger_id, status=status, lac=response.lac,
                          last_entry_id=response.last_entry_id)
    return None       # WriteLac: nothing waits for it


def _failure_event(bookie: str, request, status: Status, message: str):
    """_failure_event is the event for a request that failed as a whole at `bookie`."""
    kind = type(request)
    if kind is AddRequest:
        return ev.AddsRejected(bookie=bookie, ledger_id=request.ledger_id,
                               entry_ids=[e.entry_id for e in request.entries], status=status, message=message)
    if kind is ReadRequest:
        return ev.ReadFailed(bookie=bookie, ledger_id=request.ledger_id, entry_ids=request.entry_ids,
                             status=status, message=message)
    if kind is ReadLacRequest:
        return ev.LacRead(bookie=bookie, ledger_id=request.ledger_id, status=status, message=message)
    return None       # WriteLac: nothing waits for it
