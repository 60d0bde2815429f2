"""walkit.permissions is the one permission model every path that changes or reads data checks.

A resource is a log, a ledger, or a replicated name (whose log is ``replicated-<name>``). A
principal (walkit.security) holds a level on it: `read`, `write` or `admin`, each including
the lower ones. Who holds what:

- a resource without an owner (created on a cluster without security) is open: every caller
  holds `admin`, as before security existed;
- otherwise a caller without a principal, or whose principal is not on the allow-list (revoked),
  holds nothing;
- the owner of a ledger, of its log or of the replicated name's log holds `admin`;
- anyone else holds what ``security/acl/logs/<log>/<principal>`` grants on the ledger's log.
  A ledger belongs to a log when its custom metadata names one (``log``), or a replicated name
  (``replication``, its snapshots); a ledger of no log grants nothing to anyone but its owner.
  It belongs to one instance of that log: it records the log's owner and creation time
  (LogMetadata.ledger_custom), and once the log is deleted, a later log of the same name does not
  govern it (a ledger its log's deletion missed, unlisted by a writer, stays its owner's alone).

What each action needs (`NEEDS`):

    create      a ledger, or a log not created yet (it is then    on the allow-list
                the creator's), for a caller with a principal
    read        read entries, LACs, a log                         read
    append      add, fence, recover, open a log as its writer     write
    roll        start the next ledger of a log                    write
    truncate    drop whole ledgers or fragments before a position write
    delete      a ledger of a log (the log's writer deletes its   write
                own ledgers when it truncates, snapshots, rolls)
    delete      a ledger of no log, a whole log                   admin
    grant       grant or revoke on a log                          admin

`check` reads the metadata store every time (nothing is cached), so a revoked grant or client
is refused from the next call on. Bookies apply the same rules to adds, reads and fences
(walkit.bookie.access). The allow-list itself is changed by whoever holds the metadata store's
credentials (the operator), never through a principal's level.
"""

from __future__ import annotations

from walkit.core.loglist import LOG_CREATED, LOG_OWNER, LogMetadata, log_key
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.errors import NoSuchKey, PermissionDenied
from walkit.security import ACL_PREFIX, CLIENTS_PREFIX, LEVELS, permits

#: The level each action needs on a log's ledger (see the module doc: deleting a ledger of no log,
#: or a whole log, needs `admin`).
NEEDS = {"read": "read", "append": "write", "roll": "write", "truncate": "write", "delete": "write",
         "grant": "admin"}

#: The prefix of a replicated name's log (walkit.replication).
REPLICATED_PREFIX = "replicated-"


def log_of(metadata: LedgerMetadata) -> str | None:
    """log_of names the log whose grants govern a ledger (None for a ledger of no log)."""
    custom = metadata.custom
    if custom.get("log"):
        return custom["log"]
    if custom.get("replication"):
        return REPLICATED_PREFIX + custom["replication"]
    return None


def of_instance(log: LogMetadata | None, ledger: LedgerMetadata) -> bool:
    """of_instance says whether a ledger is of its log's current instance, `log` (None: the log is deleted;
    LogMetadata.holds). A ledger made before walkit recorded instances is of any log of its log's name."""
    return log.holds(ledger.custom) if log is not None else LOG_OWNER not in ledger.custom


def level(store, principal: str, *, owner: str, log: str | None = None,
          ledger: LedgerMetadata | None = None) -> str | None:
    """level is what `principal` holds on a resource owned by `owner` (of log `log`); None for nothing.

    For a ledger (`ledger`, of log `log`), the log counts only if the ledger is of its current
    instance (LogMetadata.holds): a ledger that outlived its log is its owner's alone.
    """
    return _level(store, principal, owner, log, ledger, _UNREAD)


#: `_level`'s "the log's metadata is not read yet".
_UNREAD = object()


def _level(store, principal: str, owner: str, log: str | None, ledger: LedgerMetadata | None, current) -> str | None:
    """_level is `level`, with the log's metadata `current` if the caller read it already (None: deleted)."""
    if not owner:
        return "admin"
    if not principal or not _allowed(store, principal):
        return None
    if principal == owner:
        return "admin"
    if log is None:
        return None
    if current is _UNREAD:
        current = _log(store, log)
    if ledger is not None and not of_instance(current, ledger):
        return None
    if current is not None and principal == current.owner:
        return "admin"
    try:
        found = store.get(f"{ACL_PREFIX}/{log}/{principal}")[0].decode()
    except NoSuchKey:
        return None
    return found if found in LEVELS else None


def bound_log(store, metadata: LedgerMetadata) -> str | None:
    """bound_log names the log whose grants govern a ledger: the log it names (log_of), if the ledger is of the
    log's current instance; None for a ledger of no log, or of a log deleted since (and perhaps made again)."""
    name = log_of(metadata)
    return name if name is not None and of_instance(_log(store, name), metadata) else None


def writes(store, principal: str, log: str) -> bool:
    """writes says whether `principal` may write log `log` now (its owner, or a `write` or `admin` grant; anyone on
    a log without an owner); False when the log does not exist."""
    current = _log(store, log)
    return current is not None and permits(_level(store, principal, current.owner, log, None, current), "write")


