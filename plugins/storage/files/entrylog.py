"""walkit.plugins.storage.files.entrylog keeps entries in rotating entry-log files.

An entry log ``logs/<id as 8 hex digits>.log`` holds journal records (journal.py) exactly as the
journal has them: a group commit's buffer is appended to the active log with one write after the
journal synced it. The PUT records are the entries (an index slot points at one); STATE and
DELETE records ride along and are skipped. Logs are not fsynced per group: the journal makes
entries durable, and a checkpoint fsyncs the logs before the journal that covers them is dropped.
Each record carries its ledger and entry ids and a crc, so reads are checked and compaction can
tell live records from dead ones with the index alone.

`EntryLogs` also keeps, per log, the bytes written for each ledger (BookKeeper's
EntryLogMetadata): a log whose ledgers were all deleted can be removed, and a mostly dead one
compacted. This is one small dict per log, never one object per entry.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Iterator

from walkit.errors import StorageError
from walkit.plugins.storage.files.disk import fsync_all, numbered_files, numbered_path
from walkit.plugins.storage.files.journal import HEADER, PUT, PUT_IDS, RecordFile, records, verify

_DATA = HEADER.size + PUT_IDS.size      # where an entry's data starts in its record
_COALESCE_GAP = 64 * 1024               # read_many merges records fewer than this many bytes apart
_COALESCE_MAX = 4 * 1024 * 1024         # into one pread of at most this many bytes


def log_path(folder: str, log_id: int) -> str:
    """log_path names entry log `log_id` in `folder`."""
    return numbered_path(folder, log_id, "log", 8)


class EntryLogs:
    """EntryLogs appends entries to the active log, reads them back, and accounts for live bytes."""

    def __init__(self, folder: str, max_bytes: int, open_files: int) -> None:
        """__init__ prepares the logs in `folder`; `restore` opens them."""
        self.folder = folder
        self.max_bytes = max_bytes
        self.open_files = open_files
        self.active = 0
        self.size = 0                   # bytes of the active log
        self.totals: dict[int, int] = {}            # log id -> bytes written
        self.usage: dict[int, dict[int, int]] = {}  # log id -> ledger id -> bytes written
        self._fd = -1
        self._unsynced: set[int] = set()
        self._readers: OrderedDict[int, int] = OrderedDict()
        self._names_changed = False

    # -- lifecycle ------------------------------------------------------------------------
    def restore(self, active: int, size: int, totals: dict[int, int], usage: dict[int, dict[int, int]]) -> None:
        """restore reopens the logs as a checkpoint left them.

        Logs the checkpoint does not list (compacted away, or begun after it) are deleted and the
        active log is cut back to its checkpointed size; journal replay then rewrites the rest.
        """
        self.totals, self.usage = dict(totals), {k: dict(v) for k, v in usage.items()}
        for log_id, path in numbered_files(self.folder, "log", 8):
            if log_id != active and log_id not in self.totals:
                os.unlink(path)
                self._names_changed = True
        self._open_active(active)
        if os.fstat(self._fd).st_size > size:
            os.ftruncate(self._fd, size)
            self._unsynced.add(active)
        self.size = size
        self.totals[active] = size
        self.usage.setdefault(active, {})

    def _open_active(self, log_id: int) -> None:
        """_open_active opens (creating if needed) log `log_id` as the active log."""
        self.active = log_id
        self._fd = os.open(log_path(self.folder, log_id), os.O_RDWR | os.O_CREAT, 0o644)
        self._names_changed = True

    def close(self) -> None:
        """close closes every file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        while self._readers:
            os.close(self._readers.popitem()[1])

    # -- writing --------------------------------------------------------------------------
    def append(self, view: memoryview) -> tuple[int, int]:
        """append writes verified records to the active log (no fsync) and returns (log id, offset).

        A group is never split: the log rotates first if it would pass `max_bytes`.
        """
        if self.size and self.size + len(view) > self.max_bytes:
            self.rotate()
        offset = self.size
        written = 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], offset + written)
        self.size += len(view)
        self.totals[self.active] = self.size
        self._unsynced.add(self.active)
        return self.active, offset

    def rotate(self) -> None:
        """rotate finishes the active log and starts the next one."""
        self._unsynced.add(self.active)
        self._readers[self.active] = self._fd      # the old active log stays open for reads
        self._trim_readers()
        self._open_active(self.active + 1)
        self.size = 0
        self.totals[self.active] = 0
        self.usage[self.active] = {}

    def fsync(self) -> None:
        """fsync makes every log written since the last fsync durable, and new or removed names."""
        fsync_all(*self.take_unsynced())

    def take_unsynced(self) -> tuple[list[int], list[str]]:
        """take_unsynced hands over what `fsync` would make durable, and forgets it.

        It returns new descriptors of every log written since (the caller fsyncs and closes
        them, on any thread: this object's own descriptors may close meanwhile) and the folder
        if names changed.
        """
        fds = []
        for log_id in sorted(self._unsynced):
            if log_id == self.active:
                fds.append(os.dup(self._fd))
            elif log_id in self.totals:
                fds.append(os.open(log_path(self.folder, log_id), os.O_RDONLY))
        self._unsynced.clear()
        folders = [self.folder] if self._names_changed else []
        self._names_changed = False
        return fds, folders

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
        record = memoryview(os.pread(self._reader(log_id), HEADER.size + length, offset))
        if (verify(record).end == len(record) == HEADER.size + length and record[8] == PUT
                and PUT_IDS.unpack_from(record, HEADER.size) == (ledger_id, entry_id)):
            return bytes(record[_DATA:])
        raise StorageError(f"entry log {log_path(self.folder, log_id)} offset {offset}: record of ledger "
                           f"{ledger_id} entry {entry_id} is missing or corrupt")

    def read_many(self, wanted: list[tuple[int, int, int, int, int]]) -> list[bytes]:
        """read_many is `read` for many (log id, offset, length, ledger id, entry id) at once.

        Records of one log that lie close together are read with one pread of the range that
        covers them; each record is still checked (crc and ids) on its own.
        """
        out: list[bytes | None] = [None] * len(wanted)
        order = sorted(range(len(wanted)), key=lambda i: (wanted[i][0], wanted[i][1]))
        group: list[int] = []

        def flush() -> None:
            log_id, start = wanted[group[0]][0], wanted[group[0]][1]
            end = max(wanted[i][1] + HEADER.size + wanted[i][2] for i in group)
            block = memoryview(os.pread(self._reader(log_id), end - start, start))
            for i in group:
                _, offset, length, ledger_id, entry_id = wanted[i]
                record = block[offset - start:offset - start + HEADER.size + length]
                if not (verify(record).end == len(record) == HEADER.size + length and record[8] == PUT
                        and PUT_IDS.unpack_from(record, HEADER.size) == (ledger_id, entry_id)):
                    raise StorageError(f"entry log {log_path(self.folder, log_id)} offset {offset}: record of "
                                       f"ledger {ledger_id} entry {entry_id} is missing or corrupt")
                out[i] = bytes(record[_DATA:])

        group_end = 0
        for i in order:
            log_id, offset, length = wanted[i][0], wanted[i][1], wanted[i][2]
            if group and (log_id != wanted[group[0]][0] or offset > group_end + _COALESCE_GAP
                          or offset + HEADER.size + length - wanted[group[0]][1] > _COALESCE_MAX):
                flush()
                group = []
            group.append(i)
            group_end = max(group_end if len(group) > 1 else 0, offset + HEADER.size + length)
        if group:
            flush()
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
        """remove deletes finished logs (after a checkpoint that no longer lists them); returns bytes freed."""
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
            self._unsynced.discard(log_id)
            self._names_changed = True
        return freed
