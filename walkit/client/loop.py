"""walkit.client.loop is the client's I/O thread: it owns the transport and every core machine.

Other threads never touch a machine; they hand work to the loop with `call(fn)`. Each round the
loop waits on the transport, runs the queued calls, hands bookie responses to the dispatcher
(walkit.core.dispatch), which turns them into events for the machine that sent the request,
passes time (Ticked) to every machine, and sends what the machines asked for: requests are
queued per bookie and leave as ONE frame per bookie per round (split below the bookies'
requests-per-frame limit), so thousands of pipelined adds become a handful of messages.
Metadata calls run on a small thread pool and their results come back through the dispatcher.

The dispatcher ends every request exactly once: with the bookie's answer, or with UNREACHABLE
when the bookie is down, the send failed or no answer came in time.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from walkit.core import events as ev
from walkit.core.dispatch import Dispatcher, StoreCall
from walkit.core.messages import Status
from walkit.errors import BadVersion, ClientClosed, NodeExists, NoSuchKey, NotEnoughBookies, Timeout
from walkit.registry import BookieRegistry
from walkit.core.messages import FRAME_BUDGET, encoded_size
from walkit.wire.codec import DEFAULT_MAX_REQUESTS, WireError, decode_responses, encode_requests

log = logging.getLogger("walkit.client")

#: Answers of the metadata store (and of placement) that are outcomes the machines expect, not failures.
_OUTCOMES = (NoSuchKey, NodeExists, BadVersion, NotEnoughBookies)
#: A metadata call that keeps failing is logged at most this often.
STORE_WARNING_S = 5.0

_KEY_REFUSED = "the bookie refused this client's key (not on the allow-list, or no key)"


def now_ms() -> int:
    """now_ms is the monotonic clock the client's machines run on, in milliseconds."""
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    """wall_ms is wall-clock time in milliseconds since the epoch (recorded in metadata)."""
    return int(time.time() * 1000)


def result_within(future, timeout: float, what: str):
    """result_within is the future's result; Timeout, naming `what`, if it is not done within `timeout` seconds.

    Every blocking call of the client (ledgers and logs) waits through it.
    """
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError as exc:
        # concurrent.futures.TimeoutError is the built-in TimeoutError, which walkit's Timeout
        # derives from: an operation that failed with its own Timeout keeps its message.
        if isinstance(exc, Timeout):
            raise
        raise Timeout(f"{what} did not finish within {timeout:g} s") from None


class Driver:
    """Driver pairs a core machine with the shell-side effects of its completion commands.

    Subclasses implement `handle(command)` for the commands the loop does not execute itself
    (completing futures, delivering entries) and `fail(error)` for client shutdown.
    """

    machine: object
    finished = False
    #: The loop does not tick the driver before this time (ms; 0: every tick). A driver whose machine
    #: needs no time to pass for a while sets it, and lowers it for a timer (walkit.replication's nodes).
    quiet_until = 0

    def handle(self, command) -> None:
        raise NotImplementedError

    def fail(self, error: Exception) -> None:
        """fail ends the driver's work with `error` (the client is closing)."""
        self.finished = True


def frames_of(requests: list, max_requests: int = DEFAULT_MAX_REQUESTS, budget: int = FRAME_BUDGET):
    """frames_of splits one bookie's requests, in order, into frames a bookie takes whole.

    A frame holds at most `max_requests` requests and `budget` bytes by
    walkit.core.messages.encoded_size; a request larger than the budget goes alone (the
    dispatcher splits adds above it, so only a lone entry near the entry limit gets there).
    """
    chunk: list = []
    size = 0
    for request in requests:
        cost = encoded_size(request)
        if chunk and (len(chunk) >= max_requests or size + cost > budget):
            yield chunk
            chunk, size = [], 0
        chunk.append(request)
        size += cost
    if chunk:
        yield chunk


