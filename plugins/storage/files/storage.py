"""walkit.plugins.storage.files.storage is the ``files:///dir`` EntryStorage: journal, entry logs, index.

The directory holds::

    LOCK                 flock'ed while open: one storage per directory
    checkpoint           where recovery starts (checkpoint.py)
    logs/*.log           entry logs, which are the write-ahead journal (entrylog.py, journal.py)
    index/*.idx          one index file per ledger (index.py)

Writes. `put`, `set_ledger_state`, `delete_ledger` and `delete_entries` encode a journal record
into the group buffer and update the in-memory view (pending entries, per-ledger summary).
`sync()` appends the buffer to the active entry log with one ``os.fdatasync`` (the group commit), and only then
writes each entry's slot, pointing into that log, to its ledger's index file without fsync. The
entry logs are the journal: every byte is written to disk once, and everything the indexes say
is already durable in the logs. A put past `write_buffer_mb` (or 65,536 unsynced entries)
syncs early, and a put that would take the buffer past `write_buffer_mb` syncs what was
buffered first: a group is at most `write_buffer_mb` or one `put_many` batch, whichever is
larger (plus the small state and delete records put between them), which is what replay's
torn-tail limit (twice `write_buffer_mb`) relies on.

Deleting entries (`delete_entries(ledger, before)`, for unbounded ledgers: issue 39). A TRIM
record is buffered; the ledger's summary takes `before` as its first entry at once, so reads
below it find nothing and later puts below it store nothing (a trim stays, and the journal
never holds a PUT below a TRIM of its ledger that came before it). Each log's accounting then
drops the ledger where all of its entries in that log lie below `before` (entrylog.py), so
the next `compact()` finds those logs dead or sparse and reclaims them as it does for deleted
ledgers, after a sync made the TRIM durable. Once the TRIM is synced its index slots below
`before` are punched out of the index file (disk.py `punch_hole`; where the file system
cannot, they stay, unread). Replay applies a TRIM as a sync did: the summary, the accounting,
the slots; applying it again changes nothing, and no slot below the first entry is ever read.

Checkpoints. On `compact()` when an entry log can be reclaimed, on `checkpoint()` and on
`close()`: reclaim entry logs of deleted ledgers (copying the live entries of mostly dead logs
forward through the journal), fsync the index files and their directory, and atomically write
a checkpoint naming the end of the active log as the replay position, plus every ledger's
summary and every live log. Reclaimed logs are then deleted. Every `journal_max_mb` written
since the last checkpoint, or `checkpoint_s` seconds (checked at `sync()`), a checkpoint runs
in the background instead, so adds never wait for it: `sync()` notes the position and the
summaries, and a thread fsyncs the index files written so far (opening them by name)
and writes the checkpoint. One runs at a time; `wait_for_checkpoint()` waits for it, and a
failure fails the storage as a synchronous one does.

Recovery (on open). Load the checkpoint; delete entry logs before its replay position that it
does not list (reclaimed, the crash came before the unlink); delete index files of ledgers it
does not know; replay the logs from the replay position, rewriting each entry's slot (which
makes replay idempotent) and the summaries. A record that is short or fails its crc ends the
journal: the log is truncated there and a warning names the file and offset; but if a whole
record that verifies follows it more than two write buffers before the end (a crash tears only
the last group commit) or a later log follows, it was damaged after its sync, and opening fails
with StorageError instead of dropping synced records. Then checkpoint.

Replay never skips a record it cannot index (issue 39): a record that verifies may have been
synced, and the sync is what acknowledged it. If its index write fails (ENOSPC, EIO), or a copy into an
entry log does, or its ids are out of the index's range (only a bookie from before issue 11
wrote such ids, and on a file system with large enough files it acknowledged them), the open
stops with StorageError naming the journal file, the record's offset, the file whose write
failed and the OS error; no checkpoint is written, so once the disk is fixed the next open
replays from the same place and every acknowledged entry reads back. The journal does not mark
the records of a sync that failed for their ledger (LedgerStorageError, never acknowledged), so
replay cannot tell them from acknowledged ones and indexes them like any other: an entry whose
add failed may come back, which BookKeeper allows (the writer counted no acknowledgement from
this bookie). The only records replay drops are the torn, unsynced tail above: they do not
verify, and no sync returned for them.

Version 1. walkit before 2026-11 kept a separate ``journal/`` directory and copied every
entry from it into the entry logs (so every byte was written twice). Such a directory is
recovered the old way once, by replaying its journal into the entry logs, then checkpointed
as version 2 and its journal files deleted.

Failures. Entry ids above `max_entry_id` are refused by `put`. If the index slots of some
ledgers cannot be written at a sync, `sync()` raises LedgerStorageError naming them after
making everything else durable; any other failure of a sync or checkpoint fails the storage as
a whole (StorageError; reopen it to recover from the journal).

Memory: the per-ledger summary (last entry id, state, first entry), per-log byte counts and
highest entry ids, the entries put since the last sync, and bounded LRUs of open files; nothing
per stored entry.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

from walkit.core.bookie import LedgerState
from walkit.errors import ConfigError, LedgerStorageError, StorageError
from walkit.plugins.storage.files import checkpoint as checkpoints
from walkit.plugins.storage.files.disk import fsync_all, fsync_dir, write_durably
from walkit.plugins.storage.files.entrylog import PREALLOCATE_BYTES, EntryLogs, log_path
from walkit.plugins.storage.files.index import MAX_ENTRY_ID, SLOT, LedgerIndex, index_path
from walkit.plugins.storage.files.journal import (
    HEADER, KINDS, MAX_RECORD, PUT, PUT_IDS, STATE, TRIM, RecordFile, decode_delete, decode_state, decode_trim,
    encode_delete, encode_put, encode_puts, encode_state, encode_trim, journal_files, verify,
)
from walkit.plugins.storage.options import Option, check_options, split_uri

log = logging.getLogger("walkit.storage")

_MB = 1 << 20
#: The highest ledger id a journal record can hold (PUT_IDS packs it as a signed 64-bit integer).
MAX_LEDGER_ID = (1 << 63) - 1
#: The file in the storage's directory that holds its disk identity (walkit.bookie.identity).
IDENTITY_FILE = "IDENTITY"
_MAX_PENDING_ENTRIES = 1 << 16          # put() syncs early past this many unsynced entries

OPTIONS = {
    "journal_max_mb": Option(float, 64),          # checkpoint once this much was written since the last
    "checkpoint_s": Option(float, 30),            # ... or this long after the previous checkpoint
    "entrylog_max_mb": Option(float, 128),        # start a new entry log past this size
    "compact_ratio": Option(float, 0.5, minimum=0, maximum=1, exclusive_minimum=False),
    "write_buffer_mb": Option(float, 32),         # put() syncs early past this much unsynced data
    "open_files": Option(int, 256),               # open index files and entry logs kept (each)
    "preallocate_mb": Option(float, PREALLOCATE_BYTES / _MB, maximum=1024,   # the active log grows by this
                             exclusive_minimum=False),                             # (0: appends)
}


class _Ledger:
    """_Ledger is the in-memory summary of one ledger: its highest entry id, its state, and the
    entry below which its entries were deleted (`delete_entries`; 0: none)."""

    __slots__ = ("last", "state", "first")

    def __init__(self, last: int = -1, state: LedgerState = LedgerState(), first: int = 0) -> None:
        """__init__ makes a summary; a new ledger has no entries and the default state."""
        self.last = last
        self.state = state
        self.first = first


class FileStorage:
    """FileStorage is the ``files://`` EntryStorage (see the module doc for formats and recovery).

    Besides the EntryStorage methods it offers `checkpoint()`/`compact()` for the bookie to call
    periodically, and counters for tests and metrics: `fsyncs` (journal group commits),
    `checkpoints`, and `replayed_records` (journal records replayed when it was opened).
    """

    durable = True
    #: The highest entry id the per-ledger index files can hold.
    max_entry_id = MAX_ENTRY_ID

    def __init__(self, path: str, **options) -> None:
        """__init__ opens (creating if needed) the storage in directory `path` and recovers it; see OPTIONS."""
        settings = check_options("files", OPTIONS, options)
        self.path = path
        self.journal_max = int(settings["journal_max_mb"] * _MB)
        self.checkpoint_s = settings["checkpoint_s"]
        self.compact_ratio = settings["compact_ratio"]
        self.buffer_max = int(settings["write_buffer_mb"] * _MB)
        self.fsyncs = 0
        self.checkpoints = 0
        self.replayed_records = 0
        self._buffer = bytearray()                        # journal records not yet synced
        self._pending: dict[int, dict[int, bytes]] = {}   # entries not yet synced, for reads
        self._pending_count = 0
        self._shadowed: set[int] = set()                  # deleted since the last sync: index is stale
        self._ledgers: dict[int, _Ledger] = {}
        self._failed: BaseException | None = None
        self._closed = False
        self._in_checkpoint = False
        self._checkpointer: threading.Thread | None = None      # the background checkpoint, while it runs
        self._last_checkpoint = time.monotonic()
        self._since_checkpoint = 0                        # bytes committed since the last checkpoint's position
        try:
            for name in ("logs", "index"):
                os.makedirs(os.path.join(path, name), exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"files storage: cannot create {path!r}: {exc.strerror}") from None
        self._lock_fd = _lock(path)
        self._logs = EntryLogs(os.path.join(path, "logs"), max(1, int(settings["entrylog_max_mb"] * _MB)),
                               settings["open_files"], int(settings["preallocate_mb"] * _MB))
        self._index = LedgerIndex(os.path.join(path, "index"), settings["open_files"])
        try:
            self._recover()
        except BaseException:
            self._release()
            raise

    @classmethod
    def from_uri(cls, uri: str, **options) -> "FileStorage":
        """from_uri opens ``files:///abs/dir`` or ``files://rel/dir``, with options in the query."""
        from walkit.plugins import path_of
        base, query = split_uri(uri)
        return cls(path_of(base), **{**query, **options})

    # -- EntryStorage ---------------------------------------------------------------------
    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """put buffers an entry (a journal record); it is durable after the next sync()."""
        self._check()
        if not 0 <= ledger_id <= MAX_LEDGER_ID or not 0 <= entry_id <= MAX_ENTRY_ID:
            raise ValueError(f"ledger id {ledger_id} or entry id {entry_id} is out of range "
                             f"(ledger ids 0..{MAX_LEDGER_ID}, entry ids 0..{MAX_ENTRY_ID})")
        data = bytes(data)
        if len(data) > MAX_RECORD - PUT_IDS.size:
            raise ValueError(f"an entry exceeds the {MAX_RECORD}-byte journal record limit")
        summary = self._ledgers.get(ledger_id)
        if summary is not None and entry_id < summary.first:
            return                            # deleted by delete_entries: it stays deleted
        failures = self._room_for(HEADER.size + PUT_IDS.size + len(data))
        encode_put(self._buffer, ledger_id, entry_id, data)
        self._pending.setdefault(ledger_id, {})[entry_id] = data
        self._pending_count += 1
        self._note_put(ledger_id, entry_id)
        self._sync_if_full(failures)

    def put_many(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        """put_many is `put` for a batch of one ledger's entries, encoded in one pass (all or none)."""
        self._check()
        if not 0 <= ledger_id <= MAX_LEDGER_ID:
            raise ValueError(f"ledger id {ledger_id} is out of range (ledger ids 0..{MAX_LEDGER_ID})")
        if not entries:
            return
        ids = [entry_id for entry_id, _ in entries]
        datas = [data for _, data in entries]
        if min(ids) < 0 or max(ids) > MAX_ENTRY_ID:
            raise ValueError(f"an entry id of ledger {ledger_id} is out of range (entry ids 0..{MAX_ENTRY_ID})")
        if max(map(len, datas)) > MAX_RECORD - PUT_IDS.size:     # (a TypeError for data that is not bytes)
            raise ValueError(f"an entry exceeds the {MAX_RECORD}-byte journal record limit")
        datas = list(map(bytes, datas))
        summary = self._ledgers.get(ledger_id)
        if summary is not None and min(ids) < summary.first:         # deleted by delete_entries: they stay so
            kept = [(e, d) for e, d in zip(ids, datas) if e >= summary.first]
            if not kept:
                return
            ids, datas = [e for e, _ in kept], [d for _, d in kept]
        failures = self._room_for(sum(map(len, datas)) + len(datas) * (HEADER.size + PUT_IDS.size))
        encode_puts(self._buffer, ledger_id, zip(ids, datas))
        self._pending.setdefault(ledger_id, {}).update(zip(ids, datas))
        self._pending_count += len(ids)
        self._note_put(ledger_id, max(ids))
        self._sync_if_full(failures)

    def _room_for(self, incoming: int) -> dict[int, str]:
        """_room_for syncs what is buffered if `incoming` more bytes would take the group past `buffer_max`.

        It returns the ledgers whose index slots that sync could not write: the put stores its
        entries all the same and raises once they are buffered (`_sync_if_full`), as when the
        sync comes after them.
        """
        if self._buffer and len(self._buffer) + incoming > self.buffer_max:
            return self._sync()
        return {}

    def _sync_if_full(self, failures: dict[int, str]) -> None:
        """_sync_if_full syncs a full buffer, then raises LedgerStorageError for `failures` and the sync's own."""
        if len(self._buffer) >= self.buffer_max or self._pending_count >= _MAX_PENDING_ENTRIES:
            failures = {**failures, **self._sync()}
        self._raise_for(failures)

    def sync(self) -> None:
        """sync writes the buffered records to the journal with one fdatasync, then applies them.

        It raises LedgerStorageError if only some ledgers' index slots could not be written.
        """
        self._raise_for(self._sync())

    def _raise_for(self, failures: dict[int, str]) -> None:
        """_raise_for raises LedgerStorageError naming the ledgers in `failures` (ledger -> why), if any."""
        if failures:
            raise LedgerStorageError(f"files storage {self.path}: could not index ledger(s) "
                                     + "; ".join(f"{lid}: {why}" for lid, why in sorted(failures.items())),
                                     failures)

    def _sync(self) -> dict[int, str]:
        """_sync is `sync`; it returns the ledgers whose index slots could not be written."""
        self._check()
        if not self._buffer:
            return {}
        buffer, self._buffer = self._buffer, bytearray()
        try:
            log_id, base = self._logs.commit(buffer)
            self.fsyncs += 1
            self._since_checkpoint += len(buffer)
            with memoryview(buffer) as view:
                self._apply(view, log_id, base, replay=False)
        except BaseException as exc:
            self._failed = exc
            raise StorageError(f"files storage {self.path}: sync failed: {exc}") from exc
        failures = self._index.take_failures()
        for ledger_id, why in failures.items():
            log.error("files storage %s: index of ledger %d could not be written: %s", self.path, ledger_id, why)
        self._pending.clear()
        self._pending_count = 0
        self._shadowed.clear()
        due = (self._since_checkpoint >= self.journal_max
               or time.monotonic() - self._last_checkpoint >= self.checkpoint_s)
        if due and not self._in_checkpoint and not self._checkpoint_running():
            self._start_checkpoint()
        return failures

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """get returns an entry's bytes (unsynced ones from memory, others with two preads), or None."""
        self._check()
        pending = self._pending.get(ledger_id)
        if pending is not None and entry_id in pending:
            return pending[entry_id]
        summary = self._ledgers.get(ledger_id)
        if summary is None or not summary.first <= entry_id <= summary.last or ledger_id in self._shadowed:
            return None
        location = self._index.lookup(ledger_id, entry_id)
        return None if location is None else self._logs.read(*location, ledger_id, entry_id)

    def get_many(self, ledger_id: int, entry_ids: list[int]) -> list[bytes | None]:
        """get_many is `get` for many entries of one ledger, with batched index and log reads."""
        self._check()
        summary = self._ledgers.get(ledger_id)
        pending = self._pending.get(ledger_id) or {}
        out: list[bytes | None] = [None] * len(entry_ids)
        if (not pending and entry_ids and summary is not None and ledger_id not in self._shadowed
                and min(entry_ids) >= summary.first and max(entry_ids) <= summary.last):
            locations = self._index.lookup_many(ledger_id, entry_ids)     # the common case: all stored
            if None not in locations:
                return self._logs.read_many([(*location, ledger_id, entry_id)
                                             for location, entry_id in zip(locations, entry_ids)])
            stored = list(enumerate(entry_ids))     # a gap: every id is in range, nothing is pending
        else:
            stored: list[tuple[int, int]] = []      # (position in out, entry id) to read from disk
            for i, entry_id in enumerate(entry_ids):
                data = pending.get(entry_id)
                if data is not None:
                    out[i] = data
                elif (summary is not None and summary.first <= entry_id <= summary.last
                      and ledger_id not in self._shadowed):
                    stored.append((i, entry_id))
            if not stored:
                return out
            locations = self._index.lookup_many(ledger_id, [e for _, e in stored])
        found = [(i, e, loc) for (i, e), loc in zip(stored, locations) if loc is not None]
        datas = self._logs.read_many([(*loc, ledger_id, e) for _, e, loc in found])
        for (i, _, _), data in zip(found, datas):
            out[i] = data
        return out

    def last_entry(self, ledger_id: int) -> int:
        """last_entry returns the highest entry id stored for a ledger, or -1 (from memory)."""
        summary = self._ledgers.get(ledger_id)
        return -1 if summary is None else summary.last

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        """ledger_state returns a ledger's state, or None if the ledger is unknown here."""
        summary = self._ledgers.get(ledger_id)
        return None if summary is None else summary.state

    def set_ledger_state(self, ledger_id: int, state: LedgerState) -> None:
        """set_ledger_state buffers a ledger's new state (a journal record); durable after sync()."""
        self._check()
        encode_state(self._buffer, ledger_id, state)
        self._summary(ledger_id).state = state

    def delete_ledger(self, ledger_id: int) -> None:
        """delete_ledger forgets a ledger at once; its files go at the next sync, its space at a checkpoint."""
        self._check()
        encode_delete(self._buffer, ledger_id)
        self._pending_count -= len(self._pending.pop(ledger_id, ()))
        self._ledgers.pop(ledger_id, None)
        self._shadowed.add(ledger_id)

    def delete_entries(self, ledger_id: int, before: int) -> None:
        """delete_entries forgets a ledger's entries below `before` at once; their space goes at a checkpoint.

        A TRIM record is buffered (durable at the next sync); the logs whose entries of the
        ledger all lie below `before` count them dead from now on, so `compact()` sees them.
        """
        self._check()
        if before < 0:
            raise ValueError(f"delete_entries of ledger {ledger_id} before a negative entry id {before}")
        summary = self._ledgers.get(ledger_id)
        if summary is None or before <= summary.first:
            return
        encode_trim(self._buffer, ledger_id, before)
        summary.first = before
        pending = self._pending.get(ledger_id)
        if pending:
            for entry_id in [e for e in pending if e < before]:
                del pending[entry_id]
                self._pending_count -= 1
        self._logs.trim(ledger_id, before)

    def identity(self) -> bytes | None:
        """identity returns the disk identity kept in the IDENTITY file (walkit.bookie.identity), or None."""
        try:
            with open(os.path.join(self.path, IDENTITY_FILE), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"files storage {self.path}: cannot read {IDENTITY_FILE}: {exc.strerror}") from exc

    def set_identity(self, data: bytes) -> None:
        """set_identity writes the disk identity, durably, before it returns."""
        try:
            write_durably(os.path.join(self.path, IDENTITY_FILE), data)
        except OSError as exc:
            raise StorageError(f"files storage {self.path}: cannot write {IDENTITY_FILE}: {exc.strerror}") from exc

    def ledgers(self) -> list[int]:
        """ledgers lists the ids of the ledgers known here, sorted."""
        return sorted(self._ledgers)

    def close(self) -> None:
        """close takes a final checkpoint (unless the storage failed) and releases every file."""
        if self._closed:
            return
        self._join_checkpoint()
        try:
            if self._failed is None:
                self.checkpoint()
        finally:
            self._closed = True
            self._release()

    # -- checkpoints and garbage collection ---------------------------------------------------
    def checkpoint(self) -> int:
        """checkpoint syncs, reclaims dead entry logs, makes the indexes durable and moves the replay position up.

        It returns the bytes of entry logs given back to the file system.
        """
        return self._checkpoint(reclaim=True)

    def _checkpoint(self, reclaim: bool) -> int:
        """_checkpoint is `checkpoint`; without `reclaim` no log is compacted or removed."""
        self.wait_for_checkpoint()
        self._in_checkpoint = True
        try:
            failures = self._sync()
            dead, sparse = self._logs.plan(self.compact_ratio) if reclaim else ([], [])
            for log_id in sparse:
                self._copy_live(log_id)
            failures.update(self._sync())
            if failures:     # copies of live entries may lack their slots: removing logs would lose them
                raise OSError(f"index writes failed for ledgers {sorted(failures)}")
            self._index.fsync()
            checkpoints.save(self.path, self._snapshot(set(dead) | set(sparse)))
            freed = self._logs.remove(dead + sparse)
        except StorageError:
            raise
        except BaseException as exc:
            self._failed = exc
            raise StorageError(f"files storage {self.path}: checkpoint failed: {exc}") from exc
        finally:
            self._in_checkpoint = False
        self.checkpoints += 1
        self._last_checkpoint = time.monotonic()
        self._since_checkpoint = 0
        if dead or sparse:
            log.info("files storage %s: reclaimed %d entry logs (%d compacted), %d bytes",
                     self.path, len(dead) + len(sparse), len(sparse), freed)
        return freed

    def compact(self) -> int:
        """compact is the garbage collector's entry point: a checkpoint if an entry log can be reclaimed.

        It returns the bytes freed (0, without a checkpoint, when no log can be reclaimed: the
        background checkpoints keep the journal short meanwhile).
        """
        self._check()
        if not self._logs.reclaimable(self.compact_ratio):
            return 0
        return self.checkpoint()

    def wait_for_checkpoint(self) -> None:
        """wait_for_checkpoint waits until the background checkpoint, if one runs, finished; StorageError if it failed."""
        self._join_checkpoint()
        self._check()

    def _checkpoint_running(self) -> bool:
        thread = self._checkpointer
        return thread is not None and thread.is_alive()

    def _join_checkpoint(self) -> None:
        thread, self._checkpointer = self._checkpointer, None
        if thread is not None:
            thread.join()

    def _start_checkpoint(self) -> None:
        """_start_checkpoint starts a background checkpoint (see the module doc); everything is applied now."""
        self._join_checkpoint()           # a finished one
        self._check()                     # which may have failed: then no later checkpoint may be written
        try:
            indexes, index_folders = self._index.take_dirty()
        except BaseException as exc:
            self._failed = exc
            raise StorageError(f"files storage {self.path}: checkpoint failed: {exc}") from exc
        self._last_checkpoint = time.monotonic()
        self._since_checkpoint = 0
        snapshot = self._snapshot(set())
        self._checkpointer = threading.Thread(
            target=self._finish_checkpoint, args=(indexes, index_folders, snapshot),
            name=f"checkpoint {self.path}", daemon=True)
        self._checkpointer.start()

    def _finish_checkpoint(self, paths: list[str], folders: list[str], snapshot: checkpoints.Checkpoint) -> None:
        """_finish_checkpoint is the background half: fsync the index files, write the checkpoint."""
        try:
            fsync_all(paths, folders)
            if self._failed is not None:  # a sync failed meanwhile: the next open recovers from the older one
                return
            checkpoints.save(self.path, snapshot)
        except BaseException as exc:  # noqa: BLE001 - reported by the next call on the serving thread
            log.error("files storage %s: background checkpoint failed: %s", self.path, exc)
            self._failed = exc
            return
        self.checkpoints += 1

    def _copy_live(self, log_id: int) -> None:
        """_copy_live re-puts the live entries of a mostly dead log, so it can be removed."""
        for ledger_id, entry_id, offset, length, data in self._logs.scan(log_id):
            if ledger_id in self._ledgers and self._index.lookup(ledger_id, entry_id) == (log_id, offset, length):
                self.put(ledger_id, entry_id, data)

    def _snapshot(self, dropped: set[int]) -> checkpoints.Checkpoint:
        """_snapshot describes the current durable state as a Checkpoint, without the `dropped` logs."""
        logs = self._logs
        return checkpoints.Checkpoint(
            replay_log=logs.active, replay_offset=logs.size,
            log_totals={k: v for k, v in logs.totals.items() if k not in dropped},
            log_usage={k: dict(v) for k, v in logs.usage.items() if k not in dropped},   # (the serving thread goes on)
            log_tops={k: dict(v) for k, v in logs.tops.items() if k not in dropped},
            ledgers={ledger_id: (s.last, s.state) for ledger_id, s in self._ledgers.items()},
            firsts={ledger_id: s.first for ledger_id, s in self._ledgers.items() if s.first})

    # -- recovery -------------------------------------------------------------------------
    def _recover(self) -> None:
        """_recover restores the checkpoint, replays the journal after it, and checkpoints (see the module doc)."""
        start = checkpoints.load(self.path)
        legacy_folder = os.path.join(self.path, "journal")
        legacy = journal_files(legacy_folder) if os.path.isdir(legacy_folder) else []
        if start is None:
            start = checkpoints.Checkpoint(version=1 if legacy else checkpoints.VERSION)
        self._ledgers = {lid: _Ledger(last, state, start.firsts.get(lid, 0))
                         for lid, (last, state) in start.ledgers.items()}
        self._index.keep_only(self._ledgers)
        if start.version == 1:
            self._logs.restore_legacy(start.active_log, start.log_totals.get(start.active_log, 0), start.log_totals,
                                      start.log_usage)
            self._replay([(seq, path, start.replay_offset if seq == start.replay_log else 0)
                          for seq, path in legacy if seq >= start.replay_log], copy=True)
            # Version 2 from here on, before any log is compacted: a crash in the compaction
            # below must be recovered by replaying the logs, not by carrying over again (which
            # cuts the logs back to the version 1 checkpoint, and with them the compaction's copies).
            self._checkpoint(reclaim=False)
        else:
            replayed = self._logs.restore(start.log_totals, start.log_usage, start.log_tops, start.replay_log,
                                          start.replay_offset)
            self._replay(replayed, copy=False)
            self._logs.resume(replayed)
        self.checkpoint()
        if os.path.isdir(legacy_folder):          # (empty if a crash came after its files were deleted)
            for _, path in legacy:
                os.unlink(path)
            try:
                os.rmdir(legacy_folder)
            except OSError as exc:                # other files in it: leave them to their owner
                log.warning("files storage %s: kept %s: %s", self.path, legacy_folder, exc.strerror)
            fsync_dir(self.path)
            log.info("files storage %s: carried over from version 1 (%d journal files replayed into the entry "
                     "logs and deleted)", self.path, len(legacy))

    def _replay(self, files: list[tuple[int, str, int]], copy: bool) -> None:
        """_replay applies the good records of (number, path, offset) files in order, repairing a torn tail.

        The files are entry logs (their records stay where they are) or, to carry a version 1
        storage over, its journal files, whose records are `copy`'d into the entry logs. A
        record that cannot be applied stops it with StorageError (see the module doc): nothing
        that verifies is skipped.
        """
        for i, (number, path, offset) in enumerate(files):
            reader = RecordFile(path, offset)
            log_id, at = number, offset
            try:
                for view, at in reader.chunks():
                    if copy:
                        log_id, base = self._copy(view, path, at)
                    else:
                        base = at
                    self.replayed_records += self._apply(view, log_id, base, replay=True, where=(path, at))
                if reader.problem is not None:
                    _repair(reader, [p for _, p, _ in files[i + 1:]], 2 * self.buffer_max)
                    break
            except StorageError:
                raise
            except OSError as exc:       # reading the journal, cutting its torn tail, dropping a deleted ledger
                raise self._replay_stopped(path, at, f"{exc}") from exc

    def _copy(self, view: memoryview, path: str, at: int) -> tuple[int, int]:
        """_copy commits version 1 journal records (from `path` at `at`) to the entry logs; returns (log id, offset)."""
        try:
            return self._logs.commit(view)
        except OSError as exc:
            raise self._replay_stopped(path, at, f"copying its records into entry log "
                                                 f"{log_path(self._logs.folder, self._logs.active)} failed: {exc}"
                                       ) from exc

    def _replay_stopped(self, path: str, offset: int, why: str) -> StorageError:
        """_replay_stopped is the StorageError that stops an open: the record at `offset` of journal `path` and why."""
        return StorageError(f"files storage {self.path}: replay stopped at journal {path} offset {offset}: {why}; "
                            "a record that verifies may have been acknowledged, so it is not skipped and no "
                            "checkpoint moves past it (fix the cause, then open the storage again to replay from there)")

    def _unindexed(self, failures: dict[int, str], slots: dict[int, dict[int, bytes]], base: int,
                   where: tuple[str, int]) -> StorageError:
        """_unindexed is the StorageError for replayed records whose index slots could not be written.

        `failures` are the index's (ledger -> why), `slots` the chunk's staged slots, which lie at
        `base` in their entry log; the error names the earliest record of a failed ledger.
        """
        earliest = None
        for ledger_id in failures:
            for entry_id, slot in slots.get(ledger_id, {}).items():
                offset = where[1] + SLOT.unpack(slot)[1] - base
                if earliest is None or offset < earliest[0]:
                    earliest = (offset, ledger_id, entry_id)
        offset, ledger_id, entry_id = earliest if earliest is not None else (where[1], min(failures), -1)
        others = sorted(set(failures) - {ledger_id})
        return self._replay_stopped(
            where[0], offset,
            f"writing the index slot of entry ({ledger_id}, {entry_id}) to {index_path(self._index.folder, ledger_id)} "
            f"failed: {failures[ledger_id]}" + (f" (and those of ledger(s) {others})" if others else ""))

    def _apply(self, view: memoryview, log_id: int, base: int, replay: bool, where: tuple[str, int] = ("", 0)) -> int:
        """_apply carries verified journal records, which lie at `base` in entry log `log_id`, into the indexes.

        It returns their count. Each PUT's slot points at its record in the log; a TRIM drops
        the slots below it, staged or written. put, set_ledger_state, delete_ledger and
        delete_entries update the ledger summaries at once, so only a `replay` updates them
        here. A `replay` raises StorageError naming the record (`where` is its file and chunk
        offset) if a PUT's ids are out of the index's range or its slot could not be written; a
        sync leaves index failures to `_sync`, which reports them per ledger.
        """
        note_put, index = self._note_put, self._index
        unpack_header, unpack_ids, pack_slot, head = HEADER.unpack_from, PUT_IDS.unpack_from, SLOT.pack, HEADER.size
        # Slots and entry-log bytes per ledger, staged once per ledger at the end (a group commit
        # carries hundreds of one ledger's entries): a DELETE drops what its ledger had so far, a
        # TRIM what it had below its point.
        slots: dict[int, dict[int, bytes]] = {}
        sizes: dict[int, int] = {}
        count, pos, end = 0, 0, len(view)
        while pos < end:
            length, _, kind = unpack_header(view, pos)
            count += 1
            if kind == PUT:
                ledger_id, entry_id = unpack_ids(view, pos + head)
                if replay and (ledger_id < 0 or not 0 <= entry_id <= MAX_ENTRY_ID):
                    raise self._replay_stopped(
                        where[0], where[1] + pos,
                        f"entry ({ledger_id}, {entry_id}) is out of the range an index holds (ledger ids "
                        f"0..{MAX_LEDGER_ID}, entry ids 0..{MAX_ENTRY_ID}); no walkit since issue 11 writes such "
                        f"ids (an older one did, or the record is damaged yet verifies): open the directory with "
                        f"the walkit that wrote it, or recover this bookie's ledgers from their other bookies")
                ledger_slots = slots.get(ledger_id)
                if ledger_slots is None:
                    ledger_slots = slots[ledger_id] = {}
                    sizes[ledger_id] = 0
                ledger_slots[entry_id] = pack_slot(log_id, base + pos, length)
                sizes[ledger_id] += head + length
                if replay:
                    note_put(ledger_id, entry_id)
            elif kind == STATE:
                if replay:
                    ledger_id, state = decode_state(view[pos + head:pos + head + length])
                    self._summary(ledger_id).state = state
            elif kind == TRIM:
                ledger_id, before = decode_trim(view[pos + head:pos + head + length])
                ledger_slots = slots.get(ledger_id)
                if ledger_slots:                  # PUTs of this chunk that came before it
                    for entry_id in [e for e in ledger_slots if e < before]:
                        sizes[ledger_id] -= head + SLOT.unpack(ledger_slots.pop(entry_id))[2]
                index.trim(ledger_id, before)
                self._logs.trim(ledger_id, before)
                if replay:
                    summary = self._ledgers.get(ledger_id)
                    if summary is not None and before > summary.first:
                        summary.first = before
            else:
                ledger_id = decode_delete(view[pos + head:pos + head + length])
                slots.pop(ledger_id, None)
                sizes.pop(ledger_id, None)
                index.drop(ledger_id)
                self._logs.forget(ledger_id)
                if replay:
                    self._ledgers.pop(ledger_id, None)
            pos += head + length
        note = self._logs.note
        for ledger_id, ledger_slots in slots.items():
            if ledger_slots:
                index.stage(ledger_id, ledger_slots)
                note(log_id, ledger_id, sizes[ledger_id], max(ledger_slots))
        index.flush()
        if replay and index.failed:
            raise self._unindexed(index.take_failures(), slots, base, where)
        return count

    # -- plumbing -------------------------------------------------------------------------
    def _summary(self, ledger_id: int) -> _Ledger:
        """_summary returns a ledger's summary, making the ledger known if it was not."""
        summary = self._ledgers.get(ledger_id)
        if summary is None:
            summary = self._ledgers[ledger_id] = _Ledger()
        return summary

    def _note_put(self, ledger_id: int, entry_id: int) -> None:
        """_note_put raises a ledger's last entry id to `entry_id`, making the ledger known."""
        summary = self._ledgers.get(ledger_id)
        if summary is None:
            summary = self._ledgers[ledger_id] = _Ledger()
        if entry_id > summary.last:
            summary.last = entry_id

    def _check(self) -> None:
        """_check raises StorageError if the storage is closed or failed earlier."""
        if self._closed:
            raise StorageError(f"files storage {self.path} is closed")
        if self._failed is not None:
            raise StorageError(f"files storage {self.path} failed earlier ({self._failed}); reopen it to "
                               f"recover from the journal")

    def _release(self) -> None:
        """_release closes every file and the lock, carrying on past errors."""
        closers = [self._logs.close, self._index.close, lambda: os.close(self._lock_fd)]
        for close in closers:
            try:
                close()
            except OSError as exc:
                log.warning("files storage %s: closing failed: %s", self.path, exc)


def _lock(path: str) -> int:
    """_lock takes the directory's LOCK file, or raises ConfigError if another storage holds it."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"files storage {path!r} is already open (by another bookie process or storage "
                          f"object)") from None
    return fd


def _repair(reader: RecordFile, later: list[str], torn_max: int) -> None:
    """_repair truncates the journal at its first bad record, if that record can be a crash's torn tail.

    Zeros from there to the end are the active log's preallocated space, cut off quietly.

    A crash tears only the last group commit, which is at most about `torn_max` bytes. A bad
    record followed by later journal files, or by whole records (the first right after it, its
    length taken as read) that verify for more than `torn_max` bytes past it, was damaged after
    it was synced: it is refused, not dropped. A group torn in its middle (a power cut wrote its
    later pages, not an earlier one) is cut off however much preallocated space follows it, as
    its records and then zeros end within `torn_max`.
    """
    path, end = reader.path, reader.end
    later_bytes = sum(os.path.getsize(p) for p in later)
    if later_bytes:
        raise StorageError(f"journal {path} is corrupt at offset {end} ({reader.problem}) and "
                           f"{later_bytes} bytes of later journal follow; refusing to drop synced records")
    size = os.path.getsize(path)
    data_end = _data_end(path, end)
    if data_end == end:
        # The active log's preallocated space (entrylog.py): its records end here, nothing was torn.
        log.info("entry log %s: records end at offset %d; cutting the %d preallocated bytes after them",
                 path, end, size - end)
        _truncate(path, end)
        return
    chain_end = _records_after(path, end, stop=end + torn_max)
    if chain_end > end and max(chain_end, data_end) - end > torn_max:
        raise StorageError(f"journal {path} is corrupt at offset {end} ({reader.problem}) and the record after "
                           f"it verifies, more than {torn_max} bytes before the end of the data; refusing to drop "
                           "synced records")
    log.warning("journal %s: %s at offset %d; truncating the journal there (%d bytes dropped)",
                path, reader.problem, end, size - end)
    _truncate(path, end)


def _truncate(path: str, size: int) -> None:
    """_truncate cuts file `path` to `size` bytes, durably."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _data_end(path: str, start: int) -> int:
    """_data_end is the offset after the last non-zero byte of `path` at or after `start` (`start` if there is none)."""
    with open(path, "rb") as stream:
        position = stream.seek(0, os.SEEK_END)
        while position > start:
            step = min(1 << 20, position - start)
            stream.seek(position - step)
            chunk = stream.read(step)
            stripped = len(chunk.rstrip(b"\0"))
            if stripped:
                return position - step + stripped
            position -= step
    return start


def _records_after(path: str, end: int, stop: int) -> int:
    """_records_after is where the whole records after the bad record at `end` end (`end` if the next does not verify).

    The bad record's length is taken as read; from the record after it, records are followed
    while they verify, until one does not or they pass `stop`. Zeros inside a record's data
    count as data here, which the last non-zero byte (`_data_end`) cannot tell.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as stream:
        stream.seek(end)
        length = _header_length(stream)
        if length is None:
            return end
        position, last = end + HEADER.size + length, end
        while last <= stop:
            stream.seek(position)
            length = _header_length(stream)
            if length is None or position + HEADER.size + length > size:     # (a garbage length is not read)
                break
            stream.seek(position)
            record = stream.read(HEADER.size + length)
            if len(record) != HEADER.size + length or verify(memoryview(record)).end != len(record):
                break
            position = last = position + len(record)
    return last


def _header_length(stream) -> int | None:
    """_header_length reads a record header from `stream` and returns its payload length, or None if it is no header."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    length, _, kind = HEADER.unpack(header)
    return length if length <= MAX_RECORD and kind in KINDS else None
