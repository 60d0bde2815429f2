"""walkit.adapters.topics.compaction keeps the latest record per key of a partition (cleanup.policy=compact).

A compaction is a replicated decision: the leader rewrites the closed part of the partition
and appends swap records to the partition's own log; every broker applies them in log order,
so all agree on which batches exist and where (partition.py applies them through `apply_swap`).

    swap := 0xFF 0x00 headerLength:u32 {"compact": [FIRST, UPTO], "replaces": DIGEST} batch*

A swap replaces the batches of the offset index whose base offset lies in [FIRST, UPTO) by the
record batches it carries (none: the range becomes a gap). DIGEST is a hash of where those
batches were (their log positions and record indexes) when the leader planned the swap: a
replica applies the swap only if the index still holds exactly those batches, a
compare-and-set against retention, DeleteRecords or another leader's swap applied in between;
a swap that fails it is ignored, on every broker alike. The index then points at the swap
record (its position and its index in the entry) for each batch it carries; Fetch reads the
swap record and takes its batches (leader.py). Kept batches keep their offsets, so offsets
have gaps, as in Kafka; a fetch at a removed offset gets the next batch there is
(PartitionState.locate).

Why the partition's own log and not a new ledger swapped into the log's ledger list: the
swap record is the data and the decision at once, written atomically by the same
walkit.replicate append as every batch. A crash before it is applied leaves the old batches
indexed and the swap unreferenced; a crash between the swaps of one run leaves some ranges
compacted and others not, both valid logs (a key may then appear twice, as during Kafka's
cleaning). Nothing is ever written outside the log, so nothing leaks: unreferenced swaps and
the replaced batches are released by the log's ordinary truncation, which keeps the log from
the earliest position the index names (PartitionState.keep_from) and runs at the snapshot the
leader takes after a run. Reads stay one log reader; snapshots need nothing new (the index
they hold already names the swap records), so old snapshots restore as they are.

A run (`Compactor.run`, on the leader's event loop, from the broker's periodic task):

1. The range: the index's leading batches stored in closed ledgers (before the ledger the
   leader appends to), less the partition's last batch, which is never rewritten (the log end
   always holds a batch). A run starts when that range grew since the last run, or when a
   tombstone kept by the last run has expired (by the delete.retention.ms of now); a broker that
   has not led the partition yet runs once.
2. Pass one reads the range (through PartitionLeader.read, compressed batches decompressed) and
   keeps the offset of the latest record of each key.
3. Pass two rewrites each batch: a keyed record stays if it is its key's latest, and, if its
   value is null (a tombstone), only until `delete.retention.ms` after its timestamp. Records
   without a key stay (Kafka refuses them on compacted topics; this broker keeps them).
   Transactional batches and control batches (markers) are kept whole and do not count as a
   key's latest record, so an aborted transaction never hides a value and the aborted
   transactions' index stays right; a tombstone after a transactional record of its key stays
   past delete.retention.ms (removing it would make that kept value the latest again); this
   compacts less than Kafka, never wrongly. A batch that lost records is re-encoded with its
   codec, producer id, epoch, base sequence and leader epoch, each record at its own offset; a
   batch that lost all its records goes.
4. If any batch changed, or the range is not in log order (a run cut short, batches appended
   while a swap was written: old ledgers would stay pinned), the whole range is written as
   swaps, each at most one log record (a batch too large to fit one with a swap header stays
   where it is, and pins its ledger), awaited in order, and a snapshot is taken so the log is
   truncated behind the first batch still indexed.

Decoding and re-encoding run on a worker thread, a read (about READ_BYTES) at a time, so the
broker's event loop keeps serving; a run holds the keys of its range and the rewritten batches
(the compacted size) in memory until its swaps are appended.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import logging
import struct
import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from walkit.adapters.topics.batches import (
    COMPRESSION, CONTROL, HEADER_SIZE, LOG_OVERHEAD, TRANSACTIONAL, info, records, with_base_offset,
)
from walkit.adapters.topics.errors import KafkaError
from walkit.errors import WalkitError
from walkit.replication.batch import max_record

log = logging.getLogger("walkit.adapters.topics")

SWAP = b"\xff\x00"                 # a control record (0xFF) whose next byte no JSON control record has
_LENGTH = struct.Struct(">I")
#: Room left in a log record for a swap's prefix and header.
SWAP_OVERHEAD = 512
#: Bytes a run reads at once.
READ_BYTES = 1 << 20


def swap_record(first: int, upto: int, digest: str, kept: list[bytes]) -> bytes:
    """swap_record is the record that replaces the batches in [first, upto) by `kept` (see the module doc)."""
    header = json.dumps({"compact": [first, upto], "replaces": digest}).encode()
    return SWAP + _LENGTH.pack(len(header)) + header + b"".join(kept)


def is_swap(record: bytes) -> bool:
    """is_swap tells a swap record from the other records of a partition's log."""
    return record[:2] == SWAP


