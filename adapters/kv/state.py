"""walkit.adapters.kv.state holds the key-value state a node builds by applying log records (machine.py).

    state = State()
    state.store(b"k", b"v")                       # what SET does, through execute.py
    state.get_string(b"k", now_ms)                # b"v"

Keys live in a SortedDict in scan order (`scan_order`: a 64-bit hash of the key, then the key),
so SCAN walks them from a cursor that is a position in that order, the same on every server
(keyspace.py). A value is bytes (a string) or one of the containers below; expiry times are
absolute (ms since the epoch) and kept in `expires`.

Every change goes through `store`, `remove`, `set_expiry` or `writable` (the container a
command changes in place), and each of them first calls `_changing(key)`. That one hook keeps
two promises:

- WATCH (execute.py): the last TOUCH_WINDOW keys changed are kept with the index of the record
  that last changed them, so a transaction can tell whether a watched key changed after the
  index at which it was watched. The window is part of the state (and of
  snapshots), so every node decides alike; a watch older than the window aborts its EXEC.
- Snapshots without a stall (SnapshotView): a snapshot is taken key by key, a chunk at a time,
  while records go on being applied; a key about to change that the snapshot has not written
  yet is copied first, so the snapshot holds every key as it was when the snapshot began.

Determinism: changes depend only on the state and the record (its stamp is the time). Reads
take `now` from the caller's clock: they decide what is visible, never change the state.
Expired keys are removed by `purge_expired`, at a stamp, so removal is deterministic too.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import re

from sortedcontainers import SortedDict, SortedList

from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.resp import ReplyError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_INTEGER = re.compile(rb"(?:0|-?[1-9][0-9]{0,19})\Z")

NOT_AN_INTEGER = "ERR value is not an integer or out of range"
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
#: How many changed keys WATCH remembers (see the module doc). A snapshot copies them between two
#: records (about 4 ms for 10,000; 40 ms for 100,000, a stall of every write), so the memory is
#: kept short: a WATCH that outlives 10,000 other keys' changes aborts, and the client retries.
TOUCH_WINDOW = 10_000
#: How many collections' scan indexes (State.scan_index) are kept: the ones scanned last.
SCAN_INDEXES = 16


def scan_order(name: bytes) -> bytes:
    """scan_order is where a key (or a field, a member) comes in a scan: its 64-bit BLAKE2 hash, then
    itself. A SCAN cursor is the hash part, so it fits the unsigned 64 bits clients expect."""
    return hashlib.blake2b(name, digest_size=8).digest() + name


def parse_int(text: bytes) -> int | None:
    """parse_int reads a Redis integer (int64, no sign '+', no leading zeros), or returns None."""
    if len(text) > 20 or not _INTEGER.match(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


# -- values ------------------------------------------------------------------------------------
class Hash(dict):
    """Hash is a hash value: field -> value."""

    __slots__ = ()
    type_name = "hash"

    def copy(self) -> "Hash":
        return Hash(self)


class List(collections.deque):
    """List is a list value."""

    __slots__ = ()
    type_name = "list"

    def copy(self) -> "List":
        return List(self)


class SetValue(set):
    """SetValue is a set value."""

    __slots__ = ()
    type_name = "set"

    def copy(self) -> "SetValue":
        return SetValue(self)


class ZSet:
    """ZSet is a sorted set: `scores` maps member -> score, `order` holds (score, member) sorted as Redis orders them."""

    __slots__ = ("scores", "order")
    type_name = "zset"

    def __init__(self, pairs=()) -> None:
        self.scores: dict[bytes, float] = dict((member, score) for score, member in pairs)
        self.order = SortedList((score, member) for member, score in self.scores.items())

    def __len__(self) -> int:
        return len(self.scores)

    def add(self, member: bytes, score: float) -> None:
        """add sets `member`'s score."""
        old = self.scores.get(member)
        if old is not None:
            self.order.remove((old, member))
        self.scores[member] = score
        self.order.add((score, member))

    def discard(self, member: bytes) -> bool:
        """discard removes `member`; it tells whether it was there."""
        old = self.scores.pop(member, None)
        if old is None:
            return False
        self.order.remove((old, member))
        return True

    def copy(self) -> "ZSet":
        return ZSet(self.order)


