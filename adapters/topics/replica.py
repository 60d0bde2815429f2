"""walkit.adapters.topics.replica is the leader's side of one replicated log: submit, ack, apply.

`LeaderLog` owns a walkit LogWriter (opened by the election winner, which fenced the previous
writer) and a state machine (`apply(record, position)`). `submit(record)` appends at once and
returns an asyncio Future; the record is applied, and the Future resolved with apply's result,
only once the log acknowledged it and every earlier record was applied, so the state only ever
holds acknowledged records, in log order, exactly as a replica replaying the log builds it.

A failed append (LedgerFenced: another broker opened the log; or any other error) ends the
leadership at once: nothing more is accepted, every pending Future fails with
NOT_LEADER_OR_FOLLOWER (the record may or may not be in the log; the next leader's replay
decides), and `on_lost` tells the owner. Everything here runs on the broker's event loop;
walkit's acknowledgements arrive on its I/O thread and are handed over in order.

This is the part of DESIGN.md §7's `walkit.replicate` that the broker needs; once that module
exists, LeaderLog is replaced by it and the state machines stay as they are.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError

log = logging.getLogger("walkit.adapters.topics")


class _Pending:
    __slots__ = ("record", "future", "position", "error")

    def __init__(self, record: bytes, future: asyncio.Future) -> None:
        self.record = record
        self.future = future
        self.position = None
        self.error: BaseException | None = None


class LeaderLog:
    """LeaderLog appends records to `writer` and applies them to `state` once acknowledged."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, writer, state,
                 on_lost: Callable[[BaseException], None], on_applied: Callable[[bytes, object], None] | None = None) -> None:
        self.loop = loop
        self.name = name
        self.writer = writer
        self.state = state
        self.active = True
        self._on_lost = on_lost
        self._on_applied = on_applied
        self._pending: collections.deque[_Pending] = collections.deque()

    @property
    def in_flight(self) -> int:
        """in_flight counts records submitted and not yet applied."""
        return len(self._pending)

    def submit(self, record: bytes) -> asyncio.Future:
        """submit appends `record`; the Future resolves to state.apply's result once it is applied."""
        if not self.active:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.name}: this broker no longer leads")
        pending = _Pending(record, self.loop.create_future())
        try:
            inner = self.writer.append_async(record)
        except Exception as exc:  # noqa: BLE001 - any failure ends the leadership
            self.lose(exc)
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.name}: append failed: {exc}") from None
        self._pending.append(pending)
        loop = self.loop

        def done(future) -> None:
            try:
                loop.call_soon_threadsafe(self._acked, pending, future)
            except RuntimeError:
                pass                            # the loop is closed: the broker is gone
        inner.add_done_callback(done)
        return pending.future

    def _acked(self, pending: _Pending, future) -> None:
        error = future.exception()
        if error is not None:
            pending.error = error
            self.lose(error)
            return
        pending.position = future.result()
        queue = self._pending
        while queue and queue[0].position is not None and self.active:
            done = queue.popleft()
            try:
                result = self.state.apply(done.record, done.position)
            except Exception as exc:  # noqa: BLE001 - a state machine bug must not wedge the loop
                log.exception("%s: applying the entry at %s failed", self.name, done.position)
                if not done.future.done():
                    done.future.set_exception(exc)
                continue
            if not done.future.done():
                done.future.set_result(result)
            if self._on_applied is not None:
                self._on_applied(done.record, result)

    def lose(self, error: BaseException) -> None:
        """lose ends the leadership: pending records fail and `on_lost(error)` is called once."""
        if not self.active:
            return
        self.active = False
        log.warning("%s: leadership lost: %s: %s", self.name, type(error).__name__, error)
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(KafkaError(errors.NOT_LEADER_OR_FOLLOWER,
                                                        f"{self.name}: leadership lost while appending"))
        self._on_lost(error)

    def stop(self) -> None:
        """stop ends the leadership on purpose (resignation, shutdown) without calling `on_lost`."""
        self._on_lost, on_lost = (lambda error: None), self._on_lost
        self.lose(KafkaError(errors.NOT_LEADER_OR_FOLLOWER, "stepped down"))
        self._on_lost = on_lost