def parse_swap(record: bytes) -> tuple[int, int, str, bytes]:
    """parse_swap returns (first, upto, digest, the kept batches' bytes) of a swap record."""
    length = _LENGTH.unpack_from(record, 2)[0]
    start = 2 + _LENGTH.size
    header = json.loads(record[start:start + length])
    first, upto = header["compact"]
    return first, upto, header["replaces"], record[start + length:]


def swap_batches(record: bytes) -> list[bytes]:
    """swap_batches are the record batches a swap record carries, in offset order."""
    return split_stored(parse_swap(record)[3])


def split_stored(data: bytes) -> list[bytes]:
    """split_stored cuts concatenated stored batches into single batches."""
    out, position = [], 0
    while position < len(data):
        size = struct.unpack_from(">i", data, position + 8)[0] + LOG_OVERHEAD
        out.append(data[position:position + size])
        position += size
    return out


def digest(keys) -> str:
    """digest is the hash of a run of index entries' (position, record index) that a swap replaces."""
    text = ",".join(f"{p.ledger_id}:{p.entry_id}:{sub}" for p, sub in keys)
    return hashlib.sha1(text.encode()).hexdigest()


def apply_swap(state, record: bytes, position, sub: int) -> bool:
    """apply_swap applies a swap record stored at (`position`, `sub`) to a PartitionState; False if it
    no longer matches the index (the compare-and-set of the module doc), which then stays as it was.

    The running maximum of timestamps after the range keeps the removed records' (an upper bound,
    still non-decreasing: ListOffsets by time reads on from the batch it finds, so stays exact).
    """
    first, upto, expected, data = parse_swap(record)
    lo, hi = bisect.bisect_left(state.bases, first), bisect.bisect_left(state.bases, upto)
    if lo == hi or digest(zip(state.positions[lo:hi], state.subs[lo:hi])) != expected:
        log.info("a compaction of offsets [%d, %d) at %s no longer matches the index; ignored", first, upto, position)
        return False
    heads = [info(batch) for batch in split_stored(data)]
    assert all(first <= h.base_offset and h.next_offset <= upto for h in heads), "a swap keeps its range"
    previous = state.max_times[lo - 1] if lo else -1
    times = []
    for head in heads:
        previous = max(previous, head.max_timestamp)
        times.append(previous)
    state.bases[lo:hi] = [h.base_offset for h in heads]
    state.nexts[lo:hi] = [h.next_offset for h in heads]
    state.positions[lo:hi] = [position] * len(heads)
    state.subs[lo:hi] = [sub] * len(heads)
    state.sizes[lo:hi] = [h.size for h in heads]
    state.max_times[lo:hi] = times
    return True


def rewrite(batch: bytes, keep) -> bytes | None:
    """rewrite is `batch` with only the records `keep(record)` accepts: the batch itself if all stay,
    None if none does, else a new batch with the same codec, producer fields and leader epoch."""
    head = info(batch)
    kept = [r for r in records(batch) if keep(r)]
    if len(kept) == head.records:
        return batch
    if not kept:
        return None
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=head.attributes & COMPRESSION,
                                        is_transactional=False, producer_id=head.producer_id,
                                        producer_epoch=head.producer_epoch, base_sequence=head.base_sequence,
                                        batch_size=1 << 30)
    for r in kept:
        builder.append(r.offset - head.base_offset, r.timestamp, r.key, r.value, r.headers)
    epoch = struct.unpack_from(">i", batch, 12)[0]
    return with_base_offset(bytes(builder.build()), head.base_offset, epoch)


def untouchable(batch: bytes) -> bool:
    """untouchable tells a batch compaction keeps whole: transactional batches and control batches (markers)."""
    return bool(info(batch[:HEADER_SIZE]).attributes & (TRANSACTIONAL | CONTROL))


class RangeChanged(Exception):
    """RangeChanged is a run's range that changed while it read it (retention, DeleteRecords): the next run
    plans anew."""