def type_name(value) -> str:
    """type_name is what TYPE answers for a value."""
    return "string" if type(value) is bytes else value.type_name


class SnapshotView:
    """SnapshotView is a snapshot being written: the state's keys as they were when it began.

    `cursor` is the last key written (None before the first); `saved` holds the (value,
    expire_at) a key had when the snapshot began, for keys changed since that were not written
    yet (None as value: the key did not exist). `frozen` is set when FLUSHALL handed the old
    dict to the snapshot: nothing in it changes any more.
    """

    def __init__(self, data: SortedDict, expires: dict) -> None:
        self.data, self.expires = data, expires
        self.cursor: bytes | None = None        # the last key written (scan order)
        self._cursor_order = b""
        self.saved: SortedDict = SortedDict(scan_order)
        self.frozen = False

    def keep(self, key: bytes) -> None:
        """keep copies `key` as the snapshot must see it, unless it was written or copied already."""
        if (self.frozen or key in self.saved
                or (self.cursor is not None and scan_order(key) <= self._cursor_order)):
            return
        value = self.data.get(key)
        self.saved[key] = (value if value is None or type(value) is bytes else value.copy(),
                           self.expires.get(key, 0))

    def chunk(self, count: int, emit) -> bool:
        """chunk calls emit(key, value, expire_at) for the next items (about `count` of them) and tells
        whether they were the last. The caller holds the machine's lock (no record is applied
        meanwhile) and encodes the values in `emit` (containers change in place once it lets go).
        It makes few objects the collector tracks, so a snapshot does not bring on its pauses."""
        low = self.cursor
        keys = list(itertools.islice(self.data.irange(low, None, (False, True)), count))
        done = len(keys) < count
        end = None if done else keys[-1]
        saved = self.saved
        later = list(saved.irange(low, end, (False, True))) if saved else ()
        data, expires = self.data, self.expires
        for key in sorted(set(keys).union(later), key=scan_order) if later else keys:
            if key in saved:
                value, expire_at = saved.pop(key)
                if value is None:
                    continue                    # created after the snapshot began
                emit(key, value, expire_at)
            else:
                emit(key, data[key], expires.get(key, 0))
        if not done:
            self.cursor, self._cursor_order = end, scan_order(end)
        return done


