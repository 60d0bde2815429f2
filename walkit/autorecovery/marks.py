"""walkit.autorecovery.marks keeps auto-recovery's state in the metadata store.

Keys (all small JSON documents; every change is a create or a compare-and-swap):

    underreplicated/<ledger id>          a mark: {"bookies": {address: reason}, "marked_ms", "entries", "bytes"}
    autorecovery/locks/<ledger id>       ephemeral: the worker replicating that ledger now
    autorecovery/switch                  {"enabled": false} turns auto-recovery off cluster-wide
    autorecovery/bookies/<address>       bookies the auditor has seen: {"lost_since_ms": ms or null}
    autorecovery/decommission/<address>  bookies being decommissioned: {"started_ms": ms}
    autorecovery/status                  what the auditor last did (for `walkit auditor status`)

A mark names, per ledger, the bookies whose fragments must be repaired and why:
"lost" (not registered for `lost_bookie_delay`), "decommission" (an operator moves its data
away), "missing" (the bookie is alive but lacks entries it should hold: the periodic check
found them) and "new-disk" (the bookie serves from another disk than the fragment records:
its storage was emptied and formatted, `walkit bookies format-and-rejoin`, or it keeps nothing
across restarts; the entries are copied back to it and the fragment records its new disk, or,
while it is not registered, moved to another bookie). Marks are merged, never overwritten: two auditors (an old one not yet deposed and
its successor) only ever add bookies to a mark.

A worker holds a ledger's lock as an ephemeral registration while it copies entries and
rewrites the ledger's metadata; if the worker dies, the registration expires with its session
and another worker takes the ledger over from the start (copies are idempotent).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from walkit.errors import BadVersion, NodeExists, NoSuchKey

MARKS_PREFIX = "underreplicated"
ROOT = "autorecovery"
LOCKS_PREFIX = f"{ROOT}/locks"
SWITCH_KEY = f"{ROOT}/switch"
KNOWN_PREFIX = f"{ROOT}/bookies"
DECOMMISSION_PREFIX = f"{ROOT}/decommission"
STATUS_KEY = f"{ROOT}/status"

LOST = "lost"
DECOMMISSION = "decommission"
MISSING = "missing"
NEW_DISK = "new-disk"
REASONS = (LOST, DECOMMISSION, MISSING, NEW_DISK)


def now_ms() -> int:
    """now_ms is the wall clock in milliseconds (marks and loss times are compared across processes)."""
    return int(time.time() * 1000)


def mark_key(ledger_id: int) -> str:
    """mark_key is the metadata key of a ledger's under-replication mark."""
    return f"{MARKS_PREFIX}/{ledger_id:020d}"