class ClientLoop:
    """ClientLoop runs the I/O thread of one Client."""

    def __init__(self, transport, store, *, request_timeout_ms: int = 10000, tick_ms: int = 10) -> None:
        self.transport = transport
        self.store = store
        self.registry = BookieRegistry(store)
        self.request_timeout_ms = request_timeout_ms
        self.tick_ms = tick_ms
        self.dispatcher = Dispatcher(request_timeout_ms)
        self._inbox: deque[Callable[[], None]] = deque()
        self._next_tick = 0
        self._drivers: set[Driver] = set()
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="walkit-meta")
        self._store_warned = -STORE_WARNING_S      # when a failing metadata call was last logged
        self._thread = threading.Thread(target=self._run, name="walkit-io", daemon=True)
        self._thread.start()

    # -- API for other threads -------------------------------------------------------------
    def call(self, fn: Callable[[], None]) -> None:
        """call runs `fn()` on the I/O thread, soon and in call order."""
        if self._stopping:
            raise ClientClosed("the client is closed")
        self._inbox.append(fn)
        self.transport.wake()

    def call_unhurried(self, fn: Callable[[], None]) -> None:
        """call_unhurried runs `fn()` on the I/O thread with whatever wakes it next (any call, frame or tick:
        within tick_ms), in call order with `call`'s: for work nobody waits for, it saves a wake-up."""
        if self._stopping:
            raise ClientClosed("the client is closed")
        self._inbox.append(fn)

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
        """execute hands the commands' I/O to the dispatcher; the outcomes go to the driver."""
        for command in self.dispatcher.execute(driver, commands, now_ms()):
            driver.handle(command)
        calls = self.dispatcher.take_calls()
        for call in calls:
            self._executor.submit(self._store_call, call)
        if driver.finished:
            self._drivers.discard(driver)

    def _deliver(self, events: list) -> None:
        for driver, event in events:
            self.step(driver, event)

    # -- requests --------------------------------------------------------------------------
    def _flush(self) -> None:
        dispatcher = self.dispatcher
        while True:
            outgoing = dispatcher.take_requests()
            if not outgoing:
                return
            for bookie, requests in outgoing.items():
                for chunk in frames_of(requests):
                    if not self.transport.send(bookie, encode_requests(chunk)):
                        self._deliver(self._failed_send(bookie, chunk))

    def _failed_send(self, bookie: str, requests: list) -> list:
        """_failed_send ends requests that could not be sent: UNAUTHORIZED if the bookie refused our keys."""
        if bookie in getattr(self.transport, "refused", ()):
            return self.dispatcher.unreachable(bookie, requests, _KEY_REFUSED, Status.UNAUTHORIZED)
        return self.dispatcher.unreachable(bookie, requests, f"bookie {bookie} is down")

    def _on_frame(self, bookie: str, frame: bytes) -> None:
        try:
            responses = decode_responses(frame)
        except WireError as exc:
            log.warning("undecodable reply from bookie %s: %s", bookie, exc)
            return
        dispatcher = self.dispatcher
        for response in responses:
            if response.txn == 0:
                log.warning("bookie %s refused a frame: %s", bookie, response.message)
                continue
            self._deliver(dispatcher.on_response(bookie, response))

    # -- metadata (on the executor) ----------------------------------------------------------
    def _store_call(self, call: StoreCall) -> None:
        value, error = None, None
        try:
            if call.method == "live_bookies":
                value = self.registry.placed(*call.args)
            else:
                value = getattr(self.store, call.method)(*call.args)
        except Exception as exc:  # noqa: BLE001 - the dispatcher decides what an error means
            error = exc
            if not isinstance(exc, _OUTCOMES):
                self._warn_store(call.method, exc)

        def deliver() -> None:
            self._deliver(self.dispatcher.store_result(call.call_id, value, error))
            reconnect = self.dispatcher.reconnect
            while reconnect:             # registered again: connect now, not at ZeroMQ's next retry
                self.transport.revive(reconnect.pop())
        self._post(deliver)

    def _warn_store(self, method: str, exc: Exception) -> None:
        """_warn_store logs a failed metadata call, at most once per STORE_WARNING_S.

        Log opens and rolls retry some calls until they succeed (a ledger id, say), so without
        this a busy or unreachable store showed only as a timeout of the operation waiting.
        """
        now = time.monotonic()
        if now - self._store_warned >= STORE_WARNING_S:
            self._store_warned = now
            log.warning("metadata store call %s failed: %s", method, exc)

    def _post(self, fn: Callable[[], None]) -> None:
        if not self._stopping:
            self._inbox.append(fn)
            self.transport.wake()

    # -- the loop ----------------------------------------------------------------------------
    def tick_at(self, at_ms: int) -> None:
        """tick_at (on the I/O thread) makes the next tick come at `at_ms` at the latest (a machine's Wake)."""
        self._next_tick = min(self._next_tick, at_ms)

    def _run(self) -> None:
        self._next_tick = 0
        while not self._stopping:
            try:
                wait = max(0, self._next_tick - now_ms()) if not self._inbox else 0
                frames, down = self.transport.poll(wait)
                while self._inbox:
                    self._inbox.popleft()()
                for bookie, frame in frames:
                    self._on_frame(bookie, frame)
                for bookie in down:
                    if bookie in getattr(self.transport, "refused", ()):
                        self._deliver(self.dispatcher.bookie_down(bookie, _KEY_REFUSED, Status.UNAUTHORIZED))
                    else:
                        self._deliver(self.dispatcher.bookie_down(bookie, f"lost the connection to bookie {bookie}"))
                now = now_ms()
                if now >= self._next_tick:
                    self._next_tick = now + self.tick_ms
                    self._tick(now)
                self._flush()
            except Exception:  # noqa: BLE001 - the I/O thread must survive a bug in one machine
                log.exception("client I/O loop error")
        error = ClientClosed("the client was closed")
        for driver in list(self._drivers):
            driver.fail(error)
        self._drivers.clear()

    def _tick(self, now: int) -> None:
        wall = wall_ms()
        self._deliver(self.dispatcher.tick(now, wall))
        tick = ev.Ticked(now_ms=now, wall_ms=wall)
        for driver in list(self._drivers):
            if driver.quiet_until <= now:
                self.step(driver, tick)
