"""walkit.adapters.topics.leader serves one partition this broker leads: produce, fetch, retention.

Produce: the batches of a request are checked (batches.py), judged against the idempotent
producers' state (producers.py), numbered from the next free offset and submitted to the
partition's log at once, in request order; each is answered once applied (replica.py). The
producer check runs against a projection that already includes batches still in flight, so
a retry that arrives while its original is pending waits for the original's answer instead of
being appended twice.

Fetch: the recently applied batches stay in memory (up to `cache_bytes`), so consumers at the
tail are served without touching the bookies; older offsets are read from the log, starting
at the Position the offset index names. Long polls wait on `wait_for_data`.

Retention (`retention.ms`, `retention.bytes`): whole ledgers before the current one are
truncated from the log when all their records are older than retention.ms, or while the
partition would still hold retention.bytes without them; the log start offset moves to the
first remaining batch.
"""

from __future__ import annotations

import asyncio
import logging
import time

from walkit import Position
from walkit.errors import LogTruncated, WalkitError
from walkit.adapters.topics import errors
from walkit.adapters.topics.batches import first_offset_at, info, with_base_offset
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.partition import PartitionState
from walkit.adapters.topics.producers import DUPLICATE
from walkit.adapters.topics.replica import LeaderLog

log = logging.getLogger("walkit.adapters.topics")


