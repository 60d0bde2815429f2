"""walkit.plugins.metadata.etcd is a MetadataStore in etcd v3, through etcd3gw.

    etcd://[user:password@]host:port/root[?lease_ttl=S&timeout=S&password_file=PATH]

Why etcd3gw: it is maintained by OpenStack (tooz and Neutron use it), and it talks to etcd's
v3 JSON gateway over plain HTTP with `requests`, so it pins no grpc or protobuf versions (the
grpc-based ``etcd3`` package is unmaintained and breaks with current protobuf). etcd 3.4 serves
that gateway at ``/v3/`` (and at the deprecated ``/v3beta/``, which 3.5 dropped); this store
asks for ``/v3/`` explicitly, which works with Debian's etcd 3.4.23 and with newer servers.

Key ``a/b/c`` is the etcd key ``/root/a/b/c``; the keys are flat (no parents). A key's version
is its ``mod_revision``. Every write is one transaction: create compares ``create_revision ==
0``; put and delete compare the ``mod_revision`` and, when that fails, read the key in the same
round trip to tell NoSuchKey from BadVersion. `next_id` counters are keys under
``/root/.counters`` holding the next value, advanced the same way.

Registrations are keys attached to the store's lease (`lease_ttl` seconds, default 3; etcd
leases count whole seconds and etcd may grant more than asked). A keep-alive thread renews it
every third of its TTL. The session is SUSPENDED when a renewal fails, and LOST when no renewal
succeeded for the lease's TTL (etcd has expired it) or etcd says the lease is gone; as soon as
etcd answers again the store renews the lease if it survived, or takes a new one and creates
its registrations again. Each watch is one streaming watch request over the prefix, resumed
from the last revision it saw after any error.

Requests that never reached etcd (connection refused) are retried until `timeout` (default
10 s). A write whose request may have reached etcd is not retried: it fails with a
MetadataError that says its outcome is unknown.

Authentication: with a user (``etcd://user:password@...``, or ``etcd://user@...?password_file=``,
see walkit.plugins.metadata.credentials) every request, lease renewal and watch carries the
user's token, renewed when etcd drops it (walkit.plugins.metadata.etcd_auth). The user's role
needs readwrite on the prefix ``/root/``. Opening the store authenticates and reads that prefix,
so a wrong password, a missing user (etcd with authentication enabled) or a missing permission
fails at once with a MetadataError that says which; a write etcd refuses for want of a permission
raises MetadataNotAuthorized. A user named by a principal is a client in *principal mode*, whose
role etcd keeps to what walkit lets it change (walkit.plugins.metadata.etcd_principals).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import time
from typing import Callable

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from etcd3gw.lease import Lease
from urllib3.exceptions import NewConnectionError

from walkit.core.metadata import DELETED_PREFIX
from walkit.errors import BadVersion, ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey
from walkit.plugins.metadata import COUNTERS, check_key
from walkit.plugins.metadata.credentials import HIDDEN, Credentials, redact
from walkit.plugins.metadata.etcd_auth import EtcdAuth, EtcdAuthFailed, hint, token_refused
from walkit.plugins.metadata.etcd_watch import EtcdWatch
from walkit.plugins.metadata.session import Registration, SessionStore, UserWatch, parse_uri
from walkit.spi import SessionState

log = logging.getLogger(__name__)

_OPTIONS = {"lease_ttl": 3.0, "timeout": 10.0}
_API_PATH = "/v3/"
#: etcd's answer to a request checked against roles that changed before it was applied: it was not applied.
_AUTH_CHANGED = "revision of auth store is old"


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else bytes(data)).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def _describe(exc: Exception) -> str:
    """_describe returns the text of an etcd3gw error (it keeps the text, often etcd's JSON answer, in `detail_text`)."""
    detail = getattr(exc, "detail_text", None) or str(exc)
    try:
        detail = json.loads(detail)["error"]
    except (ValueError, TypeError, KeyError):
        pass
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _not_sent(exc: Exception) -> bool:
    """_not_sent is True when etcd3gw's error says the request never reached etcd (so it is safe to retry)."""
    cause = exc.__context__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        return isinstance(getattr(cause.args[0], "reason", None), NewConnectionError)
    return False


class _Client(Etcd3Client):
    """_Client is etcd3gw's client with a per-thread request timeout (the caller's time left).

    With `auth`, every request carries the user's token; one that etcd refuses for its token
    is sent once more with a new one.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._local = threading.local()
        self._default_timeout = timeout
        self.auth: EtcdAuth | None = None
        super().__init__(host=host, port=port, timeout=timeout, api_path=_API_PATH)

    def post(self, url: str, *args, json=None, **kwargs):
        """post sends a request (signed with the token, if any) and returns etcd's JSON answer."""
        if self.auth is None:
            return super().post(url, *args, json=json, **kwargs)
        token = self.auth.token(self.session, self.timeout)
        try:
            return super().post(url, *args, json=json, headers=self.auth.headers(token), **kwargs)
        except Etcd3Exception as exc:
            if not token_refused(exc.detail_text or ""):
                raise
        token = self.auth.renew(token, self.session, self.timeout)        # refused, so not applied: resend
        return super().post(url, *args, json=json, headers=self.auth.headers(token), **kwargs)

    @property
    def timeout(self) -> float:
        """timeout is the timeout of this thread's next request (etcd3gw reads it for every request)."""
        return getattr(self._local, "timeout", None) or self._default_timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._default_timeout = value

    def bounded(self, seconds: float | None) -> None:
        """bounded sets this thread's request timeout (None: the default)."""
        self._local.timeout = seconds


def _compare(key: str, target: str, value: int, result: str = "EQUAL") -> dict:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": key, "result": result, "target": target, field: value}


def _put(key: str, value: bytes, lease: int | None = None) -> dict:
    request = {"key": key, "value": _b64(value)}
    if lease is not None:
        request["lease"] = lease
    return {"request_put": request}


def _range(key: str) -> dict:
    return {"request_range": {"key": key}}


def _found(response: dict) -> dict | None:
    """_found returns the key-value of the range at the end of a failed transaction, or None."""
    while "response_txn" in response:
        response = response["response_txn"]["responses"][-1]
    kvs = response["response_range"].get("kvs")
    return kvs[0] if kvs else None


class EtcdMetadataStore(SessionStore):
    """EtcdMetadataStore is the ``etcd://`` MetadataStore (see the module docstring).

    `lease_ttl` is the TTL asked for the registrations' lease; `timeout` bounds every call,
    connecting included; `credentials`, if given, are the etcd user the store acts as.
    """

    backend = "etcd"

    def __init__(self, host: str, port: int, root: str, *, lease_ttl: float = 3.0, timeout: float = 10.0,
                 credentials: Credentials | None = None, uri: str | None = None) -> None:
        self.address = f"{host}:{port}"
        self.root = root
        self.lease_ttl = max(1, math.ceil(lease_ttl))
        self.user = credentials.user if credentials else None
        shown_user = f"{self.user}:{HIDDEN}@" if credentials else ""
        super().__init__(uri or f"etcd://{shown_user}{self.address}{root}", timeout,
                         tick_s=max(0.1, self.lease_ttl / 3))
        self._client = _Client(host, port, timeout)
        self._keeper = _Client(host, port, timeout)          # the keep-alive thread's own connection
        self._auth = EtcdAuth(credentials, self._client.get_url("/auth/authenticate")) if credentials else None
        self._client.auth = self._keeper.auth = self._auth
        # Principal mode (walkit.plugins.metadata.etcd_principals): a user named by a principal is one.
        from walkit.plugins.metadata.etcd_principals import Requests
        from walkit.plugins.metadata.principals import is_principal
        self._requests = Requests(self, self.user) if is_principal(self.user) else None
        self._counters: dict[str, tuple[int, int]] = {}      # counter -> (next value, mod_revision)
        self._watches: set[EtcdWatch] = set()
        self._lease: int | None = None
        self._granted_ttl = self.lease_ttl
        self._renewed_at = 0.0
        self._stop = threading.Event()
        try:
            started = time.monotonic()
            self._call(f"connect to etcd at {self.address}", self._probe, idempotent=True, client=self._keeper)
            self._lease, self._granted_ttl = self._call(f"connect to etcd at {self.address}", self._grant, idempotent=True, client=self._keeper)
        except MetadataError:
            self.close()
            raise
        self._renewed_at = started
        self._set_state(SessionState.CONNECTED, token=self._lease)
        self._thread = threading.Thread(target=self._keep_alive, name="walkit-etcd-lease", daemon=True)
        self._thread.start()

    @classmethod
    def from_uri(cls, uri: str, **options) -> "EtcdMetadataStore":
        """from_uri connects to ``etcd://[user:password@]host:port/root[?lease_ttl=S&timeout=S]``."""
        hosts, root, values, credentials = parse_uri(uri, "etcd", _OPTIONS, options)
        if len(hosts) != 1:
            raise ConfigError(f"{redact(uri)!r}: the etcd store talks to one endpoint (host:port), not {len(hosts)}")
        host, _, port = hosts[0].rpartition(":")
        return cls(host, int(port), root, uri=uri, credentials=credentials, **values)

    # -- plumbing -------------------------------------------------------------------------------
    def _key(self, key: str) -> str:
        return _b64(f"{self.root}/{check_key(key)}")

    def _call(self, what: str, request: Callable[[], object], *, idempotent: bool, client: _Client | None = None,
              generation: int | None = None, deadline: float | None = None):
        """_call runs an etcd3gw request within the timeout, retrying while etcd cannot be reached.

        A write (`idempotent` False) is retried only if its request never reached etcd.
        """
        client = client or self._client
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        generation = self._lost_generation() if generation is None else generation
        delay, last = 0.02, None
        while True:
            self._check_session(generation, what)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._unreachable(what, _describe(last) if last else "")
            client.bounded(remaining)
            try:
                return request()
            except (ConnectionFailedError, ConnectionTimeoutError) as exc:
                if not idempotent and not _not_sent(exc):
                    raise MetadataError(f"{what}: the request to etcd at {self.address} failed in flight, so "
                                        f"its outcome is unknown: {_describe(exc)}") from None
                last = exc
            except EtcdAuthFailed as exc:
                raise MetadataError(f"{what}: {exc.detail_text}") from None
            except Etcd3Exception as exc:
                if _AUTH_CHANGED not in (exc.detail_text or ""):
                    kind = MetadataNotAuthorized if "permission denied" in (exc.detail_text or "") else MetadataError
                    raise kind(f"{what}: etcd at {self.address} refused it: {_describe(exc)}"
                               f"{hint(exc.detail_text or '', self.user, self.root, what)}") from exc
                last = exc            # refused unapplied: etcd's roles changed after it checked the request's
                continue              # sent again at once: nothing is wrong with etcd
            finally:
                client.bounded(None)
            with self._cond:                  # wait before retrying; close() wakes us
                self._cond.wait(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.25)

    def _txn(self, what: str, compare: list, success: list, failure: list, *, idempotent: bool, **kw) -> dict:
        body = {"compare": compare, "success": success, "failure": failure}
        return self._call(what, lambda: self._client.transaction(body), idempotent=idempotent, **kw)

    def _as_principal(self, key: str, attempt: Callable[[], object]):
        """_as_principal runs `attempt`, a write of `key`; in principal mode a write etcd refused (it checks
        permissions before it applies anything) is made once more after the agent synced the key's resource."""
        try:
            return attempt()
        except MetadataNotAuthorized:
            if self._requests is None or not self._requests.sync(key):
                raise
            return attempt()

    # -- MetadataStore --------------------------------------------------------------------------
    def create(self, key: str, value: bytes) -> int:
        """create makes `key` and returns its version (mod_revision); NodeExists if present.

        A principal's store has the agent create ledgers and logs, and leaves deletion markers to it
        (walkit.plugins.metadata.etcd_principals): creating one does nothing here.
        """
        if self._requests is not None:
            if key.startswith(DELETED_PREFIX):
                return 0
            if self._requests.handles(key):
                return self._requests.create(key, value)
        k = self._key(key)
        result = self._as_principal(key, lambda: self._txn(f"create {key!r}", [_compare(k, "CREATE", 0)],
                                                           [_put(k, value)], [], idempotent=False))
        if not result.get("succeeded"):
            raise NodeExists(f"metadata key {key!r} already exists")
        return int(result["header"]["revision"])

    def get(self, key: str) -> tuple[bytes, int]:
        """get returns (value, version); NoSuchKey if absent."""
        k = self._key(key)
        result = self._call(f"get {key!r}", lambda: self._client.post(self._client.get_url("/kv/range"), json={"key": k}),
                            idempotent=True)
        kvs = result.get("kvs")
        if not kvs:
            raise NoSuchKey(f"no metadata key {key!r}")
        return _unb64(kvs[0].get("value")), int(kvs[0]["mod_revision"])

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put replaces the value at `expected_version` and returns the new version."""
        k = self._key(key)

        def attempt():
            return self._txn(f"put {key!r}", [_compare(k, "CREATE", 0, "GREATER"), _compare(k, "MOD", expected_version)],
                             [_put(k, value)], [_range(k)], idempotent=False)
        if self._requests is not None and self._requests.handles(key):
            try:
                result = attempt()                  # its owner's role holds the key
            except MetadataNotAuthorized:           # someone else's it may write: the agent keeps its owner
                return self._requests.put(key, value, expected_version)
        else:
            result = self._as_principal(key, attempt)
        if result.get("succeeded"):
            return int(result["header"]["revision"])
        found = _found(result["responses"][0])
        if found is None:
            raise NoSuchKey(f"no metadata key {key!r}")
        raise BadVersion(f"metadata key {key!r} is at version {found['mod_revision']}, not {expected_version}")

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """delete removes `key` (only at `expected_version` if given); NoSuchKey if absent."""
        if self._requests is not None and self._requests.handles(key):
            return self._requests.delete(key, expected_version)
        k = self._key(key)
        compare = [_compare(k, "CREATE", 0, "GREATER")]
        if expected_version is not None:
            compare.append(_compare(k, "MOD", expected_version))
        result = self._as_principal(key, lambda: self._txn(
            f"delete {key!r}", compare, [{"request_delete_range": {"key": k}}], [_range(k)], idempotent=False))
        if result.get("succeeded"):
            return
        found = _found(result["responses"][0])
        if found is None:
            raise NoSuchKey(f"no metadata key {key!r}")
        raise BadVersion(f"metadata key {key!r} is at version {found['mod_revision']}, not {expected_version}")

    def children(self, prefix: str) -> list[str]:
        """children lists the names directly under `prefix`, sorted."""
        low = f"{self.root}/{check_key(prefix)}/"
        body = {"key": _b64(low), "range_end": _b64(low[:-1] + "0"), "keys_only": True}
        result = self._call(f"list {prefix!r}", lambda: self._client.post(self._client.get_url("/kv/range"), json=body),
                            idempotent=True)
        names = {_unb64(kv["key"]).decode()[len(low):].split("/", 1)[0] for kv in result.get("kvs", ())}
        return sorted(names)

    def next_id(self, counter: str) -> int:
        """next_id returns 0, 1, 2, ... for `counter`, unique across clients (CAS on a counter key)."""
        if self._requests is not None and counter == "ledger-id":
            return self._requests.next_id()         # principal mode: the cluster's counter, drawn by the agent
        return self._as_principal(f"{COUNTERS}/{counter}", lambda: self._next_id(counter))

    def _next_id(self, counter: str) -> int:
        k = _b64(f"{self.root}/{COUNTERS}/{check_key(counter)}")
        what = f"next_id {counter!r}"
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        while True:
            # A transaction lost in flight may have taken `value`; retrying never hands it out twice.
            cached = self._counters.get(counter)
            if cached is None:
                result = self._txn(what, [_compare(k, "CREATE", 0)], [_put(k, b"1")], [_range(k)],
                                   idempotent=True, generation=generation, deadline=deadline)
                if result.get("succeeded"):
                    self._counters[counter] = (1, int(result["header"]["revision"]))
                    return 0
            else:
                value, revision = cached
                result = self._txn(what, [_compare(k, "CREATE", 0, "GREATER"), _compare(k, "MOD", revision)],
                                   [_put(k, str(value + 1).encode())], [_range(k)],
                                   idempotent=True, generation=generation, deadline=deadline)
                if result.get("succeeded"):
                    self._counters[counter] = (value + 1, int(result["header"]["revision"]))
                    return value
            found = _found(result["responses"][0])
            if found is None:
                self._counters.pop(counter, None)
            else:
                self._counters[counter] = (int(_unb64(found.get("value"))), int(found["mod_revision"]))

    def watch(self, prefix: str, callback: Callable[[str], None]) -> UserWatch:
        """watch calls `callback(key)` (on the callback thread) after keys at or under `prefix` change."""
        watch = EtcdWatch(self, f"{self.root}/{check_key(prefix)}")
        watch.user = UserWatch(prefix, callback, watch.stop)
        watch.start(time.monotonic() + self.timeout)
        self._watches.add(watch)
        return watch.user

    # -- principal mode (walkit.plugins.metadata.etcd_principals) --------------------------------------
    def principal_identity(self, principal: str, password: str) -> str:
        """principal_identity (a store of a user with etcd's root role) gives `principal` the etcd user PRINCIPAL
        with `password` and a role with the keys of what it holds; it returns the user's name."""
        from walkit.plugins.metadata import etcd_principals
        self.check_principal_identities()
        etcd_principals.give_identity(self, principal, password)
        return principal

    def check_principal_identities(self) -> None:
        """check_principal_identities raises unless this store may give principals identities (before any change)."""
        from walkit.plugins.metadata import etcd_principals
        if self._requests is not None:
            raise ConfigError("etcd metadata: a principal's own store cannot give identities; use a user with "
                              "etcd's root role")
        etcd_principals.check_can_give(self)

    def refresh_acls(self, log: str | None = None, forget: str | None = None) -> int:
        """refresh_acls (the operator's store) recomputes the roles of log `log`'s resources, or deletes principal
        `forget`'s role (revoked); nothing outside principal mode. It returns how many permissions changed."""
        from walkit.plugins.metadata import etcd_principals
        if not etcd_principals.enabled(self):
            return 0
        if forget is not None:
            etcd_principals.forget(self, forget)
        return etcd_principals.sync_log(self, log) if log is not None else 0

    def principal_agent(self):
        """principal_agent starts the agent that carries out principals' creations and deletions (a bookie's)."""
        from walkit.plugins.metadata.etcd_principals import Agent
        return Agent(self)

    # -- sessions -------------------------------------------------------------------------------
    def _probe(self) -> None:
        """_probe reads the store's prefix, so that a missing user or permission fails at open."""
        low = f"{self.root}/"
        self._keeper.post(self._keeper.get_url("/kv/range"),
                          json={"key": _b64(low), "range_end": _b64(low[:-1] + "0"), "limit": 1, "keys_only": True})

    def _grant(self) -> tuple[int, int]:
        result = self._keeper.post(self._keeper.get_url("/lease/grant"), json={"TTL": self.lease_ttl, "ID": 0})
        return int(result["ID"]), int(result["TTL"])

    def _keep_alive(self) -> None:
        """_keep_alive renews the lease every third of its TTL and follows the session's state."""
        delay = self._granted_ttl / 3
        while not self._stop.wait(delay):
            sent_at = time.monotonic()
            self._keeper.bounded(min(self.timeout, max(0.2, self._granted_ttl / 3)))
            try:
                if self._lease is None:
                    lease, ttl = self._grant()
                    self._lease, self._granted_ttl, self._renewed_at = lease, ttl, sent_at
                    self._set_state(SessionState.CONNECTED, f"new lease {lease:x}", token=lease)
                    delay = ttl / 3
                    continue
                ttl = Lease(self._lease, self._keeper).refresh()
            except Etcd3Exception as exc:
                if time.monotonic() - self._renewed_at >= self._granted_ttl:
                    self._set_state(SessionState.LOST, f"the lease was not renewed within its TTL "
                                                       f"({self._granted_ttl} s), so etcd has expired it")
                else:
                    self._set_state(SessionState.SUSPENDED, f"cannot renew the lease: {_describe(exc)}")
                delay = 0.1
                continue
            finally:
                self._keeper.bounded(None)
            if ttl > 0:
                self._renewed_at = sent_at
                self._set_state(SessionState.CONNECTED, token=self._lease)
                delay = self._granted_ttl / 3
            else:
                self._set_state(SessionState.LOST, "etcd says the lease has expired")
                self._lease, delay = None, 0

    def _claim(self, registration: Registration) -> None:
        self._as_principal(registration.key, lambda: self._claim_once(registration))

    def _claim_once(self, registration: Registration) -> None:
        what = f"register {registration.key!r}"
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        self._wait_connected(deadline, generation, what)
        lease, k, value = self._token, self._key(registration.key), registration.value
        # Ours already: overwrite; absent: create; held by another lease: read it (NodeExists).
        result = self._txn(what, [_compare(k, "LEASE", lease)], [_put(k, value, lease)],
                           [{"request_txn": {"compare": [_compare(k, "CREATE", 0)], "success": [_put(k, value, lease)],
                                             "failure": [_range(k)]}}],
                           idempotent=True, generation=generation, deadline=deadline)
        if not result.get("succeeded") and not result["responses"][0]["response_txn"].get("succeeded"):
            raise NodeExists(f"metadata key {registration.key!r} is registered by another live session")
        registration.owner = lease

    def _release(self, key: str, owner: int) -> None:
        if owner != self._token:
            return                      # that lease has expired, and its keys with it
        k = self._key(key)
        self._txn(f"unregister {key!r}", [_compare(k, "LEASE", owner)], [{"request_delete_range": {"key": k}}], [],
                  idempotent=True)

    def _shutdown(self) -> None:
        self._stop.set()
        for watch in list(self._watches):
            watch.user.cancel()
        if getattr(self, "_thread", None) is not None:
            self._thread.join(self.timeout)
        if self._lease is not None:
            self._keeper.bounded(min(self.timeout, 2.0))
            try:
                Lease(self._lease, self._keeper).revoke()
            except Etcd3Exception as exc:
                log.warning("cannot revoke the etcd lease (its keys expire in %s s): %s", self._granted_ttl,
                            _describe(exc))
        for client in (self._client, self._keeper):
            client.session.close()
