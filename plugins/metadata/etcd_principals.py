"""walkit.plugins.metadata.etcd_principals gives every client principal an etcd user of its own.

Without it every process of a cluster shares one etcd user, so walkit's permissions
(walkit.permissions) hold only for processes that go through walkit. In *principal mode* a
client allowed with a metadata password (`walkit clients allow PRINCIPAL --metadata-password-file
FILE`) connects as etcd user PRINCIPAL (``etcd://PRINCIPAL@host:port/root?password_file=FILE``),
and etcd itself enforces the model with the user's role ``walkit<root>:<principal>`` (`role_of`):

- *Reads*: the role reads every key under the root. walkit's watches cover whole prefixes
  (``logs``, ``elections``), which etcd allows only to a role that reads all of them, and the
  metadata holds no data: bookies check every read of entries.
- *Writes*: readwrite on exactly the keys of the resources the principal holds `write` or
  `admin` on (`walkit.permissions.holders`): a ledger's key, a log's key, and a replicated name
  N's keys (``replication/N``, ``elections/replication/N``, ``.counters/elections/replication/N``,
  each with everything under it); plus the ledger id counter and its own request prefix
  ``principal-requests/<principal>/``.

etcd's roles are changed by its root alone, and a role that may create one new key under
``ledgers/`` may create or delete any key there. So a principal never creates or deletes a
ledger or a log itself: it writes a *request* under its prefix and waits for the answer, which
the *agent* (`Agent`, run by every bookie, whose etcd user holds etcd's root role) writes into
the request. The agent checks the request against walkit's permissions read afresh, creates
the key in one transaction with the request (a ledger only if no deletion marker has its id:
the id counter is every principal's to advance, so one could wind it back), gives every holder's
role the key and takes it from every other walkit role of the root, and only then answers. A
deletion writes the ledger's deletion marker first (markers are the agent's alone, so no
principal can have another's data collected) and takes the key from every role. A write the
role refuses (a replicated name not claimed yet, a grant the operator's pass has not reached)
is retried once after a ``sync`` request, which recomputes the resource's roles; the first
principal to sync a replicated name with no log yet claims it (``principal-names/N``).

etcd checks a delete like a put: a principal that may change a key may delete it. A `write`
grant on a log may therefore delete the log's key directly (its ledgers, and their data, stay;
in ZooKeeper a `write` grant can only change the log). Grants live in the metadata store
(walkit.security); `walkit acl grant/revoke` recomputes the roles of the log's resources at once
(`sync_log`), and `walkit clients revoke` deletes the principal's role (and its user when no
other root's role is left), so both take effect within the command, without restarts.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
import time

from etcd3gw.exceptions import Etcd3Exception

from walkit import permissions
from walkit.core.loglist import LogMetadata, log_key
from walkit.core.metadata import LEDGER_PREFIX, LedgerMetadata, deleted_key, deletion_marker
from walkit.errors import (BadVersion, ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey,
                           PermissionDenied)
from walkit.plugins.metadata import COUNTERS
from walkit.plugins.metadata.zookeeper_principals import MODE_KEY, PRINCIPAL, resource_of

log = logging.getLogger(__name__)

#: Where each principal writes its requests to the agent: ``principal-requests/<principal>/<nonce>``.
REQUESTS = "principal-requests"
#: Who claimed a replicated name before its log existed: ``principal-names/<name>`` holds the principal.
CLAIMS = "principal-names"
#: The ledger id counter every principal advances (walkit.client's next_id("ledger-id")).
LEDGER_ID_COUNTER = f"{COUNTERS}/ledger-id"
#: The keys of a replicated name N, each with everything under it.
NAME_BASES = ("replication", "elections/replication", f"{COUNTERS}/elections/replication")
#: How often a principal's store looks for the agent's answer.
ANSWER_POLL_S = 0.005


def role_of(root: str, principal: str) -> str:
    """role_of is the etcd role of `principal` under store root `root` (one per root: a user may be in several)."""
    return f"walkit{root}:{principal}"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(key: str) -> str:
    return key[:-1] + chr(ord(key[-1]) + 1)


# -- which keys a resource has ---------------------------------------------------------------------
def resource_keys(store, key: str) -> tuple[str, str, list[tuple[str, str]]] | None:
    """resource_keys names the resource `key` (relative to the root) belongs to, as (kind, its key or name,
    [(etcd key, range end or "")]); None for a key of no resource (shared: the cluster's)."""
    resource = resource_of(key)
    if resource is None:
        return None
    kind, log_name = resource
    if kind == "name":
        name = log_name[len(permissions.REPLICATED_PREFIX):]
        ranges = []
        for base in NAME_BASES:
            ranges.append((f"{store.root}/{base}/{name}", ""))
            low = f"{store.root}/{base}/{name}/"
            ranges.append((low, _prefix_end(low)))
        return kind, name, ranges
    return kind, key, [(f"{store.root}/{key}", "")]


def holders_of(store, kind: str, ident: str) -> set[str]:
    """holders_of are the principals whose roles get a resource's keys (see the module doc); none for a ledger
    or log that is gone or whose metadata (or its log's) does not decode. A store that cannot be read raises
    MetadataError: an answer of none would take the keys from every role."""
    if kind == "name":
        log_name = permissions.REPLICATED_PREFIX + ident
        value = _get(store, log_key(log_name))
        if not value:
            claimant = _get(store, f"{CLAIMS}/{ident}").decode(errors="replace")
            return _holders(store, lambda: claimant, None)
        return _holders(store, lambda: LogMetadata.from_bytes(value).owner, log_name)
    value = _get(store, ident)
    if not value:
        return set()
    if kind == "ledger":
        metadata = _decoded(LedgerMetadata.from_bytes, value)
        if metadata is None:
            return set()
        return _holders(store, lambda: metadata.owner, permissions.log_of(metadata))
    return _holders(store, lambda: LogMetadata.from_bytes(value).owner, ident.partition("/")[2])


def _holders(store, owner, log_name: str | None) -> set[str]:
    try:
        return permissions.holders(store, owner=owner(), log=log_name)
    except MetadataError:
        raise
    except Exception:  # noqa: BLE001 - metadata that is not walkit's (a principal may write its own): nobody's
        return set()


def _decoded(parse, value: bytes):
    try:
        return parse(value)
    except Exception:  # noqa: BLE001 - not walkit's metadata
        return None


# -- etcd's roles --------------------------------------------------------------------------------------
class Roles:
    """Roles are the walkit roles of one store root and the key ranges each may write, read once and kept in
    step with the changes made through it. The store's user must hold etcd's root role."""

    def __init__(self, store) -> None:
        self.store = store
        self.prefix = role_of(store.root, "")
        listed = auth_call(store, "/auth/role/list", {}) or {}
        self.perms: dict[str, set[tuple[str, str]]] = {}
        for role in listed.get("roles", ()):
            if role.startswith(self.prefix) and PRINCIPAL.fullmatch(role[len(self.prefix):]):
                got = auth_call(store, "/auth/role/get", {"role": role}, tolerate=("role name not found",))
                if got is not None:
                    self.perms[role] = {(_unb64(p.get("key")), _unb64(p.get("range_end")))
                                        for p in got.get("perm", ()) if p.get("permType") == "READWRITE"}

    def sync(self, ranges: list[tuple[str, str]], holders: set[str]) -> int:
        """sync gives `ranges` (readwrite) to the roles of `holders` and takes them from every other walkit role
        of the root; it returns how many grants and revocations it made."""
        changed = 0
        for role, held in self.perms.items():
            wanted = role[len(self.prefix):] in holders
            for key, end in ranges:
                if wanted and (key, end) not in held:
                    grant(self.store, role, key, end)
                    held.add((key, end))
                    changed += 1
                elif not wanted and (key, end) in held:
                    auth_call(self.store, "/auth/role/revoke", {"role": role, "key": _b64(key),
                                                               **({"range_end": _b64(end)} if end else {})},
                              tolerate=("permission is not granted", "role name not found"))
                    held.discard((key, end))
                    changed += 1
        return changed


def _unb64(text: str | None) -> str:
    return base64.b64decode(text).decode() if text else ""


def auth_call(store, path: str, body: dict, tolerate: tuple[str, ...] = ()) -> dict | None:
    """auth_call posts `body` to etcd's auth API at `path` through the store (retried while etcd cannot be
    reached); an error whose text holds one of `tolerate` answers None."""
    client = store._client

    def request():
        try:
            return client.post(client.get_url(path), json=body)
        except Etcd3Exception as exc:
            if any(text in (exc.detail_text or "") for text in tolerate):
                return None
            raise
    try:
        return store._call(f"change etcd's users and roles ({path})", request, idempotent=True)
    except MetadataNotAuthorized:
        raise MetadataNotAuthorized(f"etcd user {store.user!r} may not change etcd's users and roles: principal "
                                    f"mode needs etcd's root role for the operator's and the bookies' user "
                                    f"(`etcdctl user grant-role {store.user} root`)") from None


def grant(store, role: str, key: str, end: str = "", perm: str = "READWRITE") -> None:
    """grant gives `role` permission `perm` on `key` (to `end`, exclusive, if given)."""
    auth_call(store, "/auth/role/grant", {"name": role, "perm": {"permType": perm, "key": _b64(key),
                                                                 **({"range_end": _b64(end)} if end else {})}})


# -- the operator's side ---------------------------------------------------------------------------------
def give_identity(store, principal: str, password: str) -> None:
    """give_identity (a store of a user with etcd's root role) makes etcd user `principal` with `password` (or
    sets its password), gives it its role with what every principal has, and the keys of every resource it
    holds (one pass over the logs, ledgers and replicated names)."""
    if store._auth is None or not store._auth.token(store._client.session, store.timeout):
        raise ConfigError("etcd metadata: principal identities need etcd's authentication enabled and the store's "
                          "user in the URI (etcd://USER@host:port/root?password_file=...), a user with etcd's root "
                          "role; see docs/operations/security.md#etcd-principals")
    role = role_of(store.root, principal)
    if auth_call(store, "/auth/user/add", {"name": principal, "password": password},
                 tolerate=("user name already exists",)) is None:
        auth_call(store, "/auth/user/changepw", {"name": principal, "password": password})
    auth_call(store, "/auth/role/add", {"name": role}, tolerate=("role name already exists",))
    root = store.root + "/"
    grant(store, role, root, _prefix_end(root), "READ")
    grant(store, role, f"{store.root}/{LEDGER_ID_COUNTER}")
    requests = f"{store.root}/{REQUESTS}/{principal}/"
    grant(store, role, requests, _prefix_end(requests))
    auth_call(store, "/auth/user/grant", {"user": principal, "role": role})
    if not enabled(store):
        try:
            store.create(MODE_KEY, json.dumps({"etcd": True}).encode())
        except NodeExists:
            pass
    sync_all(store)


def enabled(store) -> bool:
    """enabled tells whether an operator gave a principal an etcd user under the store's root (principal mode)."""
    return bool(_get(store, MODE_KEY))


def forget(store, principal: str) -> None:
    """forget deletes `principal`'s role under the store's root, and its etcd user if it has no other role."""
    auth_call(store, "/auth/role/delete", {"role": role_of(store.root, principal)}, tolerate=("role name not found",))
    user = auth_call(store, "/auth/user/get", {"name": principal}, tolerate=("user name not found",))
    if user is not None and not user.get("roles"):
        auth_call(store, "/auth/user/delete", {"name": principal}, tolerate=("user name not found",))


def sync_all(store) -> int:
    """sync_all recomputes the roles of every log, ledger and replicated name; it returns the changes made."""
    roles = Roles(store)
    if not roles.perms:
        return 0
    changed = 0
    seen_names = set()
    for name in store.children("logs"):
        changed += _sync(store, roles, f"logs/{name}")
    for name in store.children(LEDGER_PREFIX.rstrip("/")):
        changed += _sync(store, roles, f"{LEDGER_PREFIX}{name}")
    for base in NAME_BASES:
        for name in store.children(base):
            if name not in seen_names:
                seen_names.add(name)
                changed += _sync(store, roles, f"{NAME_BASES[0]}/{name}")
    return changed


def sync_log(store, log_name: str) -> int:
    """sync_log recomputes the roles of one log's resources: its key, its ledgers (a replicated name's snapshot
    ledgers too) and a replicated name's keys. It returns the changes made."""
    from walkit.core.metadata import ledger_key
    from walkit.replication.snapshots import index_prefix
    roles = Roles(store)
    if not roles.perms:
        return 0
    changed = _sync(store, roles, log_key(log_name))
    ledger_ids: set[int] = set()
    try:
        ledger_ids.update(LogMetadata.from_bytes(store.get(log_key(log_name))[0]).ledger_ids)
    except NoSuchKey:
        pass
    if log_name.startswith(permissions.REPLICATED_PREFIX):
        name = log_name[len(permissions.REPLICATED_PREFIX):]
        changed += _sync(store, roles, f"{NAME_BASES[0]}/{name}")
        ledger_ids.update(int(child) for child in store.children(index_prefix(name)) if child.isdigit())
    for ledger_id in sorted(ledger_ids):
        changed += _sync(store, roles, ledger_key(ledger_id))
    return changed


def _sync(store, roles: Roles, key: str) -> int:
    found = resource_keys(store, key)
    if found is None:
        return 0
    kind, ident, ranges = found
    return roles.sync(ranges, holders_of(store, kind, ident))


# -- a principal's side --------------------------------------------------------------------------------
class Requests:
    """Requests is how a principal's store has the agent create, delete and sync the keys of its resources."""

    def __init__(self, store, principal: str) -> None:
        self.store = store
        self.principal = principal

    def handles(self, key: str) -> bool:
        """handles tells whether creating or deleting `key` goes through the agent (a ledger's or a log's key)."""
        found = resource_of(key)
        return found is not None and found[0] in ("ledger", "log")

    def create(self, key: str, value: bytes) -> int:
        """create has the agent create `key` with `value`; it returns the key's version."""
        answer = self._ask({"op": "create", "key": key, "value": base64.b64encode(bytes(value)).decode()})
        return int(answer["version"])

    def delete(self, key: str, expected_version: int | None) -> None:
        """delete has the agent delete `key` (at `expected_version` if given), a ledger's marker first."""
        self._ask({"op": "delete", "key": key, "version": -1 if expected_version is None else expected_version})

    def sync(self, key: str) -> bool:
        """sync has the agent recompute the roles of `key`'s resource (claiming a replicated name with no log yet);
        False if `key` belongs to no resource."""
        if resource_of(key) is None:
            return False
        self._ask({"op": "sync", "key": key})
        return True

    def _ask(self, request: dict) -> dict:
        store, key = self.store, f"{REQUESTS}/{self.principal}/{secrets.token_hex(8)}"
        what = f"{request['op']} {request['key']!r}"
        store.create(key, json.dumps(request).encode())
        deadline = time.monotonic() + store.timeout
        try:
            while time.monotonic() < deadline:
                answer = json.loads(store.get(key)[0]).get("answer")
                if answer is not None:
                    return _raise_for(answer, what)
                time.sleep(ANSWER_POLL_S)
        finally:
            try:
                store.delete(key)
            except MetadataError:
                pass                          # left behind: the agent answers it, and nobody reads it
        raise MetadataError(f"{what}: no answer within {store.timeout:g} s from the agent that carries out a "
                            f"principal's creations and deletions in etcd (every bookie runs it, with a user that "
                            f"holds etcd's root role); whether it was carried out is unknown")


def _raise_for(answer: dict, what: str) -> dict:
    error = answer.get("error")
    if error is None:
        return answer
    text = f"{what}: {answer.get('message') or error}"
    raise {"exists": NodeExists, "missing": NoSuchKey, "version": BadVersion}.get(error, MetadataNotAuthorized)(text)


# -- the cluster's side: the agent ------------------------------------------------------------------------
class Agent:
    """Agent carries out the requests of principals' stores (see the module doc); every bookie on etcd runs one.

    It watches ``principal-requests`` and also scans it when asked (`scan`, the bookie's GC loop calls it
    every few seconds). Several agents may serve one request: each step is a transaction that
    compares the request's revision, and giving roles their keys twice changes nothing.
    """

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._refused = False
        self._watch = store.watch(REQUESTS, lambda key: self.scan())
        self.scan()

    def scan(self) -> int:
        """scan serves every request not answered yet; it returns how many it answered."""
        store, served = self.store, 0
        with self._lock:
            try:
                principals = store.children(REQUESTS)
            except MetadataError as exc:
                log.warning("principal requests unreadable: %s", exc)
                return 0
            for principal in principals:
                try:
                    nonces = store.children(f"{REQUESTS}/{principal}")
                except MetadataError:
                    continue
                for nonce in nonces:
                    try:
                        served += self._serve(principal, f"{REQUESTS}/{principal}/{nonce}")
                    except MetadataNotAuthorized as exc:
                        if not self._refused:
                            log.error("principal requests are not carried out by this bookie: %s", exc)
                        self._refused = True
                        return served
                    except MetadataError as exc:
                        log.warning("principal request %s not carried out yet: %s", nonce, exc)
                    except Exception as exc:  # noqa: BLE001 - a principal wrote it: bad input must not stop the bookie
                        log.warning("refused principal request %s/%s: %s", principal, nonce, exc)
                        self._answer(f"{REQUESTS}/{principal}/{nonce}", None, {"error": "invalid",
                                                                              "message": f"not a valid request: {exc}"})
        return served

    def close(self) -> None:
        """close stops watching the requests."""
        self._watch.cancel()

    def _serve(self, principal: str, key: str) -> int:
        store = self.store
        try:
            raw, revision = store.get(key)
        except NoSuchKey:
            return 0
        request = json.loads(raw)
        if "answer" in request:
            return 0
        target = request["key"]
        if not isinstance(target, str):
            raise ValueError("the key is not a string")
        if not PRINCIPAL.fullmatch(principal) or not permissions._allowed(store, principal):
            return self._answer(key, revision, {"error": "denied", "message": f"principal {principal} is not on "
                                                                             f"the allow-list"})
        roles = Roles(store)                        # first: a user that may not change roles changes nothing
        if request.get("state") == "granting":      # created by an agent that stopped before it answered
            _sync(store, roles, target)
            return self._answer(key, revision, {"version": revision})
        if request.get("state") == "revoking":      # deleted by an agent that stopped before it answered
            _sync(store, roles, target)
            return self._answer(key, revision, {"deleted": True})
        op = request.get("op")
        if op == "create":
            return self._create(principal, key, revision, request, roles)
        if op == "delete":
            return self._delete(principal, key, revision, request, roles)
        if op == "sync":
            return self._sync_request(principal, key, revision, target, roles)
        raise ValueError(f"unknown op {op!r}")

    def _create(self, principal: str, key: str, revision: int, request: dict, roles: Roles) -> int:
        store, target, value = self.store, request["key"], base64.b64decode(request["value"])
        found = resource_of(target)
        if found is None or found[0] not in ("ledger", "log"):
            raise ValueError(f"{target!r} is not a ledger's or a log's key as walkit writes them")
        try:
            if found[0] == "ledger":
                metadata = LedgerMetadata.from_bytes(value)
                if target != f"{LEDGER_PREFIX}{metadata.ledger_id:020d}" or metadata.owner != principal:
                    raise PermissionDenied(f"ledger {target!r} must be ledger {metadata.ledger_id}'s, owned by the "
                                           f"principal that asks")
                log_name = permissions.log_of(metadata)
                if log_name is not None:
                    permissions.check_log(store, principal, log_name, "roll")
                guard = [deleted_key(metadata.ledger_id)]
            else:
                if LogMetadata.from_bytes(value).owner != principal:
                    raise PermissionDenied(f"log {target!r} must be owned by the principal that asks")
                name = target.partition("/")[2]
                if name.startswith(permissions.REPLICATED_PREFIX):
                    claimant = _get(store, f"{CLAIMS}/{name[len(permissions.REPLICATED_PREFIX):]}")
                    if claimant and claimant != principal.encode():
                        raise PermissionDenied(f"replicated name {name!r} was claimed by another principal")
                guard = []
        except PermissionDenied as exc:
            return self._answer(key, revision, {"error": "denied", "message": str(exc)})
        version = _create_with(store, target, value, key, revision, {**request, "state": "granting"}, guard)
        if version is None:                           # the request changed meanwhile: looked at again
            return 0
        if isinstance(version, str):
            why = {"exists": f"metadata key {target!r} already exists",
                   "guard": f"metadata key {target!r}: a ledger of that id was deleted (its deletion marker is "
                            f"kept), so the id is not used again"}[version]
            return self._answer(key, revision, {"error": "exists", "message": why})
        _sync(store, roles, target)
        return self._answer(key, version, {"version": version})

    def _delete(self, principal: str, key: str, revision: int, request: dict, roles: Roles) -> int:
        store, target, version = self.store, request["key"], int(request.get("version", -1))
        found = resource_of(target)
        if found is None or found[0] not in ("ledger", "log"):
            raise ValueError(f"{target!r} is not a ledger's or a log's key as walkit writes them")
        try:
            value = store.get(target)[0]
        except NoSuchKey:
            return self._answer(key, revision, {"error": "missing", "message": f"no metadata key {target!r}"})
        try:
            if found[0] == "ledger":
                metadata = LedgerMetadata.from_bytes(value)
                permissions.check_ledger(store, principal, metadata, "delete")
                try:
                    store.create(deleted_key(metadata.ledger_id), deletion_marker(int(time.time() * 1000)))
                except NodeExists:
                    pass
            else:
                permissions.check_log(store, principal, target.partition("/")[2], "delete",
                                      LogMetadata.from_bytes(value))
        except PermissionDenied as exc:
            return self._answer(key, revision, {"error": "denied", "message": str(exc)})
        outcome = _delete_with(store, target, version if found[0] == "log" else -1, key, revision,
                               {**request, "state": "revoking"})
        if outcome is None:                           # the request changed meanwhile (another agent): looked at again
            return 0
        if outcome == "missing":
            return self._answer(key, revision, {"error": "missing", "message": f"no metadata key {target!r}"})
        if outcome == "version":
            return self._answer(key, revision, {"error": "version", "message": f"metadata key {target!r} is not "
                                                                              f"at version {version}"})
        revision = outcome
        _sync(store, roles, target)
        log.info("deleted %s as principal %s asked", target, principal)
        return self._answer(key, revision, {"deleted": True})

    def _sync_request(self, principal: str, key: str, revision: int, target: str, roles: Roles) -> int:
        store = self.store
        found = resource_keys(store, target)
        if found is None:
            raise ValueError(f"{target!r} belongs to no ledger, log or replicated name")
        kind, ident, _ = found
        if kind == "name" and not _get(store, log_key(permissions.REPLICATED_PREFIX + ident)):
            try:
                store.create(f"{CLAIMS}/{ident}", principal.encode())
            except NodeExists:
                pass
        _sync(store, roles, target)
        return self._answer(key, revision, {"synced": True})

    def _answer(self, key: str, revision: int | None, answer: dict) -> int:
        """_answer writes `answer` into request `key` if it is still at `revision` (any revision if None: a request
        that does not parse, answered with its text dropped)."""
        store = self.store
        try:
            raw, current = store.get(key)
            if revision is not None and current != revision:
                return 0
            request = json.loads(raw) if revision is not None else {}
            store.put(key, json.dumps({**request, "answer": answer}).encode(), current)
            return 1
        except (NoSuchKey, BadVersion):
            return 0


def _create_with(store, target: str, value: bytes, request_key: str, revision: int, request: dict,
                 absent: list[str]) -> int | str | None:
    """_create_with creates `target` and rewrites the request in one transaction, if the request is still at
    `revision` and no key of `absent` exists. It returns the new version; "exists" or "guard" when `target` or a
    key of `absent` exists; None when the request changed."""
    from walkit.plugins.metadata.etcd import _compare, _found, _put, _range
    k, rk, guards = store._key(target), store._key(request_key), [store._key(a) for a in absent]
    result = store._txn(f"create {target!r}",
                        [_compare(k, "CREATE", 0), _compare(rk, "MOD", revision)] + [_compare(g, "CREATE", 0) for g in guards],
                        [_put(k, value), _put(rk, json.dumps(request).encode())],
                        [_range(k), _range(rk)] + [_range(g) for g in guards], idempotent=False)
    if result.get("succeeded"):
        return int(result["header"]["revision"])
    responses = result["responses"]
    if _found(responses[0]) is not None:
        return "exists"
    found = _found(responses[1])
    if found is None or int(found["mod_revision"]) != revision:
        return None
    return "guard"


def _delete_with(store, target: str, version: int, request_key: str, revision: int, request: dict) -> int | str | None:
    """_delete_with deletes `target` (at `version` if not negative) and rewrites the request in one transaction,
    if the request is still at `revision`. It returns the request's new revision; "missing" or "version" when
    `target` is absent or at another version; None when the request changed."""
    from walkit.plugins.metadata.etcd import _compare, _found, _put, _range
    k, rk = store._key(target), store._key(request_key)
    compare = [_compare(k, "CREATE", 0, "GREATER"), _compare(rk, "MOD", revision)]
    if version >= 0:
        compare.append(_compare(k, "MOD", version))
    result = store._txn(f"delete {target!r}", compare,
                        [{"request_delete_range": {"key": k}}, _put(rk, json.dumps(request).encode())],
                        [_range(k), _range(rk)], idempotent=False)
    if result.get("succeeded"):
        return int(result["header"]["revision"])
    responses = result["responses"]
    found = _found(responses[1])
    if found is None or int(found["mod_revision"]) != revision:
        return None
    return "missing" if _found(responses[0]) is None else "version"


def _get(store, key: str) -> bytes:
    try:
        return store.get(key)[0]
    except NoSuchKey:
        return b""