class Compactor:
    """Compactor compacts one partition while this broker leads it (see the module doc)."""

    def __init__(self, leader) -> None:
        self.leader = leader
        self.running = False
        self.checked_upto = -1          # the end of the range the last run finished (-1: none yet)
        self.tombstone: int | None = None  # the timestamp of the oldest tombstone the last run kept (ms)

    async def run(self, delete_retention_ms: int, now_ms: int | None = None) -> int:
        """run compacts the closed part of the partition if due; it returns the swaps appended (a swap that no
        longer matches the index is appended, and ignored by every broker)."""
        leader = self.leader
        if self.running or not leader.active:
            return 0
        self.running = True
        try:
            return await self._run(delete_retention_ms, int(time.time() * 1000) if now_ms is None else now_ms)
        except (WalkitError, KafkaError, RangeChanged) as exc:
            log.warning("%s-%d: compaction failed: %s: %s", leader.topic, leader.partition, type(exc).__name__, exc)
            return 0
        finally:
            self.running = False

    def _plan(self) -> tuple[list[int], list[int], list, int] | None:
        """_plan is the range to compact: its batches' base offsets, next offsets and index keys, and the
        log start offset (a DeleteRecords may have moved it inside the first batch)."""
        leader = self.leader
        current = leader.node.ledger_id
        if current is None:
            return None
        with leader.machine.lock:
            state = leader.machine.state
            end = 0
            while end < len(state) - 1 and state.positions[end].ledger_id < current:
                end += 1
            planned = state.bases[:end], state.nexts[:end], list(zip(state.positions[:end], state.subs[:end]))
            return planned + (state.log_start_offset,)

    async def _reads(self, bases: list[int], upto: int, start: int):
        """_reads yields the stored batches of the range, a read (about READ_BYTES) at a time, checking they
        are the planned ones; the first read asks for `start`, the log start offset if inside the first."""
        offset, expected = max(bases[0], start), iter(bases)
        while offset < upto:
            data = await self.leader.read(offset, READ_BYTES)
            if not data:
                raise RangeChanged(f"the range ended at {offset} before {upto}")
            found, ended = [], False
            for batch in split_stored(data):
                head = info(batch)
                if head.base_offset >= upto:
                    ended = True
                    break
                if head.base_offset != next(expected, None):
                    raise RangeChanged(f"the index changed at offset {head.base_offset} during compaction")
                found.append(batch)
                offset = head.next_offset
            yield found
            if ended:
                return

    async def _run(self, delete_retention_ms: int, now: int) -> int:
        planned = self._plan()
        if not planned or not planned[0]:
            return 0
        bases, nexts, keys, start = planned
        upto = nexts[-1]
        if upto <= self.checked_upto and (self.tombstone is None or now < self.tombstone + delete_retention_ms):
            return 0
        latest: dict[bytes, int] = {}
        held: dict[bytes, int] = {}          # key -> first offset of it in a transactional batch (kept whole)
        loop = self.leader.loop

        def scan(read: list[bytes]) -> None:
            for batch in read:
                if not untouchable(batch):
                    latest.update((r.key, r.offset) for r in records(batch) if r.key is not None)
                elif not info(batch[:HEADER_SIZE]).attributes & CONTROL:
                    for r in records(batch):
                        if r.key is not None:
                            held.setdefault(r.key, r.offset)
        async for read in self._reads(bases, upto, start):          # decoding runs off the event loop
            await loop.run_in_executor(None, scan, read)
        tombstones: list[int] = []

        def keep(r) -> bool:
            if r.key is None:
                return True
            if latest.get(r.key) != r.offset:
                return False
            if r.value is None:
                if held.get(r.key, r.offset) < r.offset:
                    return True              # stays while the transactional value before it does
                if r.timestamp + delete_retention_ms <= now:
                    return False
                tombstones.append(r.timestamp)
            return True
        budget = max_record(self.leader.client.max_entry_bytes) - SWAP_OVERHEAD
        # a range out of log order (a run cut short, batches appended during a swap) is rewritten even if
        # nothing goes, so the ledgers it still pins are released
        changed = any(later < earlier for earlier, later in zip(keys, keys[1:]))
        swaps, chunk, chunk_keys, size, index = [], [], [], 0, 0
        chunk_first = None

        def close(chunk_upto: int) -> None:
            if chunk_keys:
                swaps.append(swap_record(chunk_first, chunk_upto, digest(chunk_keys), list(chunk)))
            chunk.clear()
            chunk_keys.clear()
        def rewrite_all(read: list[bytes]) -> list[bytes | None]:
            return [batch if untouchable(batch) else rewrite(batch, keep) for batch in read]
        async for read in self._reads(bases, upto, start):
            outs = await loop.run_in_executor(None, rewrite_all, read)
            for batch, out in zip(read, outs):
                head = info(batch)
                changed = changed or out is not batch
                if out is not None and len(out) > budget:           # stays where it is
                    close(head.base_offset)
                    chunk_first, size = None, 0
                else:
                    if chunk_keys and size + (len(out) if out else 0) > budget:
                        close(head.base_offset)
                        size = 0
                    if not chunk_keys:
                        chunk_first = head.base_offset
                    chunk_keys.append(keys[index])
                    if out is not None:
                        chunk.append(out)
                        size += len(out)
                index += 1
        close(upto)
        applied = await self._swap(swaps) if changed else 0
        if applied < len(swaps) and changed:
            return applied                          # the leadership ended: the next run starts over
        self.checked_upto, self.tombstone = upto, min(tombstones, default=None)     # done: due again when
        if not changed:                                                            # it grows or one expires
            return 0
        log.info("%s-%d: compaction rewrote offsets [%d, %d) (%d batches) into %d swaps, %d applied",
                 self.leader.topic, self.leader.partition, bases[0], upto, len(bases), len(swaps), applied)
        return applied

    async def _swap(self, swaps: list[bytes]) -> int:
        """_swap appends the swaps in order, then snapshots so the log is truncated behind what is still read."""
        leader, applied = self.leader, 0
        for record in swaps:
            if not leader.active:
                break
            await asyncio.wrap_future(leader.node.submit_async(record), loop=leader.loop)
            applied += 1
        if applied:
            await leader.loop.run_in_executor(None, leader.node.snapshot_now)
        return applied
