"""walkit.adapters.kv.replica is one replica's state machine on its event loop: apply, write, snapshot.

Everything here runs on one asyncio event loop thread; other threads hand work to it with
`loop.call_soon_threadsafe` and never touch the state themselves.

Writes (leader only). `submit(record, done)` adds a record to the current batch; the batch is
appended to the log as one entry at the end of the loop iteration (many connections' writes
share an entry and its acknowledgement). Acknowledgements come back in log order on walkit's
I/O thread and are handed to the loop in that order; an entry is applied only once acked,
and `done(result)` receives the result computed at apply time (an INCR's new value, a SET NX
that did not happen, an error). So a write is answered only after the log acked it and it was
applied, and the leader and its followers, which apply the same entries in the same order,
hold the same state.

A failed append (LedgerFenced: another replica opened the log; or any other error) ends the
leadership at once: no further write is accepted, every write not yet applied is answered
with an error (it may or may not be in the log; the log decides, and this replica learns which
by tailing it as a follower), and `on_deposed` tells the role thread (roles.py).

Entries read from the log (a follower tailing, a new leader replaying) go through
`apply_log_records`, which skips positions already applied.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from walkit import Position
from walkit.adapters.kv.records import decode_entry, encode_entry, encode_record
from walkit.adapters.kv.resp import ReplyError
from walkit.adapters.kv.snapshot import Image, SnapshotPointer
from walkit.adapters.kv.state import State

log = logging.getLogger("walkit.adapters.kv")

FOLLOWER, PROMOTING, LEADER, STOPPED = "follower", "promoting", "leader", "stopped"

#: A batch is appended as soon as it holds this many records or bytes.
MAX_BATCH_RECORDS = 2048
MAX_BATCH_BYTES = 1 << 20


def wall_ms() -> int:
    """wall_ms is this machine's clock in ms since the epoch."""
    return int(time.time() * 1000)


class NotLeader(Exception):
    """NotLeader is raised by `submit` on a replica that does not serve writes now."""


class _Append:
    """_Append is one log entry in flight: its records, their callbacks, and the outcome."""

    __slots__ = ("records", "callbacks", "stamp", "future", "abandoned")

    def __init__(self, records: list, callbacks: list, stamp: int) -> None:
        self.records = records
        self.callbacks = callbacks
        self.stamp = stamp
        self.future = None
        self.abandoned = False


