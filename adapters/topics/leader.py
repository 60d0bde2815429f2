"""walkit.adapters.topics.leader serves a partition while this broker leads it: produce, fetch, retention.

Every broker runs a walkit.replicate node of every partition (broker.py): `PartitionMachine`
(partition.py) applies the partition's log on the node's apply thread, on the leader right
after each entry is acknowledged and on the other brokers as they tail the log, so a broker
that takes a partition over already holds its state. The node elects the leader, fences the
previous one by opening the log and snapshots the state into ledgers.

`PartitionLeader` is the event loop's side. It serves only between the node's "leader" and
"follower" role changes (`active`). Produce: the batches of a request are checked
(batches.py), judged against the idempotent producers' state (producers.py), numbered from
the next free offset and submitted at once, in request order; each is answered once applied.
The producer check runs against a projection that already includes batches still in flight,
so a retry that arrives while its original is pending waits for the original's answer
instead of being appended twice.

Fetch: the recently applied batches stay in memory (up to `cache_bytes`), so consumers at the
tail are served without touching the bookies; older offsets are read from the log, starting
at the entry the offset index names, as far as one forward pass goes (after a compaction the
index's batches are not in log order: compaction.py). Long polls wait on `wait_for_data`.

Leader epochs (epochs.py): on "leader" the partition first appends an epoch record with its
walkit.replicate epoch, then stamps that epoch into every batch it appends; `end_offset_for`
answers OffsetForLeaderEpoch. DeleteRecords (`delete_records`) appends a delete record that
moves every broker's log start offset, then snapshots, so the log is truncated behind it.

Retention (`retention.ms`, `retention.bytes`): whole ledgers before the current one expire
when all their records are older than retention.ms, or while the partition would still hold
retention.bytes without them. The leader submits a retain record (every broker's index then
forgets those batches and the log start offset moves), then takes a snapshot, after which
walkit.replicate truncates the log before the first batch kept (`keep_log_from`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from walkit import Position
from walkit.adapters.topics import errors
from walkit.adapters.topics.batches import batches_before, first_offset_at, info, last_offset, with_base_offset
from walkit.adapters.topics.compaction import Compactor, is_swap, swap_batches
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.partition import (
    PartitionMachine, PartitionState, delete_record, epoch_record, retain_record,
)
from walkit.adapters.topics.producers import DUPLICATE
from walkit.adapters.topics.transactions import control_batch
from walkit.errors import LogTruncated, RecordTooLarge, WalkitError
from walkit.replication import batch as entries

log = logging.getLogger("walkit.adapters.topics")

#: Longest a node's role thread waits for the event loop to take a "follower" change in.
ROLE_WAIT_S = 5.0
#: Plans of one log read: a compaction may move the batches a read planned for (leader._read).
READ_ATTEMPTS = 3


def on_loop(loop: asyncio.AbstractEventLoop, fn, wait: bool = False) -> None:
    """on_loop runs `fn` on the event loop (from another thread); with `wait`, it returns once `fn` ran."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()
    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:
        return                                  # the loop is closed: the broker is gone
    if wait:
        done.wait(ROLE_WAIT_S)


def log_run(state: PartitionState, index: int, stop: int, max_bytes: int) -> tuple[list[tuple[Position, int]], int]:
    """log_run is where the batches from `index` are stored, as far as one forward pass over the log reads
    them (compaction puts batches out of log order), before `stop` and about max_bytes: their distinct
    (position, record index) keys in log order, and the index after the last batch."""
    keys, size, end = [state.where(index)], state.sizes[index], index + 1
    while end < stop and size < max_bytes:
        key = state.where(end)
        if key < keys[-1]:
            break
        if key != keys[-1]:
            keys.append(key)
        size += state.sizes[end]
        end += 1
    return keys, end


