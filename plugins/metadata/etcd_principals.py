"""walkit.plugins.metadata.etcd_principals gives every client principal an etcd user of its own.

Without it every process of a cluster shares one etcd user, so walkit's permissions
(walkit.permissions) hold only for processes that go through walkit. In *principal mode* a
client allowed with a metadata password (`walkit clients allow PRINCIPAL --metadata-password-file
FILE`) connects as etcd user PRINCIPAL (``etcd://PRINCIPAL@host:port/root?password_file=FILE``),
and etcd itself enforces the model with the user's role ``walkit<root>:<principal>`` (`role_of`):

- *Reads*: the role reads every key under the root. walkit's watches cover whole prefixes
  (``logs``, ``elections``), which etcd allows only to a role that reads all of them, and the
  metadata holds no data: bookies check every read of entries.
- *Writes*: readwrite on the keys of the ledgers and logs the principal owns, on a replicated
  name N's keys (``replication/N``, ``elections/replication/N``, ``.counters/elections/replication/N``,
  each with everything under it) when it holds `write` or `admin` on N's log
  (`walkit.permissions.holders`), and on its own request prefix ``principal-requests/<principal>/``.
  A ledger or log of someone else's that the principal may write (a grant) it changes through the
  agent, which refuses a change of the owner, the log or the id: the owner is in the value, and a
  principal that could rewrite it would keep the resource after its grant is revoked.

etcd's roles are changed by its root alone, and a role that may create one new key under
``ledgers/`` may create or delete any key there. So a principal never creates or deletes a
ledger or a log itself, nor draws a ledger id: it writes a *request* under its prefix and waits
for the answer, which the *agent* (`Agent`, run by every bookie, whose etcd user holds etcd's
root role) writes into the request. The agent checks the request against walkit's permissions
read afresh; creating, it first takes the key from every walkit role of the root (one deleted
directly may have left its old holders the key), creates it in one transaction with the request
(a ledger only if no deletion marker has its id), gives the asker's role the key, and only then
answers. A deletion writes the ledger's deletion marker first, for the id of the key (markers
are the agent's alone, so no principal can have another's data collected), and takes the key
from every role. A write the role refuses (a replicated name not claimed yet, a grant the
operator's pass has not reached) is retried once after a ``sync`` request, which recomputes the
resource's roles; the first principal to sync a replicated name with no log yet claims it
(``principal-names/N``).

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
import re
import secrets
import threading
import time
from typing import Callable

from etcd3gw.exceptions import Etcd3Exception

from walkit import permissions
from walkit.core.loglist import LogMetadata, check_log_name, log_key
from walkit.core.metadata import LEDGER_PREFIX, LedgerMetadata, deleted_key, deletion_marker, ledger_key
from walkit.errors import (BadVersion, ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey,
                           PermissionDenied)
from walkit.deletions import NAME_BASES
from walkit.plugins.metadata import COUNTERS
from walkit.plugins.metadata.principals import MODE_KEY, PRINCIPAL, resource_of, value_of

log = logging.getLogger(__name__)

#: Where each principal writes its requests to the agent: ``principal-requests/<principal>/<nonce>``.
REQUESTS = "principal-requests"
#: Who claimed a replicated name before its log existed: ``principal-names/<name>`` holds the principal.
CLAIMS = "principal-names"
#: The ledger id counter every principal advances (walkit.client's next_id("ledger-id")).
LEDGER_ID_COUNTER = f"{COUNTERS}/ledger-id"
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
    """holders_of are the principals whose roles get a resource's keys (see the module doc): a ledger's or a
    log's owner alone (whoever else may change it asks the agent, which keeps the owner as it is); a replicated
    name's, everyone who may write its log. None for a resource that is gone or whose metadata does not
    decode. A store that cannot be read raises MetadataError: an answer of none would take the keys from every
    role."""
    if kind == "name":
        log_name = permissions.REPLICATED_PREFIX + ident
        value = value_of(store, log_key(log_name))
        if not value:
            claimant = value_of(store, f"{CLAIMS}/{ident}").decode(errors="replace")
            return _holders(store, lambda: claimant, None)
        return _holders(store, lambda: LogMetadata.from_bytes(value).owner, log_name)
    value = value_of(store, ident)
    if not value:
        return set()
    parse = LedgerMetadata.from_bytes if kind == "ledger" else LogMetadata.from_bytes
    return _holders(store, lambda: parse(value).owner, None)


def _holders(store, owner, log_name: str | None) -> set[str]:
    try:
        return permissions.holders(store, owner=owner(), log=log_name)
    except MetadataError:
        raise
    except Exception:  # noqa: BLE001 - metadata that is not walkit's (a principal may write its own): nobody's
        return set()


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
def check_can_give(store) -> None:
    """check_can_give raises unless the store's user may give principals etcd users: etcd's authentication is on
    and the user holds etcd's root role (MetadataNotAuthorized says so)."""
    if store._auth is None or not store._auth.token(store._client.session, store.timeout):
        raise ConfigError("etcd metadata: principal identities need etcd's authentication enabled and the store's "
                          "user in the URI (etcd://USER@host:port/root?password_file=...), a user with etcd's root "
                          "role; see docs/operations/security.md#etcd-principals")
    auth_call(store, "/auth/role/list", {})


