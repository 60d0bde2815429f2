"""walkit.adapters.topics.txncoordinator runs Kafka's transaction coordinator and writes this broker's markers.

The coordinator of a transactional id is the leader of its group bucket (transactions.py says
why the buckets). Every change of an id's state is a TxnMeta written whole to the bucket's
log and applied before the request is answered, so the next leader holds it:

- InitProducerId keeps the id's producer id and bumps its epoch (a new one at the first
  call, and when the epoch is exhausted), fencing any older producer of the id (KIP-98); an
  open transaction is aborted first, its markers written with the new epoch, so the fenced
  producer's batches are refused by every partition it wrote to (INVALID_PRODUCER_EPOCH);
  one open at MAX_EPOCH is aborted at that epoch and the new producer gets a new producer id,
  never the fenced one's (producer id, epoch);
- AddPartitionsToTxn and AddOffsetsToTxn (a group's bucket as a partition) open a
  transaction (the next `number`) or add to it;
- EndTxn writes PrepareCommit or PrepareAbort, waits up to END_WAIT_S for the markers and
  answers; CompleteX is written once every partition holds its marker;
- a transaction open longer than its timeout is aborted, with the epoch bumped so its
  producer is fenced (Kafka's transaction.timeout.ms); an idle id untouched for
  `expiration_ms` is removed (transactional.id.expiration.ms): both decided by the leader's
  clock against the `ms` inside the records, and written as records.

A request with another producer id than the id's is INVALID_PRODUCER_ID_MAPPING; with
another epoch, PRODUCER_FENCED (the handlers answer INVALID_PRODUCER_EPOCH to versions
before KIP-588); during PrepareX, CONCURRENT_TRANSACTIONS (the client retries). Requests for
one id run one at a time (`_lock`).

Markers (`write_markers`, every broker, on each bucket's transaction record and each tick):
for every prepared transaction in any bucket (every broker applies every bucket), the slots
of it this broker leads get their marker unless their state shows it (partition.py markers,
TxnBook.marked). A bucket's new leader finds its prepared transactions at the next tick and
completes them: a coordinator killed between PrepareCommit and the markers loses nothing.

Orphans (`abort_orphans`, every ORPHAN_CHECK_S): a transaction open in a partition that no
transactional id claims (Ongoing or prepared with that partition) for ORPHAN_S, longer than
any transaction may last, is aborted by the partition's leader with a marker of number -1. As
in Kafka before KIP-890, a transactional batch is not checked against its transaction's
partitions; without this, a client that wrote to a partition it never added would hold that
partition's last stable offset, and every read_committed consumer of it, for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.ownership import Slot
from walkit.adapters.topics.transactions import (
    EMPTY, IDLE, MAX_EPOCH, ONGOING, OUTCOME, PREPARED, TxnMeta, group_marker_record, txn_record,
)

log = logging.getLogger("walkit.adapters.topics")

#: Kafka's transaction.max.timeout.ms: the longest transaction timeout a producer may ask for.
MAX_TIMEOUT_MS = 900_000
#: Kafka's transactional.id.expiration.ms: an idle transactional id is removed after this.
EXPIRATION_MS = 7 * 24 * 3600 * 1000
#: Longest an EndTxn waits for its markers before it is answered (the outcome is durable by then).
END_WAIT_S = 20.0
#: How often a completion looks at its partitions' markers again.
POLL_S = 0.02
#: How long a partition's open transaction may be claimed by no transactional id before its leader aborts it.
ORPHAN_S = MAX_TIMEOUT_MS / 1000 + 60
#: How often the leaders look for such transactions.
ORPHAN_CHECK_S = 5.0


def now_ms() -> int:
    """now_ms is the coordinator's clock, in the records' unit."""
    return int(time.time() * 1000)


class TransactionCoordinator:
    """TransactionCoordinator serves the transactional ids of the buckets this broker leads (see the module doc)."""

    def __init__(self, broker, *, expiration_ms: int = EXPIRATION_MS) -> None:
        self.broker = broker
        self.loop = broker.loop
        self.expiration_ms = expiration_ms
        self._locks: dict[str, asyncio.Lock] = {}
        self._completing: dict[str, asyncio.Task] = {}
        self._busy: set[str] = set()                   # ids a timeout or expiry is being written for
        self._writing: set[tuple] = set()              # (slot, pid, number) markers in flight here
        self.orphan_after_s = ORPHAN_S
        self._orphans: dict[tuple[Slot, int], float] = {}    # (slot, pid) -> when first seen unclaimed
        self._orphans_checked = 0.0

    # -- state -------------------------------------------------------------------------------------
    def _bucket(self, txn_id: str):
        if not isinstance(txn_id, str) or not txn_id:
            raise KafkaError(errors.INVALID_REQUEST, "a transactional id is a non-empty string")
        return self.broker.bucket_for(txn_id)

    def _lock(self, txn_id: str) -> asyncio.Lock:
        return self._locks.setdefault(txn_id, asyncio.Lock())

    @staticmethod
    def _meta(bucket, txn_id: str) -> TxnMeta | None:
        return bucket.state.txns.transactions.get(txn_id)

    async def _write(self, bucket, txn_id: str, meta: TxnMeta | None) -> None:
        await bucket.commit(txn_record(txn_id, meta))

    def _check(self, meta: TxnMeta | None, pid: int, epoch: int) -> None:
        """_check raises the error of a request from producer (pid, epoch) for an id in state `meta`."""
        if meta is None or meta.pid != pid:
            raise KafkaError(errors.INVALID_PRODUCER_ID_MAPPING, f"producer id {pid} is not the transactional id's")
        if epoch != meta.epoch:
            raise KafkaError(errors.PRODUCER_FENCED, f"producer epoch {epoch}, the id is at {meta.epoch}")

    def check_fenced(self, txn_id, pid: int, epoch: int) -> None:
        """check_fenced raises PRODUCER_FENCED when this broker's copy of the id's state (every broker applies
        every bucket) shows producer `pid` at a newer epoch: a TxnOffsetCommit of a zombie. A copy that lags
        proves nothing and passes; the bucket then ignores the offsets by their epoch (transactions.py)."""
        if not isinstance(txn_id, str) or not txn_id:
            raise KafkaError(errors.INVALID_REQUEST, "a transactional id is a non-empty string")
        bucket = self.broker.buckets.get(self.broker.bucket_of(txn_id))
        meta = self._meta(bucket, txn_id) if bucket is not None else None
        if meta is not None and meta.pid == pid and epoch < meta.epoch:
            raise KafkaError(errors.PRODUCER_FENCED, f"producer epoch {epoch}, the id is at {meta.epoch}")

    # -- requests ------------------------------------------------------------------------------------
    async def init_producer_id(self, txn_id: str, timeout_ms: int, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
        """init_producer_id returns (producer id, epoch) for a new producer of `txn_id`, fencing the older ones."""
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise KafkaError(errors.INVALID_TRANSACTION_TIMEOUT, f"transaction timeout {timeout_ms} ms "
                                                                 f"(1 to {MAX_TIMEOUT_MS})")
        bucket = self._bucket(txn_id)
        async with self._lock(txn_id):
            meta = await self._settled(bucket, txn_id)
            if pid >= 0 and (meta is None or (pid, epoch) != (meta.pid, meta.epoch)):
                raise KafkaError(errors.PRODUCER_FENCED, f"producer {pid} epoch {epoch} is not the id's current one")
            bump = 1
            if meta is not None and meta.state == ONGOING:    # aborted with the epoch bumped: the new producer's
                fenced = meta.epoch                           # (at MAX_EPOCH it cannot be: a new producer id)
                meta = await self._abort(bucket, txn_id, meta, "a new producer of its transactional id")
                bump = 0 if meta is not None and meta.epoch > fenced else 1
            if meta is None or meta.epoch + bump > MAX_EPOCH:
                new_pid = await self.loop.run_in_executor(None, self.broker.catalog.new_producer_id)
                meta = TxnMeta(new_pid, 0, EMPTY, timeout_ms, number=meta.number if meta else 0, ms=now_ms())
            else:
                meta = replace(meta, epoch=meta.epoch + bump, state=EMPTY, partitions=(), timeout_ms=timeout_ms,
                               ms=now_ms())
            await self._write(bucket, txn_id, meta)
            log.info("transactional id %r: producer %d epoch %d", txn_id, meta.pid, meta.epoch)
            return meta.pid, meta.epoch

    async def add_partitions(self, txn_id: str, pid: int, epoch: int, partitions: list[tuple[str | None, int]]) -> None:
        """add_partitions adds partitions (topic None: a group bucket) to the id's open transaction, or opens one."""
        bucket = self._bucket(txn_id)
        async with self._lock(txn_id):
            meta = self._meta(bucket, txn_id)
            self._check(meta, pid, epoch)
            if meta.state in PREPARED:
                raise KafkaError(errors.CONCURRENT_TRANSACTIONS, "the last transaction is still completing")
            if meta.state == ONGOING and set(partitions) <= set(meta.partitions):
                return
            await self._write(bucket, txn_id, meta.begun(partitions, now_ms()))

    async def end_txn(self, txn_id: str, pid: int, epoch: int, committed: bool) -> None:
        """end_txn commits or aborts the id's open transaction (a retry of the same outcome is answered again)."""
        bucket = self._bucket(txn_id)
        prepared, completed = OUTCOME[committed]
        async with self._lock(txn_id):
            meta = self._meta(bucket, txn_id)
            self._check(meta, pid, epoch)
            if meta.state == ONGOING:
                meta = replace(meta, state=prepared, ms=now_ms())
                await self._write(bucket, txn_id, meta)
            elif meta.state not in (prepared, completed):
                raise KafkaError(errors.INVALID_TXN_STATE, f"EndTxn({'commit' if committed else 'abort'}) "
                                                           f"in state {meta.state}")
            done = self._complete(bucket, txn_id)
        await asyncio.wait([done], timeout=END_WAIT_S)

    # -- completion ------------------------------------------------------------------------------------
    async def _settled(self, bucket, txn_id: str) -> TxnMeta | None:
        """_settled is the id's state once a prepared transaction of it completed (CONCURRENT_TRANSACTIONS if slow)."""
        meta = self._meta(bucket, txn_id)
        if meta is not None and meta.state in PREPARED:
            await asyncio.wait([self._complete(bucket, txn_id)], timeout=END_WAIT_S)
            meta = self._meta(bucket, txn_id)
            if meta is not None and meta.state in PREPARED:
                raise KafkaError(errors.CONCURRENT_TRANSACTIONS, "its last transaction is still completing")
        return meta

    async def _abort(self, bucket, txn_id: str, meta: TxnMeta, reason: str) -> TxnMeta:
        """_abort aborts the open transaction with the epoch bumped (fencing its producer) and waits for it."""
        log.info("transactional id %r: aborting transaction %d: %s", txn_id, meta.number, reason)
        await self._write(bucket, txn_id, replace(meta, epoch=min(meta.epoch + 1, MAX_EPOCH), state=OUTCOME[False][0],
                                                  ms=now_ms()))
        return await self._settled(bucket, txn_id)

    def _complete(self, bucket, txn_id: str) -> asyncio.Task:
        """_complete is the task that writes CompleteX once the id's prepared transaction is marked everywhere."""
        task = self._completing.get(txn_id)
        if task is None or task.done():
            task = self._completing[txn_id] = self.loop.create_task(self._completion(bucket, txn_id))
            task.add_done_callback(lambda done: self._completing.pop(txn_id, None)
                                   if self._completing.get(txn_id) is done else None)
        return task

    async def _completion(self, bucket, txn_id: str) -> None:
        while bucket.active:
            meta = self._meta(bucket, txn_id)
            if meta is None or meta.state not in PREPARED:
                return
            if all(self._marked(Slot(*slot), meta) for slot in meta.partitions):
                try:
                    await self._write(bucket, txn_id, replace(meta, state=OUTCOME[meta.committed][1], ms=now_ms()))
                except KafkaError as exc:
                    log.info("transactional id %r: completing failed (%s); the next leader completes it", txn_id, exc)
                return
            self.write_markers()
            await asyncio.sleep(POLL_S)

    def _marked(self, slot: Slot, meta: TxnMeta) -> bool:
        """_marked tells whether `slot` holds the marker of the id's transaction (a deleted topic's need none)."""
        if slot.topic is None:
            bucket = self.broker.buckets.get(slot.partition)
            return bucket is not None and bucket.state.txns.marked.get(meta.pid) == meta.number
        topic = self.broker.view.topics.get(slot.topic)
        if topic is None or slot.partition >= topic.partitions:
            return True
        served = self.broker._slot(slot)
        if served is None:
            return False
        with served.machine.lock:
            marker = served.state.markers.get(meta.pid)
        return marker is not None and marker[0] == meta.number

    def write_markers(self) -> None:
        """write_markers appends the missing markers of prepared transactions to the slots this broker leads."""
        for bucket in list(self.broker.buckets.values()):
            for meta in bucket.state.txns.prepared.values():
                for slot in meta.partitions:
                    self._mark(Slot(*slot), meta)

    def _mark(self, slot: Slot, meta: TxnMeta) -> None:
        key = (slot, meta.pid, meta.number)
        if key in self._writing or self._marked(slot, meta):
            return
        served = self.broker._serving(slot)
        if served is None:
            return
        try:
            if slot.topic is None:
                written = served.commit(group_marker_record(meta.pid, meta.number, meta.committed, meta.epoch))
            else:
                written = served.write_marker(meta.pid, meta.epoch, meta.committed, meta.number, meta.ms)
        except KafkaError:
            return                                          # no longer leading it: the next leader writes it
        self._track(key, written)

    def _track(self, key: tuple, written: asyncio.Future) -> None:
        """_track keeps a marker in `_writing` until its append is applied (or failed)."""
        self._writing.add(key)
        written.add_done_callback(lambda done: (self._writing.discard(key), done.cancelled() or done.exception()))

    # -- time ----------------------------------------------------------------------------------------
    def tick(self) -> None:
        """tick (periodic) writes missing markers, resumes the prepared transactions of the buckets this broker
        leads, aborts timed-out transactions and removes expired ids."""
        self.write_markers()
        if time.monotonic() - self._orphans_checked >= ORPHAN_CHECK_S:
            self._orphans_checked = time.monotonic()
            self.abort_orphans()
        now = now_ms()
        for bucket in list(self.broker.buckets.values()):
            if not bucket.active:
                continue
            for txn_id, meta in bucket.state.txns.transactions.items():
                if meta.state in PREPARED:
                    self._complete(bucket, txn_id)
                elif txn_id in self._busy:
                    continue
                elif meta.state == ONGOING and now > meta.started_ms + meta.timeout_ms:
                    self._spawn(txn_id, self._time_out(bucket, txn_id, meta))
                elif meta.state in IDLE and now > meta.ms + self.expiration_ms:
                    self._spawn(txn_id, self._expire(bucket, txn_id, meta))

    def _spawn(self, txn_id: str, work) -> None:
        self._busy.add(txn_id)
        self.loop.create_task(work).add_done_callback(lambda _done: self._busy.discard(txn_id))

    async def _time_out(self, bucket, txn_id: str, meta: TxnMeta) -> None:
        async with self._lock(txn_id):
            if self._meta(bucket, txn_id) == meta:
                try:
                    await self._abort(bucket, txn_id, meta, f"open longer than its timeout of {meta.timeout_ms} ms")
                except KafkaError as exc:
                    log.info("transactional id %r: timing out failed (%s); retried", txn_id, exc)

    async def _expire(self, bucket, txn_id: str, meta: TxnMeta) -> None:
        async with self._lock(txn_id):
            if self._meta(bucket, txn_id) == meta:
                try:
                    await self._write(bucket, txn_id, None)
                except KafkaError as exc:
                    log.info("transactional id %r: expiring failed (%s); retried", txn_id, exc)
                    return
                log.info("transactional id %r expired (idle %d ms)", txn_id, self.expiration_ms)
        self._locks.pop(txn_id, None)

    def abort_orphans(self) -> None:
        """abort_orphans aborts, in the partitions this broker leads, open transactions that no transactional
        id has claimed (Ongoing or prepared with the partition) for `orphan_after_s`: a batch sent to a
        partition its transaction never added would otherwise hold the last stable offset for good."""
        now = time.monotonic()
        open_here = []
        for (topic, index), served in list(self.broker.partitions.items()):
            slot = Slot(topic, index)
            if self.broker._serving(slot) is served:
                with served.machine.lock:
                    open_here += [(slot, served, pid, served.state.producers.entries[pid].epoch)
                                  for pid in served.state.ongoing]
        if not open_here:
            self._orphans.clear()
            return
        claimed = {(Slot(*slot), meta.pid) for bucket in list(self.broker.buckets.values())
                   for meta in bucket.state.txns.transactions.values() if meta.state not in IDLE
                   for slot in meta.partitions}
        seen = {}
        for slot, served, pid, epoch in open_here:
            if (slot, pid) in claimed:
                continue
            since = seen[(slot, pid)] = self._orphans.get((slot, pid), now)
            if now - since >= self.orphan_after_s and (slot, pid, -1) not in self._writing:
                log.warning("%s: aborting producer %d's transaction, claimed by no transactional id for %.0f s",
                            slot.label, pid, now - since)
                try:
                    self._track((slot, pid, -1), served.write_marker(pid, epoch, False, -1, now_ms()))
                except KafkaError:
                    continue
        self._orphans = seen
