"""walkit.adapters.kv.reads decides when a read may look at this server's state: now, or after a read barrier.

Rules (docs/guides/kv.md#semantics):

- A leader whose lease runs (`node.lease_valid`: an append was acknowledged or its leadership
  proved less than `lease_ms` ago) reads its own state at once: no other server can have
  been elected since, so nothing was acknowledged that it has not applied.
- A leader whose lease ran out (it was idle, overloaded or paused) first waits for
  `node.read_barrier()`: the barrier proves it still leads, or finds that another server
  opened the log; then this server steps down and waits, as a follower, until it applied the
  log as far as it reached when the barrier began. Either way the read that follows sees
  every write acknowledged before it arrived.
- A follower reads its own state at once, like a Redis replica: a stale read (INFO reports
  `lag_entries`). Except a server that led since its last barrier (the node's on_role said so,
  or it served as leader): its clients saw it lead and expect what it answers to be current,
  so until a barrier completed on it as a follower its reads wait for one too (a leader paused
  past its lease, deposed meanwhile and resumed never answers from the state it had when it
  stopped).

Reads that must wait share barriers: every read waiting when a barrier starts is answered when
it ends, and reads that arrive meanwhile wait for the next one (a barrier covers only the
writes acknowledged before it began). The barrier runs on a worker thread, off the event loop.
"""

from __future__ import annotations

import logging
from typing import Callable

from walkit.adapters.kv.resp import ReplyError
from walkit.errors import WalkitError

log = logging.getLogger("walkit.adapters.kv")

#: How long a read waits for its barrier before it is answered with an error.
BARRIER_TIMEOUT_S = 10.0


class ReadGate:
    """ReadGate applies the rules above for one server; everything but the barrier runs on the event loop.

    `node` is read when needed (the server sets it once walkit.replicate started).
    """

    def __init__(self, server, timeout: float = BARRIER_TIMEOUT_S) -> None:
        self.server = server
        self.timeout = timeout
        self.barriers = 0                       # barriers completed (INFO)
        self._led = False                       # led since the last barrier that completed as a follower
        self._led_since = 0                     # bumped whenever _led turns True
        self._waiting: list[Callable[[ReplyError | None], None]] = []
        self._running = False

    def saw_leader(self) -> None:
        """saw_leader notes that this server served as leader (a write was accepted, a leader read answered)."""
        if not self._led:
            self._led = True
            self._led_since += 1

    def must_wait(self) -> bool:
        """must_wait tells whether a read arriving now has to wait for a barrier (see the module doc)."""
        node = self.server.node
        if node.is_leader:
            self.saw_leader()
            return not node.lease_valid
        return self._led

    def after_barrier(self, then: Callable[[ReplyError | None], None]) -> None:
        """after_barrier calls `then(None)` on the event loop once a barrier that began after this call ended.

        If the barrier fails, `then` gets the error reply instead.
        """
        self._waiting.append(then)
        if not self._running:
            self._start()

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        self._running = True
        led_since = self._led_since
        node = self.server.node
        done = self.server.loop.run_in_executor(None, node.read_barrier, self.timeout)
        done.add_done_callback(lambda f: self._ended(f, waiting, led_since))

    def _ended(self, done, waiting: list, led_since: int) -> None:
        self._running = False
        error = None
        if done.cancelled():
            error = ReplyError("ERR this server is shutting down")
        elif done.exception() is not None:
            exc = done.exception()
            log.warning("a read barrier failed: %s: %s", type(exc).__name__, exc)
            text = f"{type(exc).__name__}: {exc}" if isinstance(exc, WalkitError) else repr(exc)
            error = ReplyError(f"TRYAGAIN this server could not make sure its data is current ({text})")
        else:
            self.barriers += 1
            if not self.server.node.is_leader and led_since == self._led_since:
                self._led = False               # caught up as a follower: stale reads are a follower's again
        for then in waiting:
            then(error)
        if self._waiting:
            self._start()
