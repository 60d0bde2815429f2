"""walkit.deletions: a deleted ledger leaves a marker, the positive sign bookies need to drop its data.

    delete_ledger(store, ledger_id)          marker first, then the metadata (Client.delete_ledger)
    was_deleted(store, ledger_id)            the bookie's garbage collection asks this
    prune(store, older_than_ms)              the auditor forgets old markers

A bookie never deletes a ledger because its metadata is missing: a typo in the metadata URI or
root, a fresh ZooKeeper, or a store restored from an old backup all look exactly like that,
and such a bookie would wipe itself. It drops a ledger's data only when the ledger's deletion
marker (`walkit.core.metadata.deleted_key`) exists, which is written before the metadata goes
(the log machine's deletions do the same through the dispatcher). Markers are small and kept
for `DEFAULT_RETENTION_S` (a bookie down longer than that keeps such a ledger's data until
an operator deletes it; it logs which ledgers it keeps and why). Ledgers deleted by a walkit
from before markers have none: their data stays on the bookies, and is listed in the log.
"""

from __future__ import annotations

import json
import time

from walkit.core.metadata import DELETED_PREFIX, deleted_key, deletion_marker, ledger_key
from walkit.errors import BadVersion, NodeExists, NoSuchKey, NoSuchLedger

#: How long deletion markers are kept: bookies that come back within it drop deleted ledgers.
DEFAULT_RETENTION_S = 7 * 24 * 3600.0


def delete_ledger(store, ledger_id: int) -> None:
    """delete_ledger marks `ledger_id` deleted, then deletes its metadata (NoSuchLedger if it has none)."""
    try:
        store.get(ledger_key(ledger_id))
    except NoSuchKey:
        raise NoSuchLedger(f"no ledger {ledger_id}") from None
    try:
        store.create(deleted_key(ledger_id), deletion_marker(int(time.time() * 1000)))
    except NodeExists:
        pass                                  # deleted before, or a retry
    try:
        store.delete(ledger_key(ledger_id))
    except NoSuchKey:
        raise NoSuchLedger(f"no ledger {ledger_id}") from None


def was_deleted(store, ledger_id: int) -> bool:
    """was_deleted tells whether the store holds `ledger_id`'s deletion marker."""
    try:
        store.get(deleted_key(ledger_id))
        return True
    except NoSuchKey:
        return False


def prune(store, older_than_ms: int) -> int:
    """prune deletes the markers written before `older_than_ms` (ms since the epoch); it returns how many."""
    pruned = 0
    for name in store.children(DELETED_PREFIX.rstrip("/")):
        key = f"{DELETED_PREFIX}{name}"
        try:
            value, version = store.get(key)
            if json.loads(value).get("deleted_ms", 0) < older_than_ms:
                store.delete(key, version)
                pruned += 1
        except (NoSuchKey, BadVersion, ValueError):
            continue
    return pruned