class Replica:
    """Replica holds the state, the applied position and the role of this member of the store.

    `snapshot_every` is how many applied records (as leader) trigger a snapshot, which
    `take_snapshot(image)` writes from another thread; it must call `snapshot_done()` (through
    the loop) when it finished or failed. `on_deposed(error)` is called on the loop thread
    when a leader's append fails.
    """

    def __init__(self, loop, *, snapshot_every: int = 100_000,
                 take_snapshot: Callable[[Image], None] | None = None,
                 on_deposed: Callable[[BaseException], None] | None = None) -> None:
        self.loop = loop
        self.state = State()
        self.position: Position | None = None      # the last applied entry
        self.index = 0                             # records applied since the store began
        self.stamp = 0                             # the largest leader stamp applied
        self.role = FOLLOWER
        self.leader: str | None = None             # the leader's address, as last known
        self.epoch: int | None = None
        self.lag_entries: int | None = None        # entries in the log not applied yet (followers)
        self.last_apply = time.monotonic()
        self.snapshot_every = snapshot_every
        self.snapshots = 0
        self.snapshot_position: Position | None = None
        self._take_snapshot = take_snapshot
        self._on_deposed = on_deposed
        self._since_snapshot = 0
        self._snapshotting = False
        self._writer = None
        self._batch: list = []
        self._batch_callbacks: list = []
        self._batch_bytes = 0
        self._inflight: collections.deque[_Append] = collections.deque()
        self._next_index = 0                       # the number of the next record to append (leader)
        self._stamped = 0                          # the last stamp handed out (leader)

    # -- positions ------------------------------------------------------------------------
    @property
    def next_position(self) -> Position | None:
        """next_position is where reading the log resumes: just after the last applied entry."""
        if self.position is None:
            return None
        return Position(self.position.ledger_id, self.position.entry_id + 1)

    def now_ms(self) -> int:
        """now_ms is this replica's clock: never behind a stamp it applied or, as leader, handed out."""
        return max(wall_ms(), self.stamp, self._stamped)

    # -- applying -------------------------------------------------------------------------
    def _apply_entry(self, position: Position, stamp: int, records: list, callbacks: list | None = None) -> None:
        """_apply_entry applies one entry's records in order at the entry's stamp.

        Each callback gets its record's result before the next record is applied, so a read
        chained to a write (server.py) sees exactly that write and the ones before it.
        """
        state = self.state
        if callbacks is None:
            for record in records:
                state.apply(record, stamp)
        else:
            for record, done in zip(records, callbacks):
                done(state.apply(record, stamp))
        state.purge_expired(stamp)
        self.position = position
        self.index += len(records)
        if stamp > self.stamp:
            self.stamp = stamp
        self.last_apply = time.monotonic()
        self._since_snapshot += len(records)
        if self.role is LEADER and self._since_snapshot >= self.snapshot_every and not self._snapshotting:
            self._start_snapshot()

    def apply_log_records(self, records) -> None:
        """apply_log_records applies walkit LogRecords read from the log, skipping records already applied.

        Readers check for gaps before they hand records over (`tailer.read_from`); a gap seen here
        means a reader broke that rule, and the entry is refused rather than applied out of order.
        """
        for record in records:
            stamp, first, decoded = decode_entry(record.payload)
            if first + len(decoded) <= self.index:
                continue
            if first != self.index:
                log.error("refusing entry %s: it starts at record %d, this replica is at %d",
                          record.position, first, self.index)
                return
            self._apply_entry(record.position, stamp, decoded)

    def install(self, state: State, pointer: SnapshotPointer) -> bool:
        """install replaces the state with a loaded snapshot, unless this replica is already past it."""
        if self.position is not None and self.index >= pointer.index:
            return False
        self.state = state
        self.position, self.index, self.stamp = pointer.position, pointer.index, max(self.stamp, pointer.stamp)
        self.snapshot_position = pointer.position
        return True

    # -- writing (leader) -------------------------------------------------------------------
    def submit(self, record, done: Callable[[object], None]) -> None:
        """submit appends `record` with the next batch; `done(result)` is called once it is applied.

        It raises NotLeader unless this replica serves writes now.
        """
        if self.role is not LEADER:
            raise NotLeader(self.leader)
        encoded = encode_record(record)
        self._batch.append(record)
        self._batch_callbacks.append((done, encoded))
        self._batch_bytes += len(encoded)
        if len(self._batch) == 1:
            self.loop.call_soon(self._flush)
        elif len(self._batch) >= MAX_BATCH_RECORDS or self._batch_bytes >= MAX_BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        records, callbacks = self._batch, self._batch_callbacks
        self._batch, self._batch_callbacks, self._batch_bytes = [], [], 0
        stamp = self.now_ms()
        append = _Append(records, [done for done, _ in callbacks], stamp)
        self._inflight.append(append)
        first, self._next_index = self._next_index, self._next_index + len(records)
        try:
            future = self._writer.append_async(encode_entry(stamp, first, [encoded for _, encoded in callbacks]))
        except Exception as exc:  # noqa: BLE001 - any failure ends the leadership
            self.lose_leadership(exc)
            return
        self._stamped = stamp               # later entries are stamped no earlier than this one
        future.add_done_callback(lambda f, a=append: self._acked_elsewhere(a, f))

    def _acked_elsewhere(self, append: _Append, future) -> None:
        """_acked_elsewhere runs on walkit's I/O thread: it hands the outcome to the loop, in ack order."""
        try:
            self.loop.call_soon_threadsafe(self._acked, append, future)
        except RuntimeError:
            pass                            # the loop is closed: the server is gone

    def _acked(self, append: _Append, future) -> None:
        if append.abandoned:
            return
        append.future = future
        inflight = self._inflight
        while inflight and inflight[0].future is not None:
            head = inflight.popleft()
            error = head.future.exception()
            if error is not None:
                inflight.appendleft(head)
                self.lose_leadership(error)
                return
            self._apply_entry(head.future.result(), head.stamp, head.records, head.callbacks)

    def start_leading(self, writer, epoch: int | None, address: str) -> None:
        """start_leading makes this replica serve writes through `writer` (the log is replayed to its end)."""
        assert not self._inflight and not self._batch, "a previous leadership left writes behind"
        self._writer = writer
        self._next_index = self.index
        self.role, self.epoch, self.leader, self.lag_entries = LEADER, epoch, address, 0
        self._since_snapshot = 0
        log.info("leading (epoch %s): %d records applied, up to log position %s", epoch, self.index,
                 self.position or "-")

    def lose_leadership(self, error: BaseException) -> None:
        """lose_leadership stops serving writes at once and fails every write not yet applied."""
        leading = self.role is LEADER
        if leading:
            self.role, self.leader = FOLLOWER, None
            log.warning("stepping down: %s: %s", type(error).__name__, error)
        self._writer = None
        self._fail_pending(ReplyError(
            f"ERR the log refused the write ({type(error).__name__}); this server stepped down as leader, "
            "and the write may or may not have taken effect"))
        if leading and self._on_deposed is not None:
            self._on_deposed(error)

    def stop_writes(self) -> None:
        """stop_writes refuses new writes for a clean shutdown; writes already appended still complete."""
        if self.role is LEADER:
            self._flush()
            self.role = STOPPED

    @property
    def writes_in_flight(self) -> int:
        """writes_in_flight counts log entries appended and not yet acknowledged."""
        return len(self._inflight)

    def abandon_writes(self, reply: ReplyError) -> None:
        """abandon_writes answers every write not yet applied with `reply` and forgets them."""
        self._writer = None
        self._fail_pending(reply)

    def _fail_pending(self, reply: ReplyError) -> None:
        pending = list(self._inflight)
        self._inflight.clear()
        callbacks = [done for append in pending for done in append.callbacks]
        callbacks += [done for done, _ in self._batch_callbacks]
        self._batch, self._batch_callbacks, self._batch_bytes = [], [], 0
        for append in pending:
            append.abandoned = True
        for done in callbacks:
            done(reply)

    # -- snapshots ------------------------------------------------------------------------
    def _start_snapshot(self) -> None:
        if self._take_snapshot is None or self.position is None:
            return
        data, expires = self.state.copy_items()
        image = Image(data, expires, self.position, self.index, self.stamp)
        self._snapshotting = True
        self._since_snapshot = 0
        self._take_snapshot(image)

    def snapshot_done(self, pointer: SnapshotPointer | None) -> None:
        """snapshot_done is called (on the loop) when a snapshot was published (pointer) or failed (None)."""
        self._snapshotting = False
        if pointer is not None:
            self.snapshots += 1
            self.snapshot_position = pointer.position
