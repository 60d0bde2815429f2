"""walkit.deletions: a deleted ledger leaves a marker, the positive sign bookies need to drop its data.

    delete_ledger(store, ledger_id)          marker first, then the metadata (Client.delete_ledger)
    was_deleted(store, ledger_id)            the bookie's garbage collection asks this
    prune(store, older_than_ms)              the auditor forgets old markers
    delete_ledgers_of(store, name, value)    the ledgers of a log a principal's deletion deleted

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

import dataclasses
import json
import logging
import time

from walkit.core.metadata import DELETED_PREFIX, deleted_key, deletion_marker, ledger_key
from walkit.errors import BadVersion, MetadataError, NodeExists, NoSuchKey, NoSuchLedger

log = logging.getLogger(__name__)

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


def delete_log_ledgers(store, deleted) -> list[int]:
    """delete_log_ledgers deletes (marker first) the ledgers a deleted log (its LogMetadata, `deleted`) listed that
    are the log's: of that instance of the log (LogMetadata.holds), or of no log and its owner's; a listed ledger
    of another log, instance or owner stays, with a warning (a log's list is written by its writers). It returns
    the ids deleted."""
    from walkit.core.metadata import LedgerMetadata
    from walkit.errors import WalkitError
    from walkit.permissions import log_of
    removed = []
    for ledger_id in deleted.ledger_ids:
        try:
            ledger = LedgerMetadata.from_bytes(store.get(ledger_key(ledger_id))[0])
            of = log_of(ledger)
            if not (of == deleted.name and deleted.holds(ledger.custom) or of is None and ledger.owner == deleted.owner):
                log.warning("log %r listed ledger %d (of log %r, owner %s): kept", deleted.name, ledger_id, of,
                            ledger.owner or "nobody")
                continue
            delete_ledger(store, ledger_id)
            removed.append(ledger_id)
        except WalkitError:
            continue
    return removed


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


def forget_grants(store, log_name: str) -> None:
    """forget_grants deletes the grants on a deleted log (a grant is none on the next log of that name)."""
    from walkit.security import forget_log
    try:
        forget_log(store, log_name)
    except MetadataError as exc:
        log.warning("the grants on deleted log %r stay (the cluster's user may not change grants: delete them with "
                    "`walkit acl revoke` as the operator): %s", log_name, exc)


def delete_ledgers_of(store, log_name: str, value: bytes | None) -> list[int]:
    """delete_ledgers_of deletes the ledgers of a log a principal had deleted (its metadata `value`), and a replicated
    name's snapshots and keys (`forget_name`), as `delete_log` does: a principal that deleted the key alone would
    leave them to the next owner of the name. It returns the ledger ids deleted."""
    from walkit.core.loglist import LogMetadata
    try:
        metadata = LogMetadata.from_bytes(value) if value else None
    except Exception:  # noqa: BLE001 - not log metadata: nothing listed
        metadata = None
    if metadata is None:
        return []
    metadata = dataclasses.replace(metadata, name=log_name)     # the key's name, not its value's
    return delete_log_ledgers(store, metadata) + forget_name(store, metadata)


#: Where a replicated name N keeps what it has besides its log ``replicated-N`` (walkit.replication): its snapshot
#: pointer and index, its election and the election's counter.
NAME_BASES = ("replication", "elections/replication", ".counters/elections/replication")


def forget_name(store, deleted) -> list[int]:
    """forget_name deletes, once log `deleted` (its LogMetadata) is deleted and if it is a replicated name's, the
    name's snapshot ledgers of that log and everything the name keeps besides its log, so that the next log of that
    name inherits none of it: not its pointer, its index, its election nor who may write them. A ledger the index
    names is deleted only if it is a snapshot of the name made for that very log (LogMetadata.holds): the index is
    written by every writer of the name, and could name any ledger. It returns the ledger ids deleted. What the
    store will not let this caller delete (a principal's store in principal mode, whose bookies did it) stays."""
    from walkit.core.loglist import LOG_OWNER
    from walkit.core.metadata import LedgerMetadata
    from walkit.permissions import REPLICATED_PREFIX
    if not deleted.name.startswith(REPLICATED_PREFIX):
        return []
    name = deleted.name[len(REPLICATED_PREFIX):]
    removed = []
    try:
        indexed = [child for child in store.children(f"replication/{name}/snapshots")
                   if len(child) == 20 and child.isascii() and child.isdigit()]
        for ledger_id in map(int, indexed):
            try:
                custom = LedgerMetadata.from_bytes(store.get(ledger_key(ledger_id))[0]).custom
            except NoSuchKey:
                continue
            if custom.get("replication") == name and LOG_OWNER in custom and deleted.holds(custom):
                delete_ledger(store, ledger_id)
                removed.append(ledger_id)
    except MetadataError as exc:
        log.debug("replicated name %r: its snapshots stay for the bookies to delete: %s", name, exc)
    for base in NAME_BASES:
        _delete_under(store, f"{base}/{name}")
    return removed


def _delete_under(store, key: str) -> None:
    """_delete_under deletes `key` and the keys under it, as far as the store lets it."""
    try:
        for child in store.children(key):
            _delete_under(store, f"{key}/{child}")
        store.delete(key)
    except NoSuchKey:
        pass
    except MetadataError as exc:
        log.debug("%s stays: %s", key, exc)