class PartitionLeader:
    """PartitionLeader is a partition on this broker, served while the broker leads it (see the module doc)."""

    def __init__(self, loop, client, topic: str, partition: int, log_name: str, machine: PartitionMachine, *,
                 password: bytes = b"", topic_id: str | None = None) -> None:
        self.loop = loop
        self.client = client
        self.topic = topic
        self.partition = partition
        self.log_name = log_name
        self.password = password
        self.machine = machine
        self.topic_id = topic_id
        self.node = None                          # the walkit.replicate node, set by the broker
        self.active = False                       # on the loop: between the "leader" and "follower" changes
        self.projected = machine.state.producers.copy()
        self.assigned = 0
        self._waiters: list[asyncio.Future] = []
        self._wake_due = False
        self._in_flight: dict[tuple[int, int, int], asyncio.Future] = {}
        self.retention_running = False
        self.compactor = Compactor(self)          # used when the topic's cleanup.policy has compact
        self.epoch = -1                           # the leader epoch while leading (epochs.py)
        self.epoch_start = 0                      # the offset it leads from
        machine.on_applied = self._applied

    @property
    def state(self) -> PartitionState:
        """state is the partition's replicated state (read it under machine.lock for more than one field)."""
        return self.machine.state

    @property
    def high_watermark(self) -> int:
        """high_watermark is the offset after the last acknowledged (and applied) batch."""
        return self.machine.state.next_offset

    # -- roles (called on the node's role thread) ----------------------------------------------
    def on_role(self, role: str) -> None:
        """on_role starts serving on "leader"; on "follower" it stops, before the node may lead again."""
        if role == "leader":
            on_loop(self.loop, self._lead)
        else:
            on_loop(self.loop, self._follow, wait=True)

    def _lead(self) -> None:
        if self.node is None or not self.node.is_leader:
            return                                # lost again meanwhile: "follower" comes next
        with self.machine.lock:                   # the node applied the whole log; nothing is in flight
            self.assigned = self.state.next_offset
            self.projected = self.state.producers.copy()
        epoch = self.node.election.epoch
        try:                                      # before any batch of this leadership (epochs.py)
            self.node.submit_async(epoch_record(epoch)).add_done_callback(lambda done: done.exception())
        except WalkitError as exc:
            log.info("%s-%d: leadership ended at once: %s", self.topic, self.partition, exc)
            return
        self.epoch, self.epoch_start = epoch, self.assigned
        self._in_flight.clear()
        self.machine.serving(True)
        self.active = True
        log.info("%s-%d: this broker leads from offset %d", self.topic, self.partition, self.assigned)

    def _follow(self) -> None:
        if self.active:
            log.info("%s-%d: this broker no longer leads", self.topic, self.partition)
        self.active = False
        self.machine.serving(False)
        self._wake()

    # -- produce ------------------------------------------------------------------------
    def append(self, batch: bytes) -> asyncio.Future:
        """append numbers and submits one checked batch; the Future resolves to its base offset.

        Raises KafkaError for a sequence or epoch the producer state refuses,
        MESSAGE_TOO_LARGE for a batch the node refuses as too large for a log entry (nothing is
        numbered or appended) and NOT_LEADER_OR_FOLLOWER once the leadership is gone.
        """
        if not self.active:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition} moved")
        head = info(batch)
        verdict, original = self.projected.check(head)
        key = (head.producer_id, head.producer_epoch, head.base_sequence)
        if verdict is DUPLICATE:
            pending = self._in_flight.get(key)
            if pending is not None:
                return pending
            done = self.loop.create_future()
            done.set_result(original)
            return done
        stored = with_base_offset(batch, self.assigned, self.epoch)
        placed = info(stored)
        try:
            submitted = self.node.submit_async(stored)
        except RecordTooLarge as exc:
            raise KafkaError(errors.MESSAGE_TOO_LARGE, f"{self.topic}-{self.partition}: {exc}") from None
        except WalkitError as exc:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition}: {exc}") from None
        self.assigned = placed.next_offset
        self.projected.record(placed)
        result = self.loop.create_future()
        if head.idempotent:
            self._in_flight[key] = result

        def finish(applied) -> None:
            self._in_flight.pop(key, None)
            if result.done():
                return
            error = applied.exception()
            if error is None:
                result.set_result(placed.base_offset)
            elif isinstance(error, KafkaError):
                result.set_exception(error)
            else:
                result.set_exception(KafkaError(errors.NOT_LEADER_OR_FOLLOWER,
                                                f"{self.topic}-{self.partition}: {type(error).__name__}: {error}"))
        submitted.add_done_callback(lambda applied: on_loop(self.loop, lambda: finish(applied)))
        return result

    def write_marker(self, producer_id: int, epoch: int, committed: bool, number: int, timestamp: int):
        """write_marker appends a transaction's COMMIT or ABORT marker (transactions.py); the Future resolves
        once it is applied. Raises NOT_LEADER_OR_FOLLOWER when the leadership is gone."""
        if not self.active:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition} moved")
        stored = with_base_offset(control_batch(producer_id, epoch, committed, number, timestamp), self.assigned,
                                  self.epoch)
        try:
            submitted = self.node.submit_async(stored)
        except WalkitError as exc:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition}: {exc}") from None
        self.assigned += 1
        self.projected.record_marker(producer_id, epoch)
        return asyncio.wrap_future(submitted, loop=self.loop)

    def stable(self, first: int, last: int) -> tuple[int, list[tuple[int, int]]]:
        """stable is the last stable offset and the aborted transactions with records in [first, last]."""
        with self.machine.lock:
            return self.state.last_stable_offset, self.state.aborted_between(first, last)

    def _applied(self) -> None:
        """_applied (apply thread) wakes the long polls, at most one wake-up per loop turn."""
        if not self._wake_due:
            self._wake_due = True
            on_loop(self.loop, self._wake)

    def _wake(self) -> None:
        self._wake_due = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def wait_for_data(self, seen: int | None = None) -> asyncio.Future:
        """wait_for_data resolves when the next batch is applied or the leadership ends.

        With `seen`, the high watermark the caller last read, it resolves at once if batches were
        applied since (their wake-up may have run before this call).
        """
        waiter = self.loop.create_future()
        if not self.active or (seen is not None and self.high_watermark != seen):
            waiter.set_result(None)
            return waiter
        if len(self._waiters) >= 64:               # long polls that timed out on an idle partition
            self._waiters = [w for w in self._waiters if not w.done()]
        self._waiters.append(waiter)
        return waiter

    # -- fetch ------------------------------------------------------------------------------
    async def read(self, offset: int, max_bytes: int, before: int | None = None) -> bytes:
        """read returns whole batches from the one holding `offset`, about `max_bytes` (at least one).

        Raises KafkaError(OFFSET_OUT_OF_RANGE) for an offset before the log start or after the
        high watermark; at the high watermark it returns nothing. With `before` (a read_committed
        fetch's last stable offset) only the batches below it are returned.
        """
        found = await self._read(offset, max_bytes)
        return found if before is None else batches_before(found, before)

    async def _read(self, offset: int, max_bytes: int) -> bytes:
        """_read reads from the cache or the log. A log read that finds its entries truncated is planned
        again while the offset is still in the index: a compaction moved its batch (the snapshot after
        the swap truncated the old ledgers under the read), and retention did not remove it."""
        machine = self.machine
        for attempt in range(READ_ATTEMPTS):
            with machine.lock:
                state = machine.state
                if offset == state.next_offset:
                    return b""
                index = state.locate(offset)
                if index is None:
                    raise KafkaError(errors.OFFSET_OUT_OF_RANGE,
                                     f"offset {offset} is outside [{state.log_start_offset}, {state.next_offset}]")
                if index == len(state):
                    return b""                          # past the last batch, in a gap compaction left
                cache_start = len(state) - len(machine.cache)
                if index >= cache_start:
                    return self._from_cache(index - cache_start, max_bytes)
                keys, end = log_run(state, index, cache_start, max_bytes)
                stop = state.where(end) if end == cache_start and end < len(state) else None
                run_end, first = state.nexts[end - 1], state.bases[index]
            try:
                head = await self.loop.run_in_executor(None, self._read_log, keys, first, max_bytes)
                break
            except LogTruncated:
                if attempt + 1 == READ_ATTEMPTS:
                    raise KafkaError(errors.OFFSET_OUT_OF_RANGE, f"offset {offset} was removed by retention") from None
            except (WalkitError, ValueError) as exc:
                raise KafkaError(errors.KAFKA_STORAGE_ERROR, f"reading offset {offset}: {exc}") from None
        if len(head) < max_bytes and stop is not None and head and last_offset(head) + 1 == run_end:
            with machine.lock:                     # the log reader read up to the cache: go on from memory
                cached = len(state) - len(machine.cache)
                if cached < len(state) and state.where(cached) == stop:
                    head += self._from_cache(0, max_bytes - len(head), at_least_one=False)
        return head

    def _from_cache(self, first: int, max_bytes: int, at_least_one: bool = True) -> bytes:
        parts, size = [], 0
        for stored in self.machine.cache[first:]:
            if (parts or not at_least_one) and size + len(stored) > max_bytes:
                break
            parts.append(stored)
            size += len(stored)
        return b"".join(parts)

    def _read_log(self, keys: list[tuple[Position, int]], first: int, max_bytes: int) -> bytes:
        """_read_log reads the batches the index stores at `keys` (log order), from base offset `first`, up to
        max_bytes (at least one; worker thread). A key naming a swap record stands for its batches."""
        wanted, last = set(keys), keys[-1]
        parts, size, expected = [], 0, first
        with self.client.read_log(self.log_name, start=keys[0][0], follow=False, password=self.password) as reading:
            for record in reading:
                for sub, stored in enumerate(entries.decode(record.payload)):
                    where = (record.position, sub)
                    if where > last:
                        return b"".join(parts)
                    if where not in wanted:
                        continue
                    for batch in swap_batches(stored) if is_swap(stored) else (stored,):
                        head = info(batch)
                        if head.base_offset < expected:
                            continue
                        if parts and size + len(batch) > max_bytes:
                            return b"".join(parts)
                        parts.append(batch)
                        size += len(batch)
                        expected = head.next_offset
                        if size >= max_bytes:
                            return b"".join(parts)
        return b"".join(parts)

    # -- list offsets --------------------------------------------------------------------
    async def offset_for_time(self, timestamp: int) -> tuple[int, int]:
        """offset_for_time returns (offset, timestamp) of the first record stamped >= timestamp, or (-1, -1)."""
        with self.machine.lock:
            index = self.state.locate_time(timestamp)
            if index is None:
                return -1, -1
            offset = self.state.bases[index]
        while offset < self.high_watermark:
            stored = await self.read(offset, 1)
            if not stored:
                break
            head = info(stored)
            found = first_offset_at(stored[:head.size], timestamp)
            if found is not None:
                return found
            offset = head.next_offset
        return -1, -1

    async def max_timestamp(self) -> tuple[int, int]:
        """max_timestamp returns (offset, timestamp) of the record with the largest timestamp, or (-1, -1)."""
        with self.machine.lock:
            index = self.state.max_timestamp_index()
            if index is None:
                return -1, -1
            stamp, base = self.state.max_times[index], self.state.bases[index]
        found = await self.offset_for_time(stamp)
        return found if found[0] >= 0 else (base, stamp)

    # -- leader epochs and DeleteRecords ----------------------------------------------------------
    def end_offset_for(self, requested: int, current: int = -1) -> tuple[int, int]:
        """end_offset_for is OffsetForLeaderEpoch's (epoch, end offset) of leadership `requested` (epochs.py).

        `current` is the leader epoch the client knows (-1: not checked): FENCED_LEADER_EPOCH when
        older than this leader's, UNKNOWN_LEADER_EPOCH when newer, as Kafka answers.
        """
        if not self.active:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition} moved")
        if current >= 0 and current != self.epoch:
            raise KafkaError(errors.FENCED_LEADER_EPOCH if current < self.epoch else errors.UNKNOWN_LEADER_EPOCH,
                             f"{self.topic}-{self.partition} is at leader epoch {self.epoch}, not {current}")
        with self.machine.lock:
            return self.state.epochs.end_offset_for(requested, self.state.next_offset,
                                                    (self.epoch, self.epoch_start))

    async def delete_records(self, offset: int) -> int:
        """delete_records moves the log start offset to `offset` (-1: the high watermark) on every broker and
        returns the new log start offset; the log is truncated before it at the next snapshot, started now.

        Raises OFFSET_OUT_OF_RANGE for an offset past the high watermark, NOT_LEADER_OR_FOLLOWER once the
        leadership is gone.
        """
        if not self.active:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition} moved")
        high = self.high_watermark
        offset = high if offset == -1 else offset
        if not 0 <= offset <= high:
            raise KafkaError(errors.OFFSET_OUT_OF_RANGE, f"offset {offset} is outside [0, {high}]")
        if offset > self.state.log_start_offset:
            try:
                await asyncio.wrap_future(self.node.submit_async(delete_record(offset)), loop=self.loop)
            except WalkitError as exc:
                raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition}: {exc}") from None
            self.loop.run_in_executor(None, self.node.snapshot_now).add_done_callback(lambda done: done.exception())
        return self.state.log_start_offset

    # -- retention ---------------------------------------------------------------------------
    async def enforce_retention(self, retention_ms: int, retention_bytes: int) -> int:
        """enforce_retention removes expired whole ledgers (never the current one); it returns how many."""
        if self.retention_running or not self.active or (retention_ms < 0 and retention_bytes < 0):
            return 0
        self.retention_running = True
        try:
            return await self._retain(retention_ms, retention_bytes)
        except (WalkitError, KafkaError) as exc:
            log.warning("%s-%d: retention failed: %s: %s", self.topic, self.partition, type(exc).__name__, exc)
            return 0
        finally:
            self.retention_running = False

    async def _retain(self, retention_ms: int, retention_bytes: int) -> int:
        loop = self.loop
        current = self.node.ledger_id             # the ledger this leader appends to: never removed
        if current is None:
            return 0
        now = int(time.time() * 1000)
        with self.machine.lock:
            state = self.state
            total = sum(state.sizes)
            doomed, keep = 0, None
            for ledger_id, first, size, max_time in state.ledgers():
                too_old = retention_ms >= 0 and max_time < now - retention_ms
                too_big = retention_bytes >= 0 and total - size >= retention_bytes
                if ledger_id >= current or not (too_old or too_big):
                    keep = first
                    break
                total -= size
                doomed += 1
            before = state.positions[keep] if keep is not None else Position(current, 0)
            batches = keep if keep is not None else len(state)
        if not doomed or not self.active:
            return 0
        submitted = self.node.submit_async(retain_record(before))
        await asyncio.wrap_future(submitted, loop=loop)          # every broker's index forgets them
        await loop.run_in_executor(None, self.node.snapshot_now)  # then the log is truncated before `before`
        log.info("%s-%d: retention removed %d ledgers (%d batches); log start offset %d", self.topic,
                 self.partition, doomed, batches, self.state.log_start_offset)
        return doomed
