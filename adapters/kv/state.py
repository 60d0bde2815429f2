"""walkit.adapters.kv.state holds the key-value state a node builds by applying log records (machine.py).

    state = State()
    result = state.apply(Set(b"k", b"v"), stamp_ms)     # OK
    state.get(b"k", now_ms)                              # b"v"

Keys live in a SortedDict, so KEYS and SCAN walk them in order and a prefix pattern only
visits its range. Expiry times are absolute (ms since the epoch) and kept in `expires`.

Determinism: `apply` depends only on the state and its arguments. Records see time only
through the record's stamp (the leader's clock, carried in the log), never through this
machine's clock, so every node applying the same records holds the same state and returns
the same results. Reads take `now` from the caller's clock: they decide what is visible, but
never change the state. Expired keys are removed by `purge_expired`, also at a stamp, so
removal is deterministic too.
"""

from __future__ import annotations

import re

from sortedcontainers import SortedDict, SortedList

from walkit.adapters.kv.patterns import compile_pattern, literal_prefix
from walkit.adapters.kv.records import GET, KEEPTTL, NX, XX, Delete, FlushDb, IncrBy, MSet, Set
from walkit.adapters.kv.resp import OK, ReplyError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_INTEGER = re.compile(rb"(?:0|-?[1-9][0-9]{0,19})\Z")

NOT_AN_INTEGER = "ERR value is not an integer or out of range"


def parse_int(text: bytes) -> int | None:
    """parse_int reads a Redis integer (int64, no sign '+', no leading zeros), or returns None."""
    if len(text) > 20 or not _INTEGER.match(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


class State:
    """State is the store's keys, values and expiry times, changed only by `apply` and `purge_expired`."""

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()
        self.expires: dict[bytes, int] = {}
        self._by_expiry: SortedList = SortedList()     # (expire_at, key) for every key in `expires`

    # -- reads ----------------------------------------------------------------------------
    def alive(self, key: bytes, now_ms: int) -> bool:
        """alive tells whether `key` exists and has not expired at `now_ms`."""
        if key not in self.data:
            return False
        expire_at = self.expires.get(key)
        return expire_at is None or expire_at > now_ms

    def get(self, key: bytes, now_ms: int) -> bytes | None:
        """get returns the value of `key`, or None if it is absent or expired at `now_ms`."""
        value = self.data.get(key)
        if value is None:
            return None
        expire_at = self.expires.get(key)
        return value if expire_at is None or expire_at > now_ms else None

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

    def scan(self, after: bytes | None, count: int, pattern: bytes | None, now_ms: int
             ) -> tuple[list[bytes], bytes | None]:
        """scan visits up to `count` keys after `after` in key order; it returns the matching ones
        and the last key visited (None once the end was reached)."""
        matcher = compile_pattern(pattern).match if pattern is not None else None
        prefix = literal_prefix(pattern) if pattern is not None else b""
        low = after if after is not None and after >= prefix else prefix
        inclusive = after is None or low != after
        found: list[bytes] = []
        visited = 0
        for key in self.data.irange(low, None, (inclusive, True)):
            if prefix and not key.startswith(prefix):
                return found, None
            visited += 1
            if (matcher is None or matcher(key)) and self.alive(key, now_ms):
                found.append(key)
            if visited >= count:
                return found, key
        return found, None

    def keys(self, pattern: bytes, now_ms: int) -> list[bytes]:
        """keys lists the keys alive at `now_ms` that match a Redis glob, in key order."""
        found, _ = self.scan(None, len(self.data) + 1, pattern, now_ms)
        return found

    # -- changes ------------------------------------------------------------------------------
    def apply(self, record, stamp_ms: int):
        """apply makes the change `record` describes at time `stamp_ms` and returns the reply value.

        Errors (for example INCR on a value that is not an integer) are returned as ReplyError,
        not raised: a record that fails changes nothing, on every node alike.
        """
        kind = type(record)
        if kind is Set:
            return self._set(record, stamp_ms)
        if kind is IncrBy:
            return self._incr(record.key, record.delta, stamp_ms)
        if kind is Delete:
            removed = 0
            for key in record.keys:
                if self.alive(key, stamp_ms):
                    removed += 1
                self._remove(key)
            return removed
        if kind is MSet:
            pairs = record.pairs
            for i in range(0, len(pairs), 2):
                self._store(pairs[i], pairs[i + 1], None)
            return OK
        if kind is FlushDb:
            self.data.clear()
            self.expires.clear()
            self._by_expiry.clear()
            return OK
        raise TypeError(f"not a record: {record!r}")

    def _set(self, record: Set, stamp_ms: int):
        key, flags = record.key, record.flags
        old = self.get(key, stamp_ms)
        if (flags & NX and old is not None) or (flags & XX and old is None):
            return old if flags & GET else None
        if flags & KEEPTTL and old is not None:
            expire_at = self.expires.get(key)
        else:
            expire_at = record.expire_at or None
        self._store(key, record.value, expire_at)
        return old if flags & GET else OK

    def _incr(self, key: bytes, delta: int, stamp_ms: int):
        old = self.get(key, stamp_ms)
        if old is None:
            self._remove(key)               # an expired key starts over, without its expiry
            current, expire_at = 0, None
        else:
            current = parse_int(old)
            if current is None:
                return ReplyError(NOT_AN_INTEGER)
            expire_at = self.expires.get(key)
        value = current + delta
        if not INT64_MIN <= value <= INT64_MAX:
            return ReplyError("ERR increment or decrement would overflow")
        self._store(key, b"%d" % value, expire_at)
        return value

    def _store(self, key: bytes, value: bytes, expire_at: int | None) -> None:
        old_expiry = self.expires.get(key)
        if old_expiry != expire_at:
            if old_expiry is not None:
                self._by_expiry.remove((old_expiry, key))
                del self.expires[key]
            if expire_at is not None:
                self.expires[key] = expire_at
                self._by_expiry.add((expire_at, key))
        self.data[key] = value

    def _remove(self, key: bytes) -> None:
        if self.data.pop(key, None) is not None:
            expire_at = self.expires.pop(key, None)
            if expire_at is not None:
                self._by_expiry.remove((expire_at, key))

    def purge_expired(self, stamp_ms: int, limit: int = 64) -> int:
        """purge_expired removes up to `limit` keys expired at `stamp_ms`, soonest first; it returns how many."""
        removed = 0
        while removed < limit and self._by_expiry and self._by_expiry[0][0] <= stamp_ms:
            _, key = self._by_expiry.pop(0)
            del self.expires[key]
            del self.data[key]
            removed += 1
        return removed

    # -- snapshots ------------------------------------------------------------------------------
    def copy_items(self) -> tuple[dict[bytes, bytes], dict[bytes, int]]:
        """copy_items returns plain copies of the values and expiry times (values are immutable bytes)."""
        return dict.copy(self.data), dict(self.expires)

    @classmethod
    def from_items(cls, items) -> "State":
        """from_items builds a state from (key, value, expire_at or 0) triples."""
        state = cls()
        data = {}
        for key, value, expire_at in items:
            data[key] = value
            if expire_at:
                state.expires[key] = expire_at
        state.data = SortedDict(data)
        state._by_expiry = SortedList((at, key) for key, at in state.expires.items())
        return state