@dataclass(frozen=True, slots=True)
class Mark:
    """Mark says which bookies of a ledger need repair: {address: reason}, and an estimate of the work.

    `entries` counts the entries those bookies held in the ledger's closed fragments (known
    from the metadata); `bytes` estimates their size from one sampled entry. `error` is the
    last reason a worker could not repair the ledger.
    """

    bookies: dict[str, str]
    marked_ms: int = 0
    entries: int = 0
    bytes: int = 0
    error: str = ""
    extra: dict = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """to_bytes encodes the mark for the metadata store."""
        doc = {"bookies": dict(sorted(self.bookies.items())), "marked_ms": self.marked_ms,
               "entries": self.entries, "bytes": self.bytes}
        if self.error:
            doc["error"] = self.error
        return json.dumps({**self.extra, **doc}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Mark":
        """from_bytes decodes a mark; fields it does not know are kept in `extra`."""
        doc = json.loads(data)
        known = {"bookies", "marked_ms", "entries", "bytes", "error"}
        return cls(bookies=dict(doc.get("bookies", {})), marked_ms=int(doc.get("marked_ms", 0)),
                   entries=int(doc.get("entries", 0)), bytes=int(doc.get("bytes", 0)), error=doc.get("error", ""),
                   extra={k: v for k, v in doc.items() if k not in known})


class UnderReplication:
    """UnderReplication reads and changes auto-recovery's keys in a MetadataStore (see the module doc)."""

    def __init__(self, store) -> None:
        self.store = store
        self.reads = 0            # metadata reads made through this object (the audit's cost)

    # -- marks ---------------------------------------------------------------------------
    def mark(self, ledger_id: int, bookies: dict[str, str], *, entries: int = 0, size: int = 0) -> bool:
        """mark adds `bookies` ({address: reason}) to the ledger's mark, creating it if needed.

        It returns True if the mark changed. A bookie already marked keeps its first reason,
        except that "decommission" wins over the others (it moves all of the bookie's data).
        """
        key = mark_key(ledger_id)
        while True:
            try:
                value, version = self._get(key)
            except NoSuchKey:
                mark = Mark(bookies=dict(bookies), marked_ms=now_ms(), entries=entries, bytes=size)
                try:
                    self.store.create(key, mark.to_bytes())
                    return True
                except NodeExists:
                    continue
            current = Mark.from_bytes(value)
            merged = dict(current.bookies)
            for address, reason in bookies.items():
                if address not in merged or reason == DECOMMISSION:
                    merged[address] = reason
            if merged == current.bookies:
                return False
            updated = Mark(bookies=merged, marked_ms=current.marked_ms, entries=max(current.entries, entries),
                           bytes=max(current.bytes, size), extra=current.extra)
            try:
                self.store.put(key, updated.to_bytes(), version)
                return True
            except (BadVersion, NoSuchKey):
                continue

    def get(self, ledger_id: int) -> tuple[Mark, int] | None:
        """get returns (mark, version) of a ledger, or None if it is not marked."""
        try:
            value, version = self._get(mark_key(ledger_id))
        except NoSuchKey:
            return None
        return Mark.from_bytes(value), version

    def ledger_ids(self) -> list[int]:
        """ledger_ids lists the marked ledgers, ascending."""
        self.reads += 1
        return sorted(int(name) for name in self.store.children(MARKS_PREFIX))

    def marks(self) -> dict[int, Mark]:
        """marks reads every mark (one read per marked ledger)."""
        found = {}
        for ledger_id in self.ledger_ids():
            got = self.get(ledger_id)
            if got is not None:
                found[ledger_id] = got[0]
        return found

    def settle(self, ledger_id: int, version: int, remaining: dict[str, str], error: str = "") -> bool:
        """settle replaces the mark read at `version` by `remaining` bookies, deleting it when none are left.

        It returns False if the mark changed meanwhile (an auditor added a bookie): the caller
        reads it again.
        """
        key = mark_key(ledger_id)
        try:
            if not remaining:
                self.store.delete(key, expected_version=version)
                return True
            value, current = self._get(key)
            if current != version:
                return False
            mark = Mark.from_bytes(value)
            self.store.put(key, Mark(bookies=remaining, marked_ms=mark.marked_ms, entries=mark.entries,
                                     bytes=mark.bytes, error=error, extra=mark.extra).to_bytes(), version)
            return True
        except (BadVersion, NoSuchKey):
            return False

    # -- locks ---------------------------------------------------------------------------
    def lock(self, ledger_id: int, worker: str):
        """lock takes the ledger's replication lock (an ephemeral key) or returns None if it is held."""
        try:
            return self.store.register(f"{LOCKS_PREFIX}/{ledger_id:020d}",
                                       json.dumps({"worker": worker, "since_ms": now_ms()}).encode())
        except NodeExists:
            return None

    def lock_holder(self, ledger_id: int) -> str | None:
        """lock_holder names the worker holding a ledger's lock, or None."""
        try:
            value, _ = self._get(f"{LOCKS_PREFIX}/{ledger_id:020d}")
        except NoSuchKey:
            return None
        return json.loads(value)["worker"]

    # -- the switch ----------------------------------------------------------------------
    def enabled(self) -> bool:
        """enabled is False while an operator turned auto-recovery off (`walkit auditor disable`)."""
        try:
            value, _ = self._get(SWITCH_KEY)
        except NoSuchKey:
            return True
        return bool(json.loads(value).get("enabled", True))

    def set_enabled(self, enabled: bool) -> None:
        """set_enabled turns auto-recovery on or off for the whole cluster."""
        self._upsert(SWITCH_KEY, {"enabled": bool(enabled), "changed_ms": now_ms()})

    # -- bookies the auditor knows --------------------------------------------------------
    def known_bookies(self) -> dict[str, int | None]:
        """known_bookies maps each bookie the auditor has seen to when it was found lost (None: alive)."""
        found = {}
        self.reads += 1
        for name in self.store.children(KNOWN_PREFIX):
            try:
                value, _ = self._get(f"{KNOWN_PREFIX}/{name}")
            except NoSuchKey:
                continue
            found[name] = json.loads(value).get("lost_since_ms")
        return found

    def set_known(self, address: str, lost_since_ms: int | None) -> None:
        """set_known records a bookie as seen alive (None) or lost since `lost_since_ms`."""
        self._upsert(f"{KNOWN_PREFIX}/{address}", {"lost_since_ms": lost_since_ms})

    def forget(self, address: str) -> None:
        """forget drops a bookie from the known ones (its fragments are marked, or it was decommissioned)."""
        try:
            self.store.delete(f"{KNOWN_PREFIX}/{address}")
        except NoSuchKey:
            pass

    # -- decommission --------------------------------------------------------------------
    def decommissioning(self) -> dict[str, dict]:
        """decommissioning maps each bookie being decommissioned to its record."""
        found = {}
        for name in self.store.children(DECOMMISSION_PREFIX):
            try:
                value, _ = self._get(f"{DECOMMISSION_PREFIX}/{name}")
            except NoSuchKey:
                continue
            found[name] = json.loads(value)
        return found

    def start_decommission(self, address: str) -> None:
        """start_decommission records that `address` is being decommissioned (it turns read-only)."""
        self._upsert(f"{DECOMMISSION_PREFIX}/{address}", {"started_ms": now_ms()})

    def end_decommission(self, address: str) -> None:
        """end_decommission removes the record (the bookie is writable again if it still runs)."""
        try:
            self.store.delete(f"{DECOMMISSION_PREFIX}/{address}")
        except NoSuchKey:
            pass

    # -- status --------------------------------------------------------------------------
    def status(self) -> dict:
        """status is what the auditor last published ({} if none ran)."""
        try:
            value, _ = self._get(STATUS_KEY)
        except NoSuchKey:
            return {}
        return json.loads(value)

    def publish_status(self, status: dict) -> None:
        """publish_status replaces the auditor's published status."""
        self._upsert(STATUS_KEY, status)

    # -- helpers -------------------------------------------------------------------------
    def _get(self, key: str) -> tuple[bytes, int]:
        self.reads += 1
        return self.store.get(key)

    def _upsert(self, key: str, doc: dict) -> None:
        value = json.dumps(doc, sort_keys=True).encode()
        while True:
            try:
                _, version = self.store.get(key)
            except NoSuchKey:
                try:
                    self.store.create(key, value)
                    return
                except NodeExists:
                    continue
            try:
                self.store.put(key, value, version)
                return
            except (BadVersion, NoSuchKey):
                continue
