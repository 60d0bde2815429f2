"""walkit.bookie.access decides, on a secured bookie, whether a principal may use a ledger.

A request needs `read` (plain reads and LAC reads) or `write` (adds, fencing reads, recovery
adds, explicit LACs) on its ledger (walkit.security). The bookie learns who may do what from
the metadata store, on the first request for a ledger, and caches it:

- the ledger's metadata must exist: a bookie never accepts a ledger id nobody created, so no
  one can claim (squat) future ledger ids by adding to them or fencing them first. A request is
  answered NO_SUCH_LEDGER only from a lookup that started after it arrived, so a squatter's
  requests cannot make the bookie refuse the real writer of a ledger created a moment later;
  concurrent requests for one missing ledger share one lookup;
- its owner has every right; for a ledger of a log (custom "log", or a replicated name's
  snapshot, whose log is ``replicated-<name>``: walkit.permissions.log_of), so does the log's
  owner and whoever the log's ACL grants the level, while the ledger is of the log's current
  instance (walkit.permissions.bound_log); a ledger created without security (no
  owner) is open to every allowed client;
- the principal must still be on the allow-list (a revoked client is refused at once, also on
  connections it opened before);
- metadata that exists but cannot be read or decoded (a store error, or a newer walkit's field)
  is UNREADABLE, answered IO_ERROR: never NO_SUCH_LEDGER, which a recovering client would count
  as "this bookie holds nothing of the ledger".

`decide` answers at once from the cache, or returns None after starting a lookup on a
background thread; `resolved()` hands the serving thread the ledgers whose lookups finished, so
it can run the requests it parked for them. ACL changes are watched and drop the cached grants.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from walkit.core.loglist import LogMetadata, log_key
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import NoSuchKey
from walkit.permissions import log_of, of_instance
from walkit.security import ACL_PREFIX, AllowList, grants, permits

log = logging.getLogger("walkit.bookie")

#: How many "ledger has no metadata" answers a bookie keeps (oldest dropped first).
MAX_MISSING = 4096

ALLOW, DENY, NO_LEDGER, UNREADABLE = "allow", "deny", "no-ledger", "unreadable"


class _Ledger:
    __slots__ = ("owner", "log", "log_owner")

    def __init__(self, owner: str, log_name: str | None, log_owner: str) -> None:
        self.owner = owner
        self.log = log_name
        self.log_owner = log_owner


class LedgerAccess:
    """LedgerAccess is one bookie's view of who may use which ledger (see the module doc)."""

    def __init__(self, store, allow_list: AllowList) -> None:
        self.store = store
        self.allow_list = allow_list
        self._ledgers: dict[int, _Ledger] = {}
        self._missing: dict[int, float] = {}
        self._unreadable: dict[int, tuple[float, str]] = {}     # ledger -> (lookup started, why)
        self._grants: dict[str, dict[str, str]] = {}
        self._looking: set[int] = set()
        self._done: deque[int] = deque()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="walkit-bookie-access")
        self._watch = store.watch(ACL_PREFIX, self._acl_changed)

    def decide(self, principal: str | None, ledger_id: int, needed: str, arrived: float) -> str | None:
        """decide returns ALLOW, DENY, NO_LEDGER or UNREADABLE, or None while the ledger is being looked up.

        `arrived` is when the request arrived (time.monotonic()): NO_LEDGER needs a lookup that
        started no earlier.
        """
        if not principal or principal not in self.allow_list:
            return DENY
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            missing = self._missing.get(ledger_id)
            if missing is not None and missing >= arrived:
                return NO_LEDGER
            unreadable = self._unreadable.get(ledger_id)
            if unreadable is not None and unreadable[0] >= arrived:
                return UNREADABLE
            self._look_up(ledger_id)
            return None
        if not ledger.owner or principal in (ledger.owner, ledger.log_owner):
            return ALLOW
        if ledger.log is None:
            return DENY
        level = self._grants.get(ledger.log)
        if level is None:                      # grants dropped by an ACL change: read them again
            self._look_up(ledger_id)
            return None
        return ALLOW if permits(level.get(principal), needed) else DENY

    def resolved(self) -> list[int]:
        """resolved returns the ledgers whose lookups finished since the last call."""
        done = []
        while self._done:
            done.append(self._done.popleft())
        return done

    def why_unreadable(self, ledger_id: int) -> str:
        """why_unreadable says why the ledger's metadata could not be read (for an UNREADABLE answer)."""
        found = self._unreadable.get(ledger_id)
        return found[1] if found is not None else "unknown"

    def forget(self, ledger_id: int) -> None:
        """forget drops what the bookie knew of a ledger (it was deleted)."""
        self._ledgers.pop(ledger_id, None)

    def close(self) -> None:
        self._watch.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _look_up(self, ledger_id: int) -> None:
        with self._lock:
            if ledger_id in self._looking:
                return
            self._looking.add(ledger_id)
        self._executor.submit(self._fetch, ledger_id)

    def _fetch(self, ledger_id: int) -> None:
        started = time.monotonic()
        try:
            try:
                metadata = LedgerMetadata.from_bytes(self.store.get(ledger_key(ledger_id))[0])
            except NoSuchKey:
                self._note_missing(ledger_id, started)
                return
            name = log_of(metadata)
            log_owner = ""
            if name is not None:
                try:
                    current = LogMetadata.from_bytes(self.store.get(log_key(name))[0])
                except NoSuchKey:
                    current = None
                if not of_instance(current, metadata):
                    name = None              # its log was deleted (and perhaps made again): its owner's alone
                elif current is not None:
                    log_owner = current.owner
            if name is not None:
                self._grants[name] = grants(self.store, name)
            self._missing.pop(ledger_id, None)
            self._unreadable.pop(ledger_id, None)
            self._ledgers[ledger_id] = _Ledger(metadata.owner, name, log_owner)
        except Exception as exc:  # noqa: BLE001 - unreadable, not missing; the lookup thread goes on
            log.warning("cannot read who may use ledger %d: %s", ledger_id, exc)
            with self._lock:
                self._unreadable.pop(ledger_id, None)
                self._unreadable[ledger_id] = (started, f"{type(exc).__name__}: {exc}")
                while len(self._unreadable) > MAX_MISSING:
                    del self._unreadable[next(iter(self._unreadable))]
        finally:
            with self._lock:
                self._looking.discard(ledger_id)
            self._done.append(ledger_id)

    def _note_missing(self, ledger_id: int, started: float) -> None:
        with self._lock:
            self._missing.pop(ledger_id, None)
            self._missing[ledger_id] = started
            while len(self._missing) > MAX_MISSING:
                del self._missing[next(iter(self._missing))]

    def _acl_changed(self, key: str) -> None:
        # Grants change when a log is deleted too (its grants go with it): what the bookie knew of its ledgers'
        # log and its owner may be stale, so it is looked up again as well.
        self._grants.clear()
        self._ledgers.clear()
