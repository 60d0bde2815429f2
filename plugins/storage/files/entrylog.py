"""walkit.plugins.storage.files.entrylog keeps entries in rotating entry-log files, which are the journal.

An entry log ``logs/<id as 8 hex digits>.log`` is a sequence of journal records (journal.py). A
group commit's buffer is written to the end of the active log and made durable with one
``os.fdatasync`` (`commit`): the entry log is the write-ahead journal, so every byte is written
once. The PUT records are the entries (an index slot points at one); STATE and DELETE records
ride along and are skipped by reads. Each record carries its ledger and entry ids and a crc, so
reads are checked and compaction can tell live records from dead ones with the index alone.
A log past `max_bytes` is finished and the next one starts (its name made durable first).

The active log is preallocated `PREALLOCATE_BYTES` (the files storage's `preallocate_mb`) at a
time, at most `max_bytes` (BookKeeper's journalPreAllocSizeMB): a group written inside the
file's size does not change the size, and on ext4 its fdatasync is then about a quarter
cheaper than one that extends the file. The space past the last group reads as zeros. A
finished log is cut back to its records before the next one takes writes, and so is the
active log when it is closed; after a crash, replay stops at the zero tail and `FileStorage`
cuts it off (storage.py, `_repair`).

`EntryLogs` also keeps, per log, the bytes written for each ledger (BookKeeper's
EntryLogMetadata) and the highest entry id of each: a log whose ledgers were all deleted, or
trimmed past their highest entry in it (`trim`, the files storage's `delete_entries`), can be
removed, and a mostly dead one compacted. These are small dicts per log, never one object per
entry. A ledger's highest entry in a log is UNKNOWN_TOP where a version 2 checkpoint did not
record it: a trim then never finds those bytes dead.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict
from typing import Iterator

from walkit.errors import StorageError
from walkit.plugins.storage.files.disk import fsync_dir, numbered_files, numbered_path
from walkit.plugins.storage.files.journal import HEADER, PUT, PUT_IDS, RecordFile, put_data, records

_DATA = HEADER.size + PUT_IDS.size      # where an entry's data starts in its record
_COALESCE_GAP = 64 * 1024               # read_many merges records fewer than this many bytes apart
_COALESCE_MAX = 4 * 1024 * 1024         # into one pread of at most this many bytes
#: The active log grows by this much at a time, ahead of its records.
PREALLOCATE_BYTES = 16 * 1024 * 1024
#: A ledger's highest entry id in a log that no checkpoint recorded (storages from before version 3).
UNKNOWN_TOP = 1 << 62


def log_path(folder: str, log_id: int) -> str:
    """log_path names entry log `log_id` in `folder`."""
    return numbered_path(folder, log_id, "log", 8)


def _drop_cached(fd: int) -> None:
    """_drop_cached advises the kernel to drop a file's clean pages from the page cache (advice only)."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):       # no posix_fadvise here, or a file system without it
        pass


