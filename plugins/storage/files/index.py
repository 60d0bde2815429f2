"""walkit.plugins.storage.files.index maps entry ids to entry-log locations, on disk, per ledger.

Ledger L's index is ``index/<L as 16 hex digits>.idx``: a sparse file of fixed 16-byte slots,
slot e at offset e * 16::

    log id u32 | offset u64 | length u32                     (little-endian; all zero: absent)

Log ids start at 1, so a hole in the sparse file reads as "absent". A lookup is one
``os.pread``; slot writes are staged during a group commit and written per ledger as one
read-patch-write of the span of slots they cover. Index files are fsynced by checkpoints only: until then the
journal can rebuild every slot written since the last checkpoint.

Open files are kept in a small LRU, so thousands of ledgers do not need thousands of open files.

Slot e lives at byte e * 16, so entry ids stop at MAX_ENTRY_ID = 2^39 - 1: its slot ends at
8 TiB, half the largest file ext4 holds (16 TiB less one block). A ledger whose slots cannot be written (a disk error) is
reported in `failed` and its staged slots are dropped; other ledgers are not affected. A short
write (a disk that fills in the middle of one) is carried on until it is whole or fails, so no
slot is ever dropped without being reported.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict

from walkit.plugins.storage.files.disk import fsync_all, numbered_files, numbered_path, punch_hole

SLOT = struct.Struct("<IQI")            # log id, offset, length
#: The highest entry id an index file holds (its slot ends at 8 TiB; ext4 stops short of 16 TiB).
MAX_ENTRY_ID = (1 << 39) - 1
_FLUSH_AT = 1 << 16                     # write staged slots once this many are waiting
_SPAN_SLOTS = 4096                      # spans up to this many slots are rewritten whole


def index_path(folder: str, ledger_id: int) -> str:
    """index_path names the index file of `ledger_id` in `folder`."""
    return numbered_path(folder, ledger_id, "idx", 16)


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """_write_all writes all of `data` at `offset`: a short write is carried on, so it either completes or raises."""
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            written += os.pwrite(fd, view[written:], offset + written)


class LedgerIndex:
    """LedgerIndex reads and writes the per-ledger index files under `folder`."""

    def __init__(self, folder: str, open_files: int) -> None:
        """__init__ prepares the index files in `folder`, keeping at most `open_files` open."""
        self.folder = folder
        self.open_files = open_files
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._staged: dict[int, dict[int, bytes]] = {}
        self._staged_count = 0
        self._dirty: set[int] = set()
        self._names_changed = False
        self.failed: dict[int, str] = {}     # ledger -> why its slots could not be written

    def _fd(self, ledger_id: int, create: bool) -> int | None:
        """_fd returns an open descriptor of a ledger's index file (None if absent and not `create`)."""
        fd = self._fds.get(ledger_id)
        if fd is not None:
            self._fds.move_to_end(ledger_id)
            return fd
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            fd = os.open(index_path(self.folder, ledger_id), flags, 0o644)
        except FileNotFoundError:
            return None
        if create:
            self._names_changed = True
        self._fds[ledger_id] = fd
        while len(self._fds) > self.open_files:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def lookup(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """lookup returns (log id, offset, length) of an entry, or None if it has no slot."""
        staged = self._staged.get(ledger_id)
        slot = staged.get(entry_id) if staged else None
        if slot is None:
            fd = self._fd(ledger_id, create=False)
            if fd is None:
                return None
            slot = os.pread(fd, SLOT.size, entry_id * SLOT.size)
            if len(slot) < SLOT.size:
                return None
        location = SLOT.unpack(slot)
        return None if location[0] == 0 else location

    def lookup_many(self, ledger_id: int, entry_ids: list[int]) -> list[tuple[int, int, int] | None]:
        """lookup_many is `lookup` for many entries: one pread covers the span of their slots."""
        if len(entry_ids) < 2:
            return [self.lookup(ledger_id, e) for e in entry_ids]
        low, high = min(entry_ids), max(entry_ids)
        span = high - low + 1
        if span > _SPAN_SLOTS and span > 4 * len(entry_ids):
            return [self.lookup(ledger_id, e) for e in entry_ids]
        fd = self._fd(ledger_id, create=False)
        block = os.pread(fd, span * SLOT.size, low * SLOT.size) if fd is not None else b""
        staged = self._staged.get(ledger_id) or {}
        size, unpack = SLOT.size, SLOT.unpack_from
        found: list[tuple[int, int, int] | None] = []
        for entry_id in entry_ids:
            slot = staged.get(entry_id)
            if slot is not None:
                location = SLOT.unpack(slot)
            else:
                at = (entry_id - low) * size
                location = unpack(block, at) if at + size <= len(block) else (0, 0, 0)
            found.append(None if location[0] == 0 else location)
        return found

    def stage(self, ledger_id: int, slots: dict[int, bytes]) -> None:
        """stage records entries' locations, packed SLOT bytes by entry id (kept, not copied); `flush` writes them."""
        staged = self._staged.get(ledger_id)
        if staged is None:
            self._staged[ledger_id] = slots
            self._staged_count += len(slots)
        else:
            before = len(staged)
            staged.update(slots)
            self._staged_count += len(staged) - before
        if self._staged_count >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """flush writes the staged slots: per ledger, one read and one write of the span they cover.

        Striped ledgers leave gaps between a bookie's entry ids, so runs of consecutive ids are
        short; reading the span, patching it and writing it back costs two system calls per
        ledger instead of one per entry. Very sparse spans fall back to one write per run.
        """
        for ledger_id, slots in self._staged.items():
            try:
                self._write_slots(ledger_id, slots)
            except (OSError, OverflowError, ValueError) as exc:
                self.failed[ledger_id] = str(exc)
        self._staged.clear()
        self._staged_count = 0

    def take_failures(self) -> dict[int, str]:
        """take_failures returns and clears the ledgers whose slots could not be written."""
        failed, self.failed = self.failed, {}
        return failed

    def _write_slots(self, ledger_id: int, slots: dict[int, bytes]) -> None:
        """_write_slots writes one ledger's staged slots (see `flush`)."""
        size = SLOT.size
        fd = self._fd(ledger_id, create=True)
        ids = sorted(slots)
        low, span = ids[0], ids[-1] - ids[0] + 1
        if span <= _SPAN_SLOTS or span <= 4 * len(ids):
            block = bytearray(os.pread(fd, span * size, low * size))
            block.extend(bytes(span * size - len(block)))
            for entry_id in ids:
                at = (entry_id - low) * size
                block[at:at + size] = slots[entry_id]
            _write_all(fd, block, low * size)
        else:
            start = 0
            for i in range(1, len(ids) + 1):
                if i == len(ids) or ids[i] != ids[i - 1] + 1:
                    _write_all(fd, b"".join([slots[e] for e in ids[start:i]]), ids[start] * size)
                    start = i
        self._dirty.add(ledger_id)

    def drop(self, ledger_id: int) -> None:
        """drop deletes a ledger's index file and any slots staged for it."""
        self._staged_count -= len(self._staged.pop(ledger_id, ()))
        fd = self._fds.pop(ledger_id, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(index_path(self.folder, ledger_id))
            self._names_changed = True
        except FileNotFoundError:
            pass
        self._dirty.discard(ledger_id)

    def fsync(self) -> None:
        """fsync makes the slots written since the last fsync durable, and new or removed names."""
        fsync_all(*self.take_dirty())

    def take_dirty(self) -> tuple[list[str], list[str]]:
        """take_dirty writes staged slots and hands over what `fsync` would make durable, forgetting it.

        It returns the paths of the index files written since (the caller fsyncs them, on any
        thread, opening one at a time: thousands of ledgers need no thousands of descriptors)
        and the folder if names changed. A ledger deleted meanwhile needs no fsync.
        """
        self.flush()
        paths = [index_path(self.folder, ledger_id) for ledger_id in sorted(self._dirty)]
        self._dirty.clear()
        folders = [self.folder] if self._names_changed else []
        self._names_changed = False
        return paths, folders

    def trim(self, ledger_id: int, before: int) -> None:
        """trim drops a ledger's slots below `before`: staged ones, and written ones punched out of its file.

        Where the file system cannot punch holes the written slots stay (the storage never
        reads below a ledger's first entry); a punched file is fsynced by the next checkpoint.
        """
        staged = self._staged.get(ledger_id)
        if staged:
            for entry_id in [e for e in staged if e < before]:
                del staged[entry_id]
                self._staged_count -= 1
        fd = self._fd(ledger_id, create=False)
        if fd is not None and punch_hole(fd, 0, min(before, MAX_ENTRY_ID + 1) * SLOT.size):
            self._dirty.add(ledger_id)

    def keep_only(self, ledger_ids) -> None:
        """keep_only deletes the index files of ledgers not in `ledger_ids` (left by deletes)."""
        for ledger_id, _ in numbered_files(self.folder, "idx", 16):
            if ledger_id not in ledger_ids:
                self.drop(ledger_id)

    def close(self) -> None:
        """close writes staged slots and closes every file."""
        self.flush()
        while self._fds:
            os.close(self._fds.popitem()[1])