class State:
    """State is the store's keys, values and expiry times, changed only through the methods below."""

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict(scan_order)
        self.expires: dict[bytes, int] = {}
        self._by_expiry: SortedList = SortedList()     # (expire_at, key) for every key in `expires`
        self.applying = 0                       # the index of the record being applied (machine.py)
        # key -> the index of the record that last changed it, least recently changed first
        self.touched: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.forgotten = 0                      # changes at or before this index may be forgotten
        self.views: list[SnapshotView] = []
        # key -> (collection, its size, its names' scan orders, sorted): State.scan_index
        self._scan_indexes: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()

    # -- reads ----------------------------------------------------------------------------
    def lookup(self, key: bytes, now_ms: int):
        """lookup returns the value of `key`, or None if it is absent or expired at `now_ms`."""
        value = self.data.get(key)
        if value is None:
            return None
        expire_at = self.expires.get(key)
        return value if expire_at is None or expire_at > now_ms else None

    def alive(self, key: bytes, now_ms: int) -> bool:
        """alive tells whether `key` exists and has not expired at `now_ms`."""
        return self.lookup(key, now_ms) is not None

    def get_string(self, key: bytes, now_ms: int) -> bytes | None:
        """get_string returns the string at `key` (None if absent); WRONGTYPE for another type."""
        value = self.lookup(key, now_ms)
        if value is None or type(value) is bytes:
            return value
        raise ReplyError(WRONGTYPE)

    def get_typed(self, key: bytes, now_ms: int, kind: type):
        """get_typed returns the value of type `kind` at `key` (None if absent); WRONGTYPE for another type."""
        value = self.lookup(key, now_ms)
        if value is None or type(value) is kind:
            return value
        raise ReplyError(WRONGTYPE)

    def ttl_ms(self, key: bytes, now_ms: int) -> int:
        """ttl_ms is the time `key` has left in ms: -1 without expiry, -2 if absent (Redis PTTL)."""
        if not self.alive(key, now_ms):
            return -2
        expire_at = self.expires.get(key)
        return -1 if expire_at is None else expire_at - now_ms

    def size(self, now_ms: int) -> int:
        """size counts the keys alive at `now_ms`."""
        expired = self._by_expiry.bisect_left((now_ms + 1,))
        return len(self.data) - expired

    def scan(self, cursor: int, count: int, pattern: bytes | None, now_ms: int,
             kind: str | None = None) -> tuple[list[bytes], int]:
        """scan visits about `count` keys in scan order from position `cursor`; it returns the
        matching ones (of type `kind`, if given) and the position to go on from (0 at the end).
        Keys sharing a position are visited together, so a scan always moves on."""
        matcher = compile_pattern(pattern).match if pattern is not None else None
        found: list[bytes] = []
        visited, edge = 0, None
        for key in self.data.irange_key(cursor.to_bytes(8, "big")):
            position = scan_order(key)[:8]
            if visited >= count and position != edge:
                return found, int.from_bytes(position, "big")
            visited, edge = visited + 1, position
            if matcher is None or matcher(key):
                value = self.lookup(key, now_ms)
                if value is not None and (kind is None or type_name(value) == kind):
                    found.append(key)
        return found, 0

    def keys(self, pattern: bytes, now_ms: int) -> list[bytes]:
        """keys lists the keys alive at `now_ms` that match a Redis glob, sorted."""
        found, _ = self.scan(0, len(self.data) + 1, pattern, now_ms)
        return sorted(found)

    def scan_index(self, key: bytes, names) -> list[bytes]:
        """scan_index is the scan orders of the fields or members `names` of the collection at `key`,
        sorted. It is kept until the key changes (for the SCAN_INDEXES collections scanned last), so
        a page of HSCAN, SSCAN or ZSCAN over a large collection costs a search and the page, not a
        sort of the whole collection."""
        indexes = self._scan_indexes
        kept = indexes.get(key)
        if kept is not None and kept[0] is names and kept[1] == len(names):
            indexes.move_to_end(key)
            return kept[2]
        index = sorted(map(scan_order, names))
        indexes[key] = (names, len(names), index)
        if len(indexes) > SCAN_INDEXES:
            indexes.popitem(last=False)
        return index

    # -- changes ------------------------------------------------------------------------------
    def _changing(self, key: bytes) -> None:
        """_changing runs before every change to `key` (see the module doc)."""
        for view in self.views:
            view.keep(key)
        if self._scan_indexes:
            self._scan_indexes.pop(key, None)
        touched = self.touched
        if key in touched:
            touched.move_to_end(key)
        touched[key] = self.applying
        if len(touched) > TOUCH_WINDOW:
            _, self.forgotten = touched.popitem(last=False)

    def changed_since(self, key: bytes, index: int) -> bool:
        """changed_since tells whether `key` may have changed after `index` records were applied
        (True also when the change would be older than what is remembered)."""
        return index < self.forgotten or self.touched.get(key, -1) > index

    def store(self, key: bytes, value, expire_at: int | None = None) -> None:
        """store sets `key` to `value`, expiring at `expire_at` (ms since the epoch; None: never)."""
        self._changing(key)
        self._set_expiry(key, expire_at)
        self.data[key] = value

    def keep_value(self, key: bytes, value) -> None:
        """keep_value sets `key` to `value` and keeps its expiry time."""
        self._changing(key)
        self.data[key] = value

    def writable(self, key: bytes, now_ms: int, kind: type, create: bool = True):
        """writable returns the container of type `kind` at `key` for a change in place (a new empty
        one, stored, if absent and `create`; None if absent otherwise); WRONGTYPE for another type.
        A command that empties it removes the key (`drop_if_empty`)."""
        value = self.lookup(key, now_ms)
        if value is None:
            if not create:
                return None
            self.remove(key)                    # an expired key starts over, without its expiry
            value = kind()
            self.store(key, value)
            return value
        if type(value) is not kind:
            raise ReplyError(WRONGTYPE)
        self._changing(key)
        return value

    def drop_if_empty(self, key: bytes) -> None:
        """drop_if_empty removes `key` if its container is empty (Redis never keeps an empty one)."""
        value = self.data.get(key)
        if value is not None and type(value) is not bytes and len(value) == 0:
            self.remove(key)

    def set_expiry(self, key: bytes, expire_at: int | None) -> None:
        """set_expiry makes `key` (which exists) expire at `expire_at` (None: never)."""
        self._changing(key)
        self._set_expiry(key, expire_at)

    def _set_expiry(self, key: bytes, expire_at: int | None) -> None:
        old_expiry = self.expires.get(key)
        if old_expiry != expire_at:
            if old_expiry is not None:
                self._by_expiry.remove((old_expiry, key))
                del self.expires[key]
            if expire_at is not None:
                self.expires[key] = expire_at
                self._by_expiry.add((expire_at, key))

    def remove(self, key: bytes) -> bool:
        """remove deletes `key` (expired or not); it tells whether the key was there."""
        if key not in self.data:
            return False
        self._changing(key)
        del self.data[key]
        expire_at = self.expires.pop(key, None)
        if expire_at is not None:
            self._by_expiry.remove((expire_at, key))
        return True

    def flush(self) -> None:
        """flush removes every key; a snapshot being written keeps the old ones (they are handed to it)."""
        for view in self.views:
            if not view.frozen:
                view.frozen = True
        if self.views:
            self.data, self.expires = SortedDict(scan_order), {}
        else:
            self.data.clear()
            self.expires.clear()
        self._by_expiry = SortedList()
        # Every key changed: a watch from before now is broken.
        self.touched.clear()
        self.forgotten = self.applying

    def purge_expired(self, stamp_ms: int, limit: int = 64) -> int:
        """purge_expired removes up to `limit` keys expired at `stamp_ms`, soonest first; it returns how many."""
        removed = 0
        while removed < limit and self._by_expiry and self._by_expiry[0][0] <= stamp_ms:
            self.remove(self._by_expiry[0][1])
            removed += 1
        return removed

    # -- snapshots ------------------------------------------------------------------------------
    def open_view(self) -> SnapshotView:
        """open_view starts a snapshot of the state as it is now (close_view when it was written)."""
        view = SnapshotView(self.data, self.expires)
        self.views.append(view)
        return view

    def close_view(self, view: SnapshotView) -> None:
        """close_view ends a snapshot: changes no longer copy keys for it."""
        if view in self.views:
            self.views.remove(view)

    def touch_window(self) -> tuple[int, list[tuple[bytes, int]]]:
        """touch_window is what WATCH remembers: (forgotten, the (key, index) of each changed key, least
        recently changed first), for snapshots (copied in C: a snapshot takes it between two records)."""
        return self.forgotten, list(self.touched.items())

    @classmethod
    def from_items(cls, items, touches=(0, ())) -> "State":
        """from_items builds a state from (key, value, expire_at or 0) triples and a touch window (touch_window)."""
        state = cls()
        data = {}
        for key, value, expire_at in items:
            data[key] = value
            if expire_at:
                state.expires[key] = expire_at
        state.data = SortedDict(scan_order, data)
        state._by_expiry = SortedList((at, key) for key, at in state.expires.items())
        state.forgotten, changes = touches
        state.touched.update(changes)
        return state