def give_identity(store, principal: str, password: str) -> None:
    """give_identity (a store of a user with etcd's root role) makes etcd user `principal` with `password` (or
    sets its password), gives it its role with what every principal has, and the keys of every resource it
    holds (one pass over the logs, ledgers and replicated names)."""
    check_can_give(store)
    role = role_of(store.root, principal)
    if auth_call(store, "/auth/user/add", {"name": principal, "password": password},
                 tolerate=("user name already exists",)) is None:
        auth_call(store, "/auth/user/changepw", {"name": principal, "password": password})
    auth_call(store, "/auth/role/add", {"name": role}, tolerate=("role name already exists",))
    root = store.root + "/"
    grant(store, role, root, _prefix_end(root), "READ")
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
    return bool(value_of(store, MODE_KEY))


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
    # Keys deleted directly (a holder may: etcd tells no delete from a write) leave their roles' keys behind.
    low = store.root + "/"
    for held in roles.perms.values():
        for key, end in list(held):
            found = resource_of(key[len(low):]) if key.startswith(low) and not end else None
            if found is not None and found[0] in ("ledger", "log") and not value_of(store, key[len(low):]):
                changed += roles.sync([(key, end)], set())
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


def _forget_claim(store, name: str) -> None:
    try:
        store.delete(f"{CLAIMS}/{name}")
    except NoSuchKey:
        pass


def _sync(store, roles: Roles, key: str) -> int:
    found = resource_keys(store, key)
    if found is None:
        return 0
    kind, ident, ranges = found
    return roles.sync(ranges, holders_of(store, kind, ident))


