"""walkit.core.sessions makes submits to walkit.replicate exactly-once: client sessions, as Raft's and etcd's.

A submit whose outcome the submitter does not know (a timeout, a leader that died) may or may not
be in the log, and a retry could apply it twice. A submitter that names itself (`client`, any
string) and numbers its records (`seq` 1, 2, 3, ... per client; a retry reuses the number)
avoids that: each record carries its Session in the log (walkit.core.batch), and every node
keeps, per client, the highest seq applied and that record's result (`SessionTable`). Applying a
record whose seq is not above its client's highest is skipped:

- the same seq: a duplicate; its submitter gets the first application's result, and nothing
  is applied again;
- a lower seq: a submit older than one already applied (the client moved on); it gets
  StaleSubmit and is not applied.

Sessions are part of snapshots (`to_bytes`/`from_bytes`), so a node restored from a snapshot
still knows them. A session idle for `ttl_ms` (by the stamps leaders put on entries that carry
sessions, so every node expires the same sessions at the same entry) is forgotten: a retry after
that applies again. Choose `ttl_ms` above the longest time a client may keep retrying.

Results are kept encoded (`encode_result`): None, booleans, integers, floats, strings, bytes,
lists, tuples and dicts of them, and exceptions (kept as their type name and message; a
duplicate gets DuplicateError carrying both). A result of another type is kept as its repr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from walkit.errors import ConfigError, DuplicateError, StaleSubmit

__all__ = ["DEFAULT_TTL_MS", "DuplicateError", "SessionTable", "StaleSubmit", "decode_result", "encode_result"]

#: How long a client session lives without a record by default: a day.
DEFAULT_TTL_MS = 24 * 3600 * 1000


def _pack(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": bytes(value).hex()}
    if isinstance(value, tuple):
        return {"t": [_pack(v) for v in value]}
    if isinstance(value, list):
        return [_pack(v) for v in value]
    if isinstance(value, dict):
        return {"d": [[_pack(k), _pack(v)] for k, v in value.items()]}
    if isinstance(value, BaseException):
        return {"e": [type(value).__name__, str(value)]}
    return {"r": repr(value)}


def _unpack(value):
    if isinstance(value, list):
        return [_unpack(v) for v in value]
    if not isinstance(value, dict):
        return value
    (kind, body), = value.items()
    if kind == "b":
        return bytes.fromhex(body)
    if kind == "t":
        return tuple(_unpack(v) for v in body)
    if kind == "d":
        return {_unpack(k): _unpack(v) for k, v in body}
    if kind == "e":
        return DuplicateError(body[1], body[0])
    return body                                   # "r": the repr


def encode_result(value) -> str:
    """encode_result keeps a record's result (or exception) for its duplicates (see the module doc)."""
    return json.dumps(_pack(value), separators=(",", ":"))


def decode_result(text: str):
    """decode_result is what a duplicate gets: the kept result, or a DuplicateError for an exception."""
    return _unpack(json.loads(text))


@dataclass(slots=True)
class _Client:
    seq: int            # the highest seq applied
    result: str         # its result, encoded
    last_ms: int        # the stamp of the entry that last carried a record of this client
    pending: object = None   # while the record is being applied: its entry (the result is not known yet)


class SessionTable:
    """SessionTable is what every node knows of client sessions, as of the last entry it applied.

    `check(session, stamp_ms)` before a record is applied says what to do with it; `applied`
    records a new record's result afterwards. Both must see the entries in log order: the
    table is part of the replicated state (snapshotted with it).
    """

    NEW, DUPLICATE, STALE = "new", "duplicate", "stale"

    def __init__(self, ttl_ms: int = DEFAULT_TTL_MS) -> None:
        if ttl_ms <= 0:
            raise ConfigError(f"the session ttl must be positive, got {ttl_ms}")
        self.ttl_ms = ttl_ms
        self._clients: dict[str, _Client] = {}
        self._stamp = 0                 # the latest entry stamp seen (stamps only grow)

    def __len__(self) -> int:
        return len(self._clients)

    def expire(self, stamp_ms: int) -> None:
        """expire forgets the sessions idle for ttl_ms as of an entry stamped `stamp_ms` (0: no stamp)."""
        if stamp_ms <= self._stamp:
            return
        self._stamp = stamp_ms
        gone = [c for c, s in self._clients.items() if stamp_ms - s.last_ms > self.ttl_ms]
        for client in gone:
            del self._clients[client]

    def check(self, client: str, seq: int) -> tuple[str, object]:
        """check returns (NEW, None), (DUPLICATE, the first result) or (STALE, StaleSubmit) for a record."""
        known = self._clients.get(client)
        if known is None or seq > known.seq:
            return self.NEW, None
        if seq == known.seq:
            if known.pending is not None:
                raise AssertionError(f"client {client!r}'s submit {seq} was asked for while its result is pending")
            return self.DUPLICATE, decode_result(known.result)
        return self.STALE, StaleSubmit(f"submit {seq} of client {client!r} is older than submit {known.seq}, "
                                       f"applied already")

    def applied(self, client: str, seq: int, result, stamp_ms: int, pending: object = None) -> None:
        """applied records that `client`'s record `seq` was applied with `result`; with `pending` (its entry's
        position), that it is being applied and its result comes later, through `settle`."""
        self._clients[client] = _Client(seq, "" if pending is not None else encode_result(result),
                                        max(stamp_ms, self._stamp), pending)

    def settle(self, client: str, seq: int, pending: object, result) -> None:
        """settle records the result of `client`'s record `seq`, applied as part of entry `pending` (if the table
        still waits for it: a later record of the client, or the session's expiry, may have replaced it)."""
        known = self._clients.get(client)
        if known is not None and known.seq == seq and known.pending == pending:
            known.result, known.pending = encode_result(result), None

    def awaits(self, sessions) -> bool:
        """awaits tells whether a record of `sessions` (an entry's) duplicates one whose result is pending."""
        clients = self._clients
        for session in sessions:
            if session is not None:
                known = clients.get(session.client)
                if known is not None and known.pending is not None and known.seq == session.seq:
                    return True
        return False

    def touch(self, client: str, stamp_ms: int) -> None:
        """touch keeps a session alive (a duplicate or stale record of it was seen)."""
        known = self._clients.get(client)
        if known is not None:
            known.last_ms = max(known.last_ms, stamp_ms)

    def to_bytes(self) -> bytes:
        """to_bytes encodes the table for a snapshot."""
        if any(s.pending is not None for s in self._clients.values()):
            raise AssertionError("a session table with results pending was snapshotted")
        return json.dumps({"ttl_ms": self.ttl_ms, "stamp": self._stamp,
                           "clients": {c: [s.seq, s.result, s.last_ms] for c, s in self._clients.items()}},
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, ttl_ms: int | None = None) -> "SessionTable":
        """from_bytes decodes a table `to_bytes` wrote (with this node's `ttl_ms`, if given)."""
        doc = json.loads(data)
        table = cls(ttl_ms or doc["ttl_ms"])
        table._stamp = doc["stamp"]
        table._clients = {c: _Client(seq, result, last) for c, (seq, result, last) in doc["clients"].items()}
        return table

    def __eq__(self, other) -> bool:
        return (isinstance(other, SessionTable) and self._stamp == other._stamp
                and {c: (s.seq, s.result, s.last_ms) for c, s in self._clients.items()}
                == {c: (s.seq, s.result, s.last_ms) for c, s in other._clients.items()})