class PartitionLeader:
    """PartitionLeader is a partition led by this broker; everything runs on the event loop."""

    def __init__(self, loop, client, topic: str, partition: int, log_name: str, writer, state: PartitionState,
                 cache: list[bytes], *, cache_bytes: int, on_lost, password: bytes = b"",
                 snapshot_every: int = 0, take_snapshot=None) -> None:
        self.loop = loop
        self.client = client
        self.topic = topic
        self.partition = partition
        self.log_name = log_name
        self.password = password
        self.state = state
        self.replica = LeaderLog(loop, f"{topic}-{partition}", writer, state, on_lost, self._applied)
        self.projected = state.producers.copy()
        self.assigned = state.next_offset
        self.cache_bytes = cache_bytes
        self.cache: list[bytes] = list(cache)       # the last len(cache) applied batches, in order
        self._cached = sum(len(b) for b in self.cache)
        self._waiters: list[asyncio.Future] = []
        self._in_flight: dict[tuple[int, int, int], asyncio.Future] = {}
        self.retention_running = False
        self.topic_id: str | None = None          # the topic's id when this leadership began
        self.snapshot_every = snapshot_every
        self._take_snapshot = take_snapshot       # blocking (log name, PartitionState copy) -> None
        self._since_snapshot = 0
        self._snapshotting = False

    @property
    def active(self) -> bool:
        """active tells whether this broker still leads the partition."""
        return self.replica.active

    @property
    def high_watermark(self) -> int:
        """high_watermark is the offset after the last acknowledged (and applied) batch."""
        return self.state.next_offset

    # -- produce ------------------------------------------------------------------------
    def append(self, batch: bytes) -> asyncio.Future:
        """append numbers and appends one checked batch; the Future resolves to its base offset.

        Raises KafkaError for a sequence or epoch the producer state refuses, and
        NOT_LEADER_OR_FOLLOWER once the leadership is gone.
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
        stored = with_base_offset(batch, self.assigned)
        placed = info(stored)
        future = self.replica.submit(stored)
        self.assigned = placed.next_offset
        self.projected.record(placed)
        result = self.loop.create_future()
        if head.idempotent:
            self._in_flight[key] = result

        def finish(applied: asyncio.Future) -> None:
            self._in_flight.pop(key, None)
            if result.done():
                return
            if applied.exception() is not None:
                result.set_exception(applied.exception())
            else:
                result.set_result(placed.base_offset)
        future.add_done_callback(finish)
        return result

    def _applied(self, record: bytes, head) -> None:
        if head is None:
            return
        self.cache.append(record)
        self._cached += len(record)
        self._trim_cache()
        self._since_snapshot += 1
        if self.snapshot_every and self._since_snapshot >= self.snapshot_every and not self._snapshotting \
                and self._take_snapshot is not None:
            self._snapshotting, self._since_snapshot = True, 0
            self.loop.create_task(self._snapshot(self.state.copy()))
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _trim_cache(self) -> None:
        """_trim_cache drops the oldest cached batches beyond cache_bytes, and those retention removed."""
        cache = self.cache
        drop = max(len(cache) - len(self.state), 0)
        size = self._cached - sum(len(b) for b in cache[:drop])
        while drop < len(cache) - 1 and size > self.cache_bytes:
            size -= len(cache[drop])
            drop += 1
        if drop:
            del cache[:drop]
            self._cached = size

    async def _snapshot(self, copy: PartitionState) -> None:
        """_snapshot writes and publishes a copy of the state (snapshots.py) on a worker thread."""
        try:
            await self.loop.run_in_executor(None, self._take_snapshot, self.log_name, copy)
        except Exception as exc:  # noqa: BLE001 - retried after the next snapshot_every batches
            log.warning("%s-%d: snapshot failed: %s: %s", self.topic, self.partition, type(exc).__name__, exc)
        finally:
            self._snapshotting = False

    def wait_for_data(self) -> asyncio.Future:
        """wait_for_data resolves when the next batch is applied or the leadership ends."""
        waiter = self.loop.create_future()
        if not self.active:
            waiter.set_result(None)
            return waiter
        if len(self._waiters) >= 64:               # long polls that timed out on an idle partition
            self._waiters = [w for w in self._waiters if not w.done()]
        self._waiters.append(waiter)
        return waiter

    def lost(self) -> None:
        """lost wakes every waiter (the owner calls it once the leadership ended)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- fetch ------------------------------------------------------------------------------
    async def read(self, offset: int, max_bytes: int) -> bytes:
        """read returns whole batches from the one holding `offset`, about `max_bytes` (at least one).

        Raises KafkaError(OFFSET_OUT_OF_RANGE) for an offset before the log start or after the
        high watermark; at the high watermark it returns nothing.
        """
        state = self.state
        if offset == state.next_offset:
            return b""
        index = state.locate(offset)
        if index is None:
            raise KafkaError(errors.OFFSET_OUT_OF_RANGE,
                             f"offset {offset} is outside [{state.log_start_offset}, {state.next_offset}]")
        cache_start = len(state) - len(self.cache)
        if index >= cache_start:
            return self._from_cache(index - cache_start, max_bytes)
        stop = state.positions[cache_start] if cache_start < len(state) else None
        start = state.positions[index]
        try:
            head = await self.loop.run_in_executor(None, self._read_log, start, stop, max_bytes)
        except LogTruncated:
            raise KafkaError(errors.OFFSET_OUT_OF_RANGE, f"offset {offset} was removed by retention") from None
        except WalkitError as exc:
            raise KafkaError(errors.KAFKA_STORAGE_ERROR, f"reading offset {offset}: {exc}") from None
        if len(head) < max_bytes and stop is not None and len(state) > len(self.cache):
            # The log reader stopped where the cache begins: continue from memory.
            if state.positions[len(state) - len(self.cache)] == stop:
                head += self._from_cache(0, max_bytes - len(head), at_least_one=not head)
        return head

    def _from_cache(self, first: int, max_bytes: int, at_least_one: bool = True) -> bytes:
        parts, size = [], 0
        for batch in self.cache[first:]:
            if (parts or not at_least_one) and size + len(batch) > max_bytes:
                break
            parts.append(batch)
            size += len(batch)
        return b"".join(parts)

    def _read_log(self, start: Position, stop: Position | None, max_bytes: int) -> bytes:
        """_read_log reads whole batches from the log at `start` up to `stop` or max_bytes (worker thread)."""
        parts, size = [], 0
        for record in self.client.read_log(self.log_name, start=start, follow=False, password=self.password):
            if stop is not None and record.position >= stop:
                break
            if parts and size + len(record.payload) > max_bytes:
                break
            parts.append(record.payload)
            size += len(record.payload)
            if size >= max_bytes:
                break
        return b"".join(parts)

    # -- list offsets --------------------------------------------------------------------
    async def offset_for_time(self, timestamp: int) -> tuple[int, int]:
        """offset_for_time returns (offset, timestamp) of the first record stamped >= timestamp, or (-1, -1)."""
        state = self.state
        index = state.locate_time(timestamp)
        while index is not None and index < len(state):
            batch = await self.read(state.bases[index], 1)
            found = first_offset_at(batch[:info(batch).size], timestamp) if batch else None
            if found is not None:
                return found
            index += 1
        return -1, -1

    async def max_timestamp(self) -> tuple[int, int]:
        """max_timestamp returns (offset, timestamp) of the record with the largest timestamp, or (-1, -1)."""
        index = self.state.max_timestamp_index()
        if index is None:
            return -1, -1
        stamp = self.state.max_times[index]
        found = await self.offset_for_time(stamp)
        return found if found[0] >= 0 else (self.state.bases[index], stamp)

    # -- retention ---------------------------------------------------------------------------
    async def enforce_retention(self, retention_ms: int, retention_bytes: int) -> int:
        """enforce_retention truncates expired whole ledgers (never the current one); it returns how many."""
        if self.retention_running or not self.active or (retention_ms < 0 and retention_bytes < 0):
            return 0
        state = self.state
        current = self.replica.writer.ledger_id
        now = int(time.time() * 1000)
        total = sum(state.sizes)
        doomed, keep = 0, None
        for ledger_id, first, size, max_time in state.ledgers():
            if ledger_id == current:
                keep = first
                break
            too_old = retention_ms >= 0 and max_time < now - retention_ms
            too_big = retention_bytes >= 0 and total - size >= retention_bytes
            if not (too_old or too_big):
                keep = first
                break
            total -= size
            doomed += 1
        if not doomed:
            return 0
        before = state.positions[keep] if keep is not None else Position(current, 0)
        self.retention_running = True
        try:
            await self.loop.run_in_executor(None, self.replica.writer.truncate, before)
        except WalkitError as exc:
            log.warning("%s-%d: retention could not truncate the log: %s: %s", self.topic, self.partition,
                        type(exc).__name__, exc)
            return 0
        finally:
            self.retention_running = False
        dropped = state.truncate_before(before)
        self._trim_cache()
        log.info("%s-%d: retention removed %d ledgers (%d batches); log start offset %d", self.topic,
                 self.partition, doomed, dropped, state.log_start_offset)
        return doomed
