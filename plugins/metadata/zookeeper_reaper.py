"""walkit.plugins.metadata.zookeeper_reaper: the bookies' side of ZooKeeper's principal mode.

Every bookie runs a `Reaper` under the cluster's user (ZooKeeperMetadataStore.principal_agent). It
carries out what principals' stores ask for and may not do themselves
(walkit.plugins.metadata.zookeeper_principals, which holds the requests' layout): deletions of
ledgers and logs (deletion marker first), changes of someone else's ledger or log by a grantee
(put requests), and the making of a replicated name's own znodes.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time

from walkit.core.loglist import LogMetadata, check_log_name, log_key
from walkit.core.metadata import LEDGER_PREFIX, LedgerMetadata, deleted_key, deletion_marker
from walkit.deletions import delete_ledgers_of, forget_grants
from walkit.errors import BadVersion, ConfigError, MetadataError, NodeExists, NoSuchKey, PermissionDenied
from walkit.permissions import bound_log, check_change, check_ledger, check_log
from walkit.plugins.metadata.principals import PRINCIPAL
from walkit.plugins.metadata.zookeeper_principals import (
    DELETE_CHILD, DENIED, NAME_HINT, PUT_HINT, PUT_PREFIX, REFUSED, REQUEST_WINDOW_S, REQUESTS_PREFIX, _NONCE,
    commit_put, make_name, put_requester, requester_of,
)

log = logging.getLogger("walkit.deletions")


class Reaper:
    """Reaper carries out the deletions that principals ask for in ZooKeeper's principal mode.

    A principal's store may not delete a ledger's or a log's key (ZooKeeper checks a delete
    against the parent, so a principal that could delete one ledger could delete all of them,
    and deletion markers must be the cluster's alone: walkit.plugins.metadata.zookeeper_principals).
    It creates the child ``<key>/delete`` instead, which ZooKeeper lets only a principal holding
    create on that resource make, and a hint ``deletion-requests/<key>``. Every bookie runs a
    Reaper under the cluster's user: it watches the hints, and for each one whose request child
    exists it writes the ledger's deletion marker, then deletes the child and the key (a log's
    at the version asked for: a changed log keeps its key and loses the request, which the
    waiting principal reports as BadVersion). A hint without its request is dropped. A ledger
    is deleted whatever its version: the marker is written first, and the key must go after it.
    """

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._watch = store.watch(REQUESTS_PREFIX, lambda key: self.scan())
        self.scan()

    def scan(self) -> int:
        """scan carries out every request pending; it returns how many keys it deleted."""
        done = 0
        with self._lock:
            try:
                hints = self.store.children(REQUESTS_PREFIX)
            except MetadataError as exc:
                log.warning("deletion requests unreadable: %s", exc)
                return 0
            for hint in hints:
                try:
                    done += self._reap(hint)
                except MetadataError as exc:
                    log.warning("deletion request %s not carried out yet: %s", hint, exc)
                except Exception as exc:  # noqa: BLE001 - a principal wrote it: bad input must not stop the bookie
                    log.warning("dropped deletion request %r: %s", hint, exc)
                    try:
                        _forget(self.store, f"{REQUESTS_PREFIX}/{hint}")
                    except Exception:  # noqa: BLE001 - it stays, and is looked at again
                        pass
        return done

    def _reap(self, hint: str) -> int:
        store = self.store
        if hint.startswith(PUT_HINT):
            return self._put(hint)
        if hint.startswith(NAME_HINT):            # a replicated name's znodes, asked for by a principal's store
            name = hint.split("|")[1]
            check_log_name(f"replicated-{name}")
            make_name(store, name)
            _forget(store, f"{REQUESTS_PREFIX}/{hint}")
            return 0
        key = hint.rpartition("#")[0].replace("|", "/") if "#" in hint else hint.replace("|", "/")
        if not _deletable(key):
            log.warning("dropped deletion request %r: only a ledger's or a log's deletion is asked this way", hint)
            _forget(store, f"{REQUESTS_PREFIX}/{hint}")
            return 0
        done = 0
        child = f"{key}/{DELETE_CHILD}"
        try:
            request, _ = store.get(child)
            version = int(json.loads(request).get("version", -1))
        except NoSuchKey:
            version = None
        except ValueError:
            version = -1
        if version is not None and version not in (REFUSED, DENIED):
            fresh = self._fresh(child, f"{REQUESTS_PREFIX}/{hint}")
            if fresh is None:
                return 0                  # another bookie carried it out meanwhile
            if not fresh:
                # Made long before its hint: by a principal that held the right then, and may not now
                # (revoked since), so it no longer counts.
                log.warning("dropped deletion request %r: its request %s is older than its hint by more than %g s",
                            hint, child, REQUEST_WINDOW_S)
                _forget(store, child)
                version = None
        # The key's value and version as checked: what is deleted, and what its ledgers are deleted by, is that very
        # value (a principal that may write the key could change it between the check and the deletion).
        checked: tuple[bytes, int] | None = None
        if version is not None and version not in (REFUSED, DENIED):
            try:
                checked = store.get(key)
            except NoSuchKey:
                version = None
        if version is not None and version not in (REFUSED, DENIED) and not self._asked_by_holder(child, key,
                                                                                                     checked[0]):
            log.warning("refused deletion request %r: made by no principal that may delete %s now", hint, key)
            try:
                store.put(child, json.dumps({"version": DENIED}).encode(), store.get(child)[1])
            except (NoSuchKey, BadVersion):
                pass
            version = None
        if version is not None and version not in (REFUSED, DENIED):
            is_ledger = key.startswith(LEDGER_PREFIX)
            deleted_log = None if is_ledger else checked[0]
            try:
                if not is_ledger and version >= 0 and checked[1] != version:
                    raise BadVersion(key)
                if is_ledger:
                    try:
                        store.create(deleted_key(int(key[len(LEDGER_PREFIX):])), deletion_marker(int(time.time() * 1000)))
                    except NodeExists:
                        pass
                _forget(store, child)
                store.delete(key, None if is_ledger else checked[1])
                done = 1
                log.info("deleted %s as a principal asked", key)
                if not is_ledger:
                    forget_grants(store, key.partition("/")[2])
                    delete_ledgers_of(store, key.partition("/")[2], deleted_log)
            except NoSuchKey:
                pass
            except BadVersion:                # the log changed since: the asker is told (it waits on the child)
                refusal = json.dumps({"version": REFUSED}).encode()
                try:
                    store.put(child, refusal, store.get(child)[1])
                except NoSuchKey:
                    store.create(child, refusal)
        _forget(store, f"{REQUESTS_PREFIX}/{hint}")
        return done

    def _asked_by_holder(self, request: str, target: str, value: bytes, action: str = "delete") -> bool:
        """_asked_by_holder tells whether request znode `request` was made by a principal that may do `action` on
        `target`, whose value is `value`, now (read afresh: a grant revoked since the request was made counts no
        more)."""
        try:
            principal = requester_of(self.store, request)
        except NoSuchKey:
            return False
        return principal is not None and self._may(principal, target, action, value)

    def _may(self, principal: str, target: str, action: str, value: bytes | None = None) -> bool:
        """_may tells whether `principal` may do `action` on ledger or log `target` now (read afresh, unless its
        value `value` is given)."""
        try:
            value = self.store.get(target)[0] if value is None else value
            if target.startswith(LEDGER_PREFIX):
                check_ledger(self.store, principal, LedgerMetadata.from_bytes(value), action)
            else:
                check_log(self.store, principal, target.partition("/")[2], action, LogMetadata.from_bytes(value))
            return True
        except NoSuchKey:
            return True                   # gone: nothing is done
        except (PermissionDenied, ConfigError):
            return False

    def _put(self, hint: str) -> int:
        """_put carries out a put request (PUT_PREFIX): ZooKeeper let only a principal that may write the log make
        it; the change must leave what decides who holds the resource as it is (permissions.check_change)."""
        store, hint_key = self.store, f"{REQUESTS_PREFIX}/{hint}"
        log_name, _, rest = hint[len(PUT_HINT):].partition("|")
        principal, _, nonce = rest.partition("|")
        try:
            check_log_name(log_name)
            if not _NONCE.fullmatch(nonce) or not PRINCIPAL.fullmatch(principal):
                raise ConfigError(f"not a request's name: {rest!r}")
        except ConfigError as exc:
            log.warning("dropped put request %r: %s", hint, exc)
            _forget(store, hint_key)
            return 0
        key = f"{PUT_PREFIX}/{log_name}/{principal}/{nonce}"
        try:
            raw, version = store.get(key)
        except NoSuchKey:
            _forget(store, hint_key)
            return 0
        request = json.loads(raw)
        if not isinstance(request, dict) or "answer" in request:
            _forget(store, hint_key)
            return 0
        fresh = self._fresh(key, hint_key)
        if fresh is None:
            return 0
        answer = {"error": "denied", "message": f"the request is older than its hint by more than "
                                                f"{REQUEST_WINDOW_S:g} s"}
        if fresh and not put_requester(store, log_name, principal):
            answer = {"error": "denied", "message": f"{PUT_PREFIX}/{log_name} is not the cluster's making"}
        elif fresh:
            try:
                answer = self._change(log_name, principal, request, key, version)
            except MetadataError:
                raise
            except Exception as exc:  # noqa: BLE001 - a principal wrote it: answered, not repeated
                answer = {"error": "invalid", "message": f"not a valid request ({type(exc).__name__})"}
        if answer is not None and "version" not in answer:
            try:
                store.put(key, json.dumps({"answer": answer}).encode(), version)
            except (NoSuchKey, BadVersion):
                pass
        _forget(store, hint_key)
        return 1 if answer is not None and "version" in answer else 0

    def _change(self, log_name: str, principal: str, request: dict, key: str, request_version: int) -> dict | None:
        """_change makes the change `request` (at `key`, `request_version`) asks of log `log_name`'s key or one of its
        ledgers; it returns the answer (written with the change), or None when another reaper answered."""
        store, target = self.store, request.get("key")
        value = base64.b64decode(request.get("value") or "", validate=True)
        version = int(request.get("version", -1))
        try:
            current = store.get(target)[0] if isinstance(target, str) and _deletable(target) else None
        except NoSuchKey:
            return {"error": "missing", "message": f"no metadata key {target!r}"}
        if current is None or (target != log_key(log_name) and (
                not target.startswith(LEDGER_PREFIX) or bound_log(store, LedgerMetadata.from_bytes(current)) != log_name)):
            return {"error": "denied", "message": f"not log {log_name!r}'s key or one of its ledgers'"}
        if not self._may(principal, log_key(log_name), "roll") or self.store.children(key):
            return {"error": "denied", "message": f"made by no principal that may write log {log_name!r} now"}
        if version < 0:
            raise ValueError("a change names the version it changes")
        try:
            check_change(target, current, value, store)
        except PermissionDenied as exc:
            return {"error": "denied", "message": str(exc)}
        return commit_put(store, target, value, version, key, request_version)

    def _fresh(self, child: str, hint: str) -> bool | None:
        """_fresh tells whether the request `child` was made at most REQUEST_WINDOW_S before its hint (the
        store's own creation times; a store that keeps none counts every request fresh); None if either is gone."""
        created = getattr(self.store, "created_ms", None)
        if created is None:
            return True
        try:
            lag = created(hint) - created(child)
        except NoSuchKey:
            return None
        return 0 <= lag <= REQUEST_WINDOW_S * 1000

    def close(self) -> None:
        """close stops watching the requests."""
        self._watch.cancel()


def _deletable(key: str) -> bool:
    """_deletable tells whether `key` is what a principal may ask the reaper to delete: a ledger's key as
    ledger_key writes it, or a log's."""
    parts = key.split("/")
    if len(parts) != 2:
        return False
    if parts[0] == "logs":
        try:
            return check_log_name(parts[1]) == parts[1]
        except ConfigError:
            return False
    return key.startswith(LEDGER_PREFIX) and len(parts[1]) == 20 and parts[1].isascii() and parts[1].isdigit()


def _forget(store, key: str) -> None:
    try:
        store.delete(key)
    except NoSuchKey:
        pass