# -- a principal's side --------------------------------------------------------------------------------
class Requests:
    """Requests is how a principal's store has the agent create, delete, change and sync the keys of its
    resources, and draw ledger ids."""

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

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put has the agent change `key` at `expected_version` (a resource of someone else's this principal may
        write: the agent keeps its owner); it returns the new version."""
        answer = self._ask({"op": "put", "key": key, "value": base64.b64encode(bytes(value)).decode(),
                            "version": expected_version})
        return int(answer["version"])

    def next_id(self) -> int:
        """next_id has the agent draw the next ledger id (the counter is the cluster's: nobody winds it back)."""
        return int(self._ask({"op": "next-id", "key": LEDGER_ID_COUNTER})["value"])

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
    compares the request's revision, and giving roles their keys twice changes nothing. A request
    is a principal's input: whatever it holds, the agent answers it or leaves it, and goes on.
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
                principals = [p for p in store.children(REQUESTS) if PRINCIPAL.fullmatch(p)]
            except MetadataError as exc:
                log.warning("principal requests unreadable: %s", exc)
                return 0
            for principal in principals:
                try:
                    nonces = [n for n in store.children(f"{REQUESTS}/{principal}") if NONCE.fullmatch(n)]
                except MetadataError:
                    continue
                for nonce in nonces:
                    key = f"{REQUESTS}/{principal}/{nonce}"
                    try:
                        served += self._serve(principal, key)
                    except MetadataNotAuthorized as exc:
                        if not self._refused:
                            log.error("principal requests are not carried out by this bookie: %s", exc)
                        self._refused = True
                        return served
                    except MetadataError as exc:
                        log.warning("principal request %s not carried out yet: %s", key, _short(str(exc)))
                    except Exception as exc:  # noqa: BLE001 - a principal wrote it: bad input must not stop the bookie
                        served += self._refuse(key, exc)
        return served

    def close(self) -> None:
        """close stops watching the requests."""
        self._watch.cancel()

    def _refuse(self, key: str, exc: Exception) -> int:
        """_refuse answers a request that is not one (its text is not repeated: it is the asker's)."""
        log.warning("refused principal request %s: %s", key, _short(f"{type(exc).__name__}: {exc}"))
        try:
            return self._answer(key, None, {"error": "invalid", "message": f"not a valid request "
                                                                        f"({type(exc).__name__})"})
        except Exception as again:  # noqa: BLE001 - it stays, and is looked at again
            log.warning("cannot answer principal request %s: %s", key, _short(str(again)))
            return 0

    def _serve(self, principal: str, key: str) -> int:
        store = self.store
        try:
            raw, revision = store.get(key)
        except NoSuchKey:
            return 0
        request = json.loads(raw)
        if not isinstance(request, dict) or "answer" in request:
            return 0 if isinstance(request, dict) else self._refuse(key, TypeError("not an object"))
        op, target = request.get("op"), request.get("key")
        if op not in OPS or not isinstance(target, str):
            raise ValueError("no such op, or no key")
        if not permissions._allowed(store, principal):
            return self._answer(key, revision, {"error": "denied", "message": f"principal {principal} is not on "
                                                                             f"the allow-list"})
        if op == "next-id":
            return self._answer(key, revision, {"value": store.next_id("ledger-id")})
        return self._carry_out(principal, key, revision, request, target, _checked_resource(target))

    def _carry_out(self, principal: str, key: str, revision: int, request: dict, target: str, kind: str) -> int:
        store, op, state = self.store, request["op"], request.get("state")
        if op == "put":                             # changes no role
            if state == "written":                  # written by an agent that stopped before it answered
                return self._answer(key, revision, {"version": revision})
            return self._denied_or(key, revision, lambda: self._put(principal, key, revision, target, kind,
                                                                    _value(request), int(request["version"])))
        if state is not None and _now_ms() - int(request.get("at", 0)) < CLAIM_MS:
            return 0                                # another agent carries it out (taken over if it stopped)
        roles = Roles(store)                        # first: a user that may not change roles changes nothing
        if state == "written":
            _sync(store, roles, target)
            return self._answer(key, revision, {"version": revision})
        if state == "deleted":
            _sync(store, roles, target)
            return self._answer(key, revision, {"deleted": True})
        # This agent's alone from here: every agent sees each request, and one that took a new key from every
        # role after another gave it to its owner would leave the owner without it.
        claimed = {**{k: request[k] for k in ("op", "key", "value", "version") if k in request},
                   "state": "claimed", "at": _now_ms()}
        try:
            revision = store.put(key, json.dumps(claimed).encode(), revision)
        except (BadVersion, NoSuchKey):
            return 0
        if op == "create":
            return self._denied_or(key, revision, lambda: self._create(principal, key, revision, target, kind,
                                                                       _value(request), roles))
        if op == "delete":
            return self._denied_or(key, revision, lambda: self._delete(principal, key, revision, target, kind,
                                                                       int(request.get("version", -1)), roles))
        return self._denied_or(key, revision, lambda: self._sync_request(principal, key, revision, target, kind,
                                                                         roles))

    def _denied_or(self, key: str, revision: int, step: Callable[[], int]) -> int:
        """_denied_or runs `step`, answering the request at `revision` if walkit's permissions refuse it."""
        try:
            return step()
        except PermissionDenied as exc:
            return self._answer(key, revision, {"error": "denied", "message": _short(str(exc))})

    def _create(self, principal: str, key: str, revision: int, target: str, kind: str, value: bytes,
                roles: Roles) -> int:
        store = self.store
        guard: tuple[str, ...] = ()
        if kind == "ledger":
            metadata = LedgerMetadata.from_bytes(value)
            if target != ledger_key(metadata.ledger_id) or metadata.owner != principal:
                raise PermissionDenied(f"{target} must be ledger {metadata.ledger_id}'s, owned by the asker")
            log_name = permissions.log_of(metadata)
            if log_name is not None:
                permissions.check_log(store, principal, log_name, "roll")
            guard = (deleted_key(metadata.ledger_id),)
        elif kind == "log":
            metadata = LogMetadata.from_bytes(value)
            name = target.partition("/")[2]
            if metadata.owner != principal or metadata.name != name:
                raise PermissionDenied(f"{target} must be log {name!r}, owned by the asker")
            if name.startswith(permissions.REPLICATED_PREFIX):
                claimant = value_of(store, f"{CLAIMS}/{name[len(permissions.REPLICATED_PREFIX):]}")
                if claimant and claimant != principal.encode():
                    raise PermissionDenied(f"replicated name {name!r} was claimed by another principal")
        else:
            raise ValueError("only a ledger's or a log's key is created this way")
        if value_of(store, target) or any(value_of(store, g) for g in guard):
            return self._answer(key, revision, {"error": "exists", "message": f"metadata key {target!r} exists, or "
                                                                             f"a ledger of that id was deleted"})
        ranges = resource_keys(store, target)[2]
        roles.sync(ranges, set())                   # before the key exists: an old holder's role could write it
        version = _write_with(store, "create", target, value, -1, key, revision,
                              {"op": "create", "key": target, "state": "written", "at": _now_ms()}, guard)
        if version in ("exists", "guard"):
            _sync(store, roles, target)             # created meanwhile by another: its owner keeps the key
        if version == "exists":
            return self._answer(key, revision, {"error": "exists", "message": f"metadata key {target!r} already "
                                                                             f"exists"})
        if version == "guard":
            return self._answer(key, revision, {"error": "exists", "message": f"metadata key {target!r}: a ledger "
                                f"of that id was deleted (its deletion marker is kept), so the id is not used again"})
        if version is None:                           # the request changed meanwhile: looked at again
            return 0
        roles.sync(ranges, {principal})               # from what was checked and written, never read back
        return self._answer(key, version, {"version": version})

    def _put(self, principal: str, key: str, revision: int, target: str, kind: str, value: bytes,
             version: int) -> int:
        store = self.store
        try:
            current = store.get(target)[0]
        except NoSuchKey:
            return self._answer(key, revision, _failed("missing", target, version))
        if kind == "ledger":
            permissions.check_ledger(store, principal, LedgerMetadata.from_bytes(current), "append")
        elif kind == "log":
            permissions.check_log(store, principal, target.partition("/")[2], "roll", LogMetadata.from_bytes(current))
        else:
            raise ValueError("only a ledger's or a log's key is changed this way")
        if version < 0:
            raise ValueError("a change names the version it changes")
        permissions.check_change(target, current, value, store)
        written = _write_with(store, "put", target, value, version, key, revision,
                              {"op": "put", "key": target, "state": "written", "at": _now_ms()})
        if isinstance(written, str):
            return self._answer(key, revision, _failed(written, target, version))
        if written is None:
            return 0
        return self._answer(key, written, {"version": written})

    def _delete(self, principal: str, key: str, revision: int, target: str, kind: str, version: int,
                roles: Roles) -> int:
        store = self.store
        if kind not in ("ledger", "log"):
            raise ValueError("only a ledger's or a log's key is deleted this way")
        try:
            value = store.get(target)[0]
        except NoSuchKey:
            return self._answer(key, revision, {"error": "missing", "message": f"no metadata key {target!r}"})
        if kind == "ledger":
            metadata = LedgerMetadata.from_bytes(value)
            if target != ledger_key(metadata.ledger_id):
                raise PermissionDenied(f"{target} holds another ledger's metadata: it is not deleted this way")
            permissions.check_ledger(store, principal, metadata, "delete")
            try:                                    # the key's own id: a value names whatever its writer wants
                store.create(deleted_key(int(target[len(LEDGER_PREFIX):])), deletion_marker(int(time.time() * 1000)))
            except NodeExists:
                pass
        else:
            permissions.check_log(store, principal, target.partition("/")[2], "delete", LogMetadata.from_bytes(value))
        outcome = _write_with(store, "delete", target, None, version if kind == "log" else -1, key, revision,
                              {"op": "delete", "key": target, "state": "deleted", "at": _now_ms()})
        if outcome is None:                           # the request changed meanwhile (another agent)
            return 0
        if isinstance(outcome, str):
            return self._answer(key, revision, _failed(outcome, target, version))
        _sync(store, roles, target)
        if kind == "log":                           # as delete_log does: the log's ledgers and grants go with it
            from walkit.deletions import delete_ledgers_of, forget_grants
            forget_grants(store, target.partition("/")[2])
            for ledger_id in delete_ledgers_of(store, target.partition("/")[2], value):
                _sync(store, roles, ledger_key(ledger_id))
            name = target.partition("/")[2]
            if name.startswith(permissions.REPLICATED_PREFIX):   # its keys went: so do the claim and the roles on them
                _forget_claim(store, name[len(permissions.REPLICATED_PREFIX):])
                _sync(store, roles, f"{NAME_BASES[0]}/{name[len(permissions.REPLICATED_PREFIX):]}")
        log.info("deleted %s as principal %s asked", target, principal)
        return self._answer(key, outcome, {"deleted": True})

    def _sync_request(self, principal: str, key: str, revision: int, target: str, kind: str, roles: Roles) -> int:
        store = self.store
        if kind == "name":
            name = resource_keys(store, target)[1]
            if not value_of(store, log_key(permissions.REPLICATED_PREFIX + name)):
                try:
                    store.create(f"{CLAIMS}/{name}", principal.encode())
                except NodeExists:
                    pass
        _sync(store, roles, target)
        return self._answer(key, revision, {"synced": True})

    def _answer(self, key: str, revision: int | None, answer: dict) -> int:
        """_answer writes `answer` into request `key` if it is still at `revision` (None: whatever it holds)."""
        store = self.store
        try:
            current = store.get(key)[1]
            if revision is not None and current != revision:
                return 0
            store.put(key, json.dumps({"answer": answer}).encode(), current)
            return 1
        except (NoSuchKey, BadVersion):
            return 0


#: How long an agent's claim on a request keeps the other agents away from it (then one takes it over).
CLAIM_MS = 10_000
#: What a principal may ask the agent.
OPS = ("create", "put", "delete", "sync", "next-id")
#: A request's name under its principal's prefix (the stores' are 16 hex digits).
NONCE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _checked_resource(target: str) -> str:
    """_checked_resource is the kind of resource `target` is a key of (ledger, log, name); ValueError if none, or
    not as walkit writes them."""
    found = resource_of(target)
    if found is None:
        raise ValueError("not a key of a ledger, log or replicated name")
    if found[0] == "log":
        check_log_name(target.partition("/")[2])
    if found[0] == "name":
        check_log_name(found[1])
    return found[0]


def _failed(outcome: str, target: str, version: int) -> dict:
    if outcome == "missing":
        return {"error": "missing", "message": f"no metadata key {target!r}"}
    return {"error": "version", "message": f"metadata key {target!r} is not at version {version}"}


def _value(request: dict) -> bytes:
    value = request.get("value")
    if not isinstance(value, str):
        raise ValueError("no value")
    return base64.b64decode(value, validate=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _write_with(store, mode: str, target: str, value: bytes | None, version: int, request_key: str, revision: int,
                request: dict, absent: tuple[str, ...] = ()) -> int | str | None:
    """_write_with creates (`mode` "create"), changes ("put") or deletes ("delete") `target`, and rewrites the
    request, in one transaction: only if the request is still at `revision`, `target` is absent (create) or
    present at `version` (put; delete when `version` is not negative), and no key of `absent` exists. It returns
    the transaction's revision (the request's, and a written `target`'s, new version); "exists", "missing",
    "version" or "guard" for the comparison that failed; None when the request changed."""
    from walkit.plugins.metadata.etcd import _compare, _found, _put, _range
    k, rk, guards = store._key(target), store._key(request_key), [store._key(a) for a in absent]
    compare = [_compare(k, "CREATE", 0)] if mode == "create" else [_compare(k, "CREATE", 0, "GREATER")]
    if mode != "create" and version >= 0:
        compare.append(_compare(k, "MOD", version))
    compare += [_compare(rk, "MOD", revision)] + [_compare(g, "CREATE", 0) for g in guards]
    change = {"request_delete_range": {"key": k}} if mode == "delete" else _put(k, value)
    result = store._txn(f"{mode} {target!r}", compare, [change, _put(rk, json.dumps(request).encode())],
                        [_range(k), _range(rk)] + [_range(g) for g in guards], idempotent=False)
    if result.get("succeeded"):
        return int(result["header"]["revision"])
    responses = result["responses"]
    found = _found(responses[1])
    if found is None or int(found["mod_revision"]) != revision:
        return None
    present = _found(responses[0])
    if mode == "create":
        return "exists" if present is not None else "guard"
    return "missing" if present is None else "version"