class EntryLogs:
    """EntryLogs commits group buffers to the active log, reads entries back, and accounts for live bytes."""

    def __init__(self, folder: str, max_bytes: int, open_files: int, preallocate: int = PREALLOCATE_BYTES) -> None:
        """__init__ prepares the logs in `folder`; `restore` or `restore_legacy` opens them.

        The active log grows `preallocate` bytes at a time (0: by appends).
        """
        self.folder = folder
        self.max_bytes = max_bytes
        self.open_files = open_files
        self.active = 0
        self.size = 0                   # bytes of the active log's records
        self.allocated = 0              # the active log's file size: its records, then zeros
        self.preallocate = preallocate  # 0: never (also set when the file system cannot)
        self.totals: dict[int, int] = {}            # log id -> bytes written
        self.usage: dict[int, dict[int, int]] = {}  # log id -> ledger id -> bytes written
        self.tops: dict[int, dict[int, int]] = {}   # log id -> ledger id -> highest entry id written
        self._fd = -1
        self._readers: OrderedDict[int, int] = OrderedDict()

    # -- lifecycle ------------------------------------------------------------------------
    def restore(self, totals: dict[int, int], usage: dict[int, dict[int, int]], tops: dict[int, dict[int, int]],
                replay_log: int, replay_offset: int) -> list[tuple[int, str, int]]:
        """restore reopens the logs as a checkpoint left them and returns what to replay.

        The checkpoint lists every finished log before `replay_log`; an unlisted log before it
        was removed by compaction after the checkpoint (the crash came before the unlink) and is
        deleted now. Logs from `replay_log` on hold the journal written since the checkpoint:
        the returned (log id, path, offset) say where replay reads them, `replay_offset` into the
        first. After replay, `resume` makes the last one the active log. A log in `usage` without
        `tops` (a version 2 checkpoint) gets UNKNOWN_TOP for each of its ledgers.
        """
        self.totals, self.usage = dict(totals), {k: dict(v) for k, v in usage.items()}
        self.tops = {log_id: dict(tops[log_id]) if log_id in tops else dict.fromkeys(ledgers, UNKNOWN_TOP)
                     for log_id, ledgers in usage.items()}
        replay = []
        for log_id, path in numbered_files(self.folder, "log", 8):
            if log_id >= replay_log:
                offset = replay_offset if log_id == replay_log else 0
                if os.path.getsize(path) < offset:
                    raise StorageError(f"entry log {path} is shorter than its checkpoint says ({offset} bytes); "
                                       f"the storage cannot be recovered safely")
                replay.append((log_id, path, offset))
                self.totals.setdefault(log_id, 0)
                self.usage.setdefault(log_id, {})
                self.tops.setdefault(log_id, {})
            elif log_id not in self.totals:
                os.unlink(path)
        if replay_offset and not any(log_id == replay_log for log_id, _, _ in replay):
            raise StorageError(f"entry log {log_path(self.folder, replay_log)}, where the checkpoint starts replay, "
                               f"is missing; the storage cannot be recovered safely")
        return replay

    def resume(self, replayed: list[tuple[int, str, int]]) -> None:
        """resume opens the highest-numbered log (a new one if there is none) as the active log, at its end.

        `replayed` is what `restore` returned: those logs' sizes are taken again, as replay may
        have cut a torn tail off the last.
        """
        for log_id, path, _ in replayed:
            self.totals[log_id] = os.path.getsize(path)
        self._open_active(max(self.totals, default=1))

    def restore_legacy(self, active: int, size: int, totals: dict[int, int], usage: dict[int, dict[int, int]]) -> None:
        """restore_legacy reopens the logs as a version-1 checkpoint left them, to replay its separate journal.

        Version 1 wrote every entry twice, to journal files and then to the entry logs; logs the
        checkpoint does not list are deleted and the active log is cut back to its checkpointed
        size, so replaying the old journal (`commit` of each chunk) rewrites the rest.
        """
        self.totals, self.usage = dict(totals), {k: dict(v) for k, v in usage.items()}
        self.tops = {log_id: dict.fromkeys(ledgers, UNKNOWN_TOP) for log_id, ledgers in usage.items()}
        for log_id, path in numbered_files(self.folder, "log", 8):
            if log_id != active and log_id not in self.totals:
                os.unlink(path)
        self._open_active(active)
        if self.size > size:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
            self.size = self.allocated = self.totals[active] = size

    def _open_active(self, log_id: int) -> None:
        """_open_active opens (creating if needed) log `log_id` as the active log and makes its name durable.

        The previous active log, if any, stays open for reads. If the open fails, nothing changed.
        """
        fd = os.open(log_path(self.folder, log_id), os.O_RDWR | os.O_CREAT, 0o644)
        if self._fd >= 0:
            self._readers[self.active] = self._fd
            self._trim_readers()
        self.active, self._fd = log_id, fd
        self.size = self.allocated = os.fstat(fd).st_size
        self.totals[log_id] = self.size
        self.usage.setdefault(log_id, {})
        self.tops.setdefault(log_id, {})
        fsync_dir(self.folder)

    def close(self) -> None:
        """close cuts the active log's preallocated tail off and closes every file."""
        if self._fd >= 0:
            try:
                self._cut_tail()
            finally:
                os.close(self._fd)
                self._fd = -1
        while self._readers:
            os.close(self._readers.popitem()[1])

    # -- writing --------------------------------------------------------------------------
    def commit(self, buffer: bytes | bytearray) -> tuple[int, int]:
        """commit writes a group of records to the active log durably (write + fdatasync); returns (log id, offset).

        A group is never split: the log rotates first if it would pass `max_bytes`. On any
        error the log is cut back to its previous size, so no partial record stays in the
        middle of it, and the error is raised.
        """
        if self.size and self.size + len(buffer) > self.max_bytes:
            self.rotate()
        offset = self.size
        if offset + len(buffer) > self.allocated and self.preallocate:
            self._grow(offset + len(buffer))
        view = memoryview(buffer)
        try:
            written = 0
            while written < len(view):
                written += os.pwrite(self._fd, view[written:], offset + written)
            os.fdatasync(self._fd)
        except BaseException:
            os.ftruncate(self._fd, offset)
            self.allocated = offset
            raise
        finally:
            view.release()
        self.size = offset + len(buffer)
        self.totals[self.active] = self.size
        return self.active, offset

    def rotate(self) -> None:
        """rotate finishes the active log and starts the next one.

        The finished log's pages leave the page cache (they are clean: every group was
        fdatasync'd). A bookie writes far more than it reads back soon, and a page cache
        that grows without bound made the kernel's work per write grow with it; the active
        log, where tailing reads land, stays cached.
        """
        finished = self._fd
        self._cut_tail(durable=True)
        self._open_active(self.active + 1)
        _drop_cached(finished)

    def _grow(self, needed: int) -> None:
        """_grow preallocates the active log to past `needed` bytes (made durable: later fdatasyncs need not).

        A file system that cannot preallocate gets appends, as before: preallocation is off from then on.
        """
        size = needed + min(self.preallocate, self.max_bytes)
        try:
            os.posix_fallocate(self._fd, self.allocated, size - self.allocated)
            os.fsync(self._fd)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                self.preallocate = 0
            os.ftruncate(self._fd, self.size)     # (a partial allocation would read as records of zeros)
            self.allocated = self.size
            return
        self.allocated = size

    def _cut_tail(self, durable: bool = False) -> None:
        """_cut_tail truncates the active log to its records; `durable` fsyncs the new size."""
        if self.allocated > self.size:
            os.ftruncate(self._fd, self.size)
            self.allocated = self.size
            if durable:
                os.fsync(self._fd)

    # -- reading --------------------------------------------------------------------------
    def _reader(self, log_id: int) -> int:
        """_reader returns an open file descriptor for reading log `log_id` (kept in an LRU)."""
        if log_id == self.active:
            return self._fd
        fd = self._readers.get(log_id)
        if fd is None:
            fd = self._readers[log_id] = os.open(log_path(self.folder, log_id), os.O_RDONLY)
            self._trim_readers()
        else:
            self._readers.move_to_end(log_id)
        return fd

    def _trim_readers(self) -> None:
        """_trim_readers closes the least recently used read descriptors beyond `open_files`."""
        while len(self._readers) > self.open_files:
            os.close(self._readers.popitem(last=False)[1])

    def read(self, log_id: int, offset: int, length: int, ledger_id: int, entry_id: int) -> bytes:
        """read returns the data of the PUT record at `offset` (payload `length`), checking crc and ids."""
        data = put_data(memoryview(os.pread(self._reader(log_id), HEADER.size + length, offset)), 0, length,
                        ledger_id, entry_id)
        if data is not None:
            return data
        raise StorageError(f"entry log {log_path(self.folder, log_id)} offset {offset}: record of ledger "
                           f"{ledger_id} entry {entry_id} is missing or corrupt")

    def read_many(self, wanted: list[tuple[int, int, int, int, int]]) -> list[bytes]:
        """read_many is `read` for many (log id, offset, length, ledger id, entry id) at once.

        Records of one log that lie close together are read with one pread of the range that
        covers them; each record is still checked (crc and ids) on its own.
        """
        out: list[bytes | None] = [None] * len(wanted)
        order = sorted(range(len(wanted)), key=wanted.__getitem__)      # by log id, then offset
        header = HEADER.size
        groups: list[tuple[int, int, int, int, int]] = []   # (first, stop) in order, log id, start, end
        first = log_id = start = end = 0
        for position, i in enumerate(order):
            record = wanted[i]
            offset = record[1]
            record_end = offset + header + record[2]
            if (not position or record[0] != log_id or offset > end + _COALESCE_GAP
                    or record_end - start > _COALESCE_MAX):
                if position:
                    groups.append((first, position, log_id, start, end))
                first, log_id, start, end = position, record[0], offset, record_end
            elif record_end > end:
                end = record_end
        if wanted:
            groups.append((first, len(order), log_id, start, end))
        for first, stop, log_id, start, end in groups:
            block = memoryview(os.pread(self._reader(log_id), end - start, start))
            for i in order[first:stop]:
                _, offset, length, ledger_id, entry_id = wanted[i]
                data = put_data(block, offset - start, length, ledger_id, entry_id)
                if data is None:
                    raise StorageError(f"entry log {log_path(self.folder, log_id)} offset {offset}: record of "
                                       f"ledger {ledger_id} entry {entry_id} is missing or corrupt")
                out[i] = data
        return out

    def scan(self, log_id: int) -> Iterator[tuple[int, int, int, int, bytes]]:
        """scan yields (ledger, entry, offset, payload length, data) of each entry in a finished log."""
        reader = RecordFile(log_path(self.folder, log_id))
        for view, base in reader.chunks():
            for pos, kind, length in records(view):
                if kind == PUT:
                    ledger_id, entry_id = PUT_IDS.unpack_from(view, pos + HEADER.size)
                    yield ledger_id, entry_id, base + pos, length, bytes(view[pos + _DATA:pos + HEADER.size + length])
        if reader.problem is not None:
            raise StorageError(f"entry log {reader.path} is corrupt at offset {reader.end}: {reader.problem}")

    # -- garbage ----------------------------------------------------------------------------
    def forget(self, ledger_id: int) -> None:
        """forget drops a deleted ledger from every log's accounting (its records become dead)."""
        for usage in self.usage.values():
            usage.pop(ledger_id, None)
        for tops in self.tops.values():
            tops.pop(ledger_id, None)

    def note(self, log_id: int, ledger_id: int, size: int, top: int) -> None:
        """note accounts for `size` more bytes of a ledger in a log, whose entries there go up to `top`."""
        usage, tops = self.usage[log_id], self.tops[log_id]
        usage[ledger_id] = usage.get(ledger_id, 0) + size
        if top > tops.get(ledger_id, -1):
            tops[ledger_id] = top

    def trim(self, ledger_id: int, before: int) -> None:
        """trim drops a ledger from the accounting of every log whose entries of it all lie below `before`.

        Those bytes are dead (the ledger's entries below `before` were deleted); a log that
        also holds later entries of the ledger counts all of them live until a later trim
        passes them too. Applying it twice changes nothing.
        """
        for log_id, tops in self.tops.items():
            top = tops.get(ledger_id)
            if top is not None and top < before:
                del tops[ledger_id]
                self.usage[log_id].pop(ledger_id, None)

    def plan(self, ratio: float) -> tuple[list[int], list[int]]:
        """plan returns (dead logs, mostly dead logs): no live ledger left, or live/total below `ratio`.

        An active log that is dead, or mostly dead and at least a quarter full, is rotated first so
        it can be removed or compacted like the others.
        """
        rotate, dead, sparse = self._classify(ratio)
        if rotate:
            self.rotate()
            _, dead, sparse = self._classify(ratio)      # the rotated log is now one of the others
        return dead, sparse

    def reclaimable(self, ratio: float) -> bool:
        """reclaimable tells whether `plan(ratio)` would find a log to remove or compact (it changes nothing)."""
        rotate, dead, sparse = self._classify(ratio)
        return rotate or bool(dead or sparse)

    def _classify(self, ratio: float) -> tuple[bool, list[int], list[int]]:
        """_classify returns (whether the active log should rotate, dead logs, mostly dead logs), sorted."""
        total, live = self.totals.get(self.active, 0), sum(self.usage[self.active].values())
        rotate = bool(total and (live == 0 or (live < ratio * total and total >= self.max_bytes // 4)))
        dead, sparse = [], []
        for log_id, total in self.totals.items():
            if log_id == self.active:
                continue
            live = sum(self.usage.get(log_id, {}).values())
            if live == 0:
                dead.append(log_id)
            elif live < ratio * total:
                sparse.append(log_id)
        return rotate, sorted(dead), sorted(sparse)

    def remove(self, log_ids: list[int]) -> int:
        """remove deletes finished logs (after a checkpoint that no longer lists them); returns bytes freed.

        The unlinks need no fsync: a log that comes back after a crash is unlisted and lies before
        the checkpoint's replay position, so `restore` deletes it again.
        """
        freed = 0
        for log_id in log_ids:
            assert log_id != self.active, "the active entry log cannot be removed"
            fd = self._readers.pop(log_id, None)
            if fd is not None:
                os.close(fd)
            path = log_path(self.folder, log_id)
            try:
                freed += os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                pass
            self.totals.pop(log_id, None)
            self.usage.pop(log_id, None)
            self.tops.pop(log_id, None)
        return freed