def check_ledger(store, principal: str, metadata: LedgerMetadata, action: str) -> None:
    """check_ledger raises PermissionDenied unless `principal` may do `action` on the ledger."""
    log = log_of(metadata)
    needed = NEEDS[action] if log is not None or action != "delete" else "admin"
    _check(level(store, principal, owner=metadata.owner, log=log, ledger=metadata), principal, needed, action,
           f"ledger {metadata.ledger_id}" + (f" of log {log!r}" if log else ""))


def check_log(store, principal: str, name: str, action: str, metadata: LogMetadata | None = None) -> None:
    """check_log raises PermissionDenied unless `principal` may do `action` on log `name`.

    A log not created yet is open to anyone who may create (`check_create`): it will be theirs.
    Its metadata may be passed in when the caller just read it.
    """
    if metadata is None:
        try:
            metadata = LogMetadata.from_bytes(store.get(log_key(name))[0])
        except NoSuchKey:
            check_create(store, principal, f"log {name!r}")
            return
    needed = "admin" if action == "delete" else NEEDS[action]
    _check(level(store, principal, owner=metadata.owner, log=name), principal, needed, action, f"log {name!r}")


def check_create(store, principal: str, resource: str) -> None:
    """check_create raises PermissionDenied when a caller with a principal off the allow-list creates
    `resource`: it could not use it, and would squat its name (a log's) or leave metadata behind.
    A caller without a principal creates as on a cluster without security (unowned, open)."""
    if principal and not _allowed(store, principal):
        raise PermissionDenied(f"principal {principal} may not create {resource}: it is not on the allow-list "
                               f"(`walkit clients allow {principal}`)", principal=principal, needed="create",
                               resource=resource)


def _check(held: str | None, principal: str, needed: str, action: str, resource: str) -> None:
    if permits(held, needed):
        return
    who = f"principal {principal}" if principal else "a client without a key"
    holds = f"holds {held}" if held else "holds nothing"
    hint = ("give the client its key (walkit.Client(url, key=...), `walkit --key FILE`, WALKIT_KEY)" if not principal
            else f"the owner or an admin may grant it: `walkit acl grant {principal} {needed} log NAME`")
    raise PermissionDenied(f"{who} may not {action} {resource}: that needs {needed}, and it {holds}; {hint}",
                           principal=principal, needed=needed, resource=resource)


def _allowed(store, principal: str) -> bool:
    try:
        store.get(f"{CLIENTS_PREFIX}/{principal}")
        return True
    except NoSuchKey:
        return False


def _log(store, name: str) -> LogMetadata | None:
    try:
        return LogMetadata.from_bytes(store.get(log_key(name))[0])
    except NoSuchKey:
        return None


def _log_owner(store, name: str) -> str:
    found = _log(store, name)
    return found.owner if found is not None else ""


def holders(store, *, owner: str, log: str | None = None) -> set[str]:
    """holders are the allowed principals that hold `write` or more on a resource owned by `owner` (of log
    `log`): its owner, its log's owner and the log's `write` and `admin` grants. An unowned resource has none
    (it is open to every caller through walkit, and the cluster's in a store that enforces principals)."""
    if not owner:
        return set()
    found = {owner}
    if log is not None:
        found.add(_log_owner(store, log))
        for principal in store.children(f"{ACL_PREFIX}/{log}"):
            try:
                held = store.get(f"{ACL_PREFIX}/{log}/{principal}")[0].decode()
            except (NoSuchKey, UnicodeDecodeError):
                continue
            if held in LEVELS and permits(held, "write"):
                found.add(principal)
    return {principal for principal in found if principal and _allowed(store, principal)}


def check_change(key: str, current: bytes, value: bytes, store=None) -> None:
    """check_change raises PermissionDenied when a change of ledger or log `key` from `current` to `value`, by
    a principal that may write it but does not own it (a grant), would change what decides who holds it: a
    ledger's id, owner or log (and the log instance it is of), a log's name, owner or creation time (which tell
    its instances apart); or would list in the log a ledger that is not the log's
    (read from `store`), which the owner's deletion of the log would then delete. Such changes would outlive
    the grant's revocation. Undecodable metadata raises what its decoder raises."""
    if key.startswith("logs/"):
        old, new = LogMetadata.from_bytes(current), LogMetadata.from_bytes(value)
        if (new.name, new.owner, new.created_ms) != (old.name, old.owner, old.created_ms):
            raise PermissionDenied(f"{key}: only its owner changes its name, owner or creation time", needed="owner",
                                   resource=key)
        for ledger_id in set(new.ledger_ids) - set(old.ledger_ids):
            try:
                added = LedgerMetadata.from_bytes(store.get(ledger_key(ledger_id))[0]) if store is not None else None
            except NoSuchKey:
                added = None
            if added is None or log_of(added) != new.name or not new.holds(added.custom):
                raise PermissionDenied(f"{key}: ledger {ledger_id} is not log {new.name!r}'s, so it is not added to it",
                                       needed="owner", resource=key)
        return
    old, new = LedgerMetadata.from_bytes(current), LedgerMetadata.from_bytes(value)
    if _governed(new) != _governed(old):
        raise PermissionDenied(f"{key}: only its owner changes its id, owner or log", needed="owner", resource=key)


def _governed(metadata: LedgerMetadata) -> tuple:
    """_governed is what decides who holds a ledger: its id, owner, log and the log instance it is of."""
    custom = metadata.custom
    return metadata.ledger_id, metadata.owner, log_of(metadata), custom.get(LOG_OWNER), custom.get(LOG_CREATED)
