"""walkit.plugins.metadata.zookeeper is a MetadataStore in ZooKeeper, through kazoo.

    zk://[user:password@]host:port[,host:port]/root[?session_timeout=S&timeout=S&password_file=PATH]

Key ``a/b/c`` is the znode ``/root/a/b/c``; parents are created as needed (so, unlike in the
SQLite and etcd stores, an intermediate path such as ``a/b`` exists as an empty znode, and a
key with children cannot be deleted). A key's version is its znode's data version, so
compare-and-swap is ZooKeeper's own conditional set and delete. `next_id` counters are znodes
under ``/root/.counters`` holding the next value, advanced by compare-and-swap. Registrations
are ephemeral znodes of the store's session (`session_timeout`, default 10 s).

Sessions (walkit.plugins.metadata.session): kazoo's CONNECTED, SUSPENDED and LOST map to
SessionState. Since ZooKeeper only tells a client that its session expired once the client
reconnects, a store that has been SUSPENDED for `session_timeout` declares the session LOST
itself (as Curator does): by then the server has expired it, and another process may own what
its ephemeral keys stood for. kazoo reconnects on its own, with a new session after an expiry;
the store then registers its registrations again. kazoo drops its watches when the connection
drops, so watches re-read their subtree after every reconnection and report what changed.
kazoo has no recursive watches (ZooKeeper 3.6's addWatch), so a watch holds one data and one
child watch per znode of its subtree: watch small prefixes (a log, the bookies), not ``ledgers``.

Writes in flight when the connection drops are not retried: ZooKeeper may or may not have
applied them, so they fail with a MetadataError that says the outcome is unknown. Reads, and
writes issued while the connection was down, wait for it (up to `timeout`, default 10 s).

Authentication: with a user (``zk://user:password@...``, or ``zk://user@...?password_file=``,
see walkit.plugins.metadata.credentials) the store adds the ``digest`` credential
``user:password`` to its connection and creates every znode (the root and its parents, the
counters, the registrations) with the ACL ``digest:user:<hash>:cdrwa``, so no other ZooKeeper
user can read or change them. Every process of a cluster (bookies, clients) then uses that
user. ZooKeeper's digest scheme checks no password when connecting; a wrong password, or a
store without one, shows up as NoAuth on the protected znodes, which the store reports as a
MetadataError that says it is not authorized (checked at open by reading the root). ACLs are
set only on znodes the store creates: znodes made before the user was configured stay as they
are (the store logs a warning when the root is one of them; ``setAcl -R`` in zkCli fixes them).

The allow-list and the grants may be an operator user's own (``?security_user=NAME&
security_password_file=PATH``): walkit.plugins.metadata.zookeeper_security. Clients may have
ZooKeeper users of their own, named by their principals, so that ZooKeeper enforces walkit's
permissions (principal mode): walkit.plugins.metadata.zookeeper_principals.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError, BadVersionError, ConnectionClosedError, ConnectionLoss, KazooException, NodeExistsError,
    NoAuthError, NoNodeError, NotEmptyError, SessionExpiredError,
)
from kazoo.protocol.serialization import Auth
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from walkit.core.metadata import DELETED_PREFIX
from walkit.errors import BadVersion, ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey
from walkit.plugins.metadata import COUNTERS, check_key
from walkit.plugins.metadata.credentials import HIDDEN, OPERATOR_HINT, Credentials
from walkit.plugins.metadata.session import Registration, SessionStore, UserWatch, parse_uri
from walkit.plugins.metadata.principals import is_principal
from walkit.plugins.metadata.zookeeper_principals import Policy, digest_id, znode_exists
from walkit.plugins.metadata.zookeeper_security import is_security_key, protect, security_acl, split_options
from walkit.plugins.metadata.zookeeper_watch import TreeWatch
from walkit.spi import SessionState

log = logging.getLogger(__name__)

_OPTIONS = {"session_timeout": 10.0, "timeout": 10.0}


class NoAuth(MetadataNotAuthorized):
    """NoAuth is the MetadataError of a znode whose ACL does not admit this store's user."""


class _HideAuth(logging.Filter):
    """_HideAuth hides the credential of the Auth requests kazoo logs (at DEBUG) as it sends them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, Auth) for arg in record.args):
            record.args = tuple(arg._replace(auth=arg.auth.partition(":")[0] + ":" + HIDDEN)
                                if isinstance(arg, Auth) else arg for arg in record.args)
        return True


_KAZOO_LOG = logging.getLogger("kazoo.client")
_KAZOO_LOG.addFilter(_HideAuth())


class ZooKeeperMetadataStore(SessionStore):
    """ZooKeeperMetadataStore is the ``zk://`` MetadataStore (see the module docstring).

    `session_timeout` is the ZooKeeper session timeout asked for (the server may bound it);
    `timeout` bounds every call, connecting included; `credentials`, if given, are the digest
    user that owns every znode the store creates.
    """

    backend = "zookeeper"

    def __init__(self, hosts: list[str], root: str, *, session_timeout: float = 10.0, timeout: float = 10.0,
                 credentials: Credentials | None = None, uri: str | None = None,
                 security_credentials: Credentials | None = None) -> None:
        for given in (credentials, security_credentials):
            if given is not None and ":" in given.user:
                raise ConfigError(f"zk metadata: a ZooKeeper digest user cannot contain ':' ({given.user!r})")
        self._security_acl = None if security_credentials is None else security_acl(credentials, security_credentials)
        self.hosts = ",".join(hosts)
        self.root = root
        self.session_timeout = session_timeout
        self.user = credentials.user if credentials else None
        shown_user = f"{self.user}:{HIDDEN}@" if credentials else ""
        super().__init__(uri or f"zk://{shown_user}{self.hosts}{root}", timeout, tick_s=max(0.1, session_timeout / 3))
        self._counters: dict[str, tuple[int, int]] = {}      # counter -> (next value, znode version)
        self._watches: set[TreeWatch] = set()
        self._expiry_timer: threading.Timer | None = None
        self._acl = [make_digest_acl(credentials.user, credentials.password, all=True)] if credentials else None
        # Principal mode (walkit.plugins.metadata.zookeeper_principals): a user named by a principal is one.
        own = digest_id(credentials.user, credentials.password) if credentials and is_principal(credentials.user) else None
        self._policy = Policy(self, own)
        self.security_user = security_credentials.user if security_credentials else None
        auth = [("digest", f"{c.user}:{c.password}") for c in (credentials, security_credentials) if c is not None]
        self._client = KazooClient(
            hosts=self.hosts, timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_jitter=0.2,
                                        max_delay=min(1.0, session_timeout / 3)),
            auth_data=auth or None,
            default_acl=self._acl,
            logger=_KAZOO_LOG)
        self._client.add_listener(self._on_kazoo_state)
        try:
            self._client.start(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - kazoo raises its own timeout type or socket errors
            self.close()
            raise MetadataError(f"cannot connect to ZooKeeper at {self.hosts} within {timeout:g} s: {exc}") from exc
        try:
            self._check_root()
            if self._security_acl is not None:
                protect(self)
        except MetadataError:
            self.close()
            raise

    @classmethod
    def from_uri(cls, uri: str, **options) -> "ZooKeeperMetadataStore":
        """from_uri connects to ``zk://[user:password@]host:port[,host:port]/root[?session_timeout=S&timeout=S]``
        (and ``&security_user=NAME&security_password_file=PATH``: walkit.plugins.metadata.zookeeper_security)."""
        rest, security = split_options(uri, options)
        hosts, root, values, credentials = parse_uri(rest, "zk", _OPTIONS, options)
        return cls(hosts, root, uri=uri, credentials=credentials, security_credentials=security, **values)

    def _acl_for(self, key: str, value: bytes = b""):
        """_acl_for is the ACL a new znode for `key` gets (and its parents, if created with it)."""
        if self._security_acl is not None and is_security_key(key):
            return self._policy.with_world_read(self._security_acl)
        if self._acl is not None:
            chosen = self._policy.acl_for(key, value)
            if chosen is not None:
                return chosen
        return self._acl

    # -- principal mode (walkit.plugins.metadata.zookeeper_principals) ---------------------------------
    def principal_identity(self, principal: str, password: str) -> str:
        """principal_identity (the operator's store) gives `principal` the ZooKeeper digest user PRINCIPAL with
        `password`, turns principal mode on and rewrites every ACL for it; it returns the digest identity."""
        from walkit.plugins.metadata import zookeeper_principals as principals
        from walkit.security import allow
        self.check_principal_identities()
        identity = digest_id(principal, password)
        allow(self, principal, metadata_identity=identity)
        principals.enable(self)
        return identity

    def check_principal_identities(self) -> None:
        """check_principal_identities raises unless this store may give principals identities (before any change)."""
        if self._policy.own is not None:
            raise ConfigError("zk metadata: a principal's own store cannot give identities; use the cluster's user")
        if self._acl is None:
            raise ConfigError("zk metadata: principal identities need the cluster's own ZooKeeper user in the URI "
                              "(zk://USER@host:port/root?password_file=...): without one, the znodes principal mode "
                              "makes would be nobody's to change")

    def principal_agent(self):
        """principal_agent starts the reaper that carries out principals' deletions and changes (a bookie's)."""
        from walkit.plugins.metadata.zookeeper_reaper import Reaper
        return Reaper(self)

    def refresh_acls(self, log: str | None = None, forget: str | None = None) -> int:
        """refresh_acls rewrites the ACLs after grants changed on `log` (None: every znode), leaving out
        `forget` (a revoked principal); nothing outside principal mode. It returns how many changed."""
        from walkit.plugins.metadata import zookeeper_principals as principals
        if not self._policy.enabled():
            return 0
        return principals.reacl_tree(self, only_log=log, forget=forget)

    def _check_root(self) -> None:
        """_check_root reads the root (NoAuth: not authorized) and warns if a user's root is open to others."""
        try:
            self._call("open the root", lambda: self._client.get_async(self.root), idempotent=True)
            if self._acl is None:
                return
            acls, _ = self._call("open the root", lambda: self._client.get_acls_async(self.root), idempotent=True)
        except NoNodeError:
            return                      # created, with the ACL, by the first write
        if self._policy.own is not None:
            return                      # principal mode: the root is the cluster's (and readable by all)
        if [a for a in acls if a.id.scheme != "world"] != self._acl:
            shown = ", ".join(f"{a.id.scheme}:{a.id.id.partition(':')[0]}" for a in acls)   # no digest hashes
            log.warning("the ZooKeeper root %s existed before with ACL %s, not only user %r's: znodes created "
                        "before stay readable or writable by others (fix them with zkCli setAcl -R)",
                        self.root, shown, self.user)

    # -- plumbing -------------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _call(self, what: str, start: Callable[[], object], *, idempotent: bool, generation: int | None = None,
              deadline: float | None = None):
        """_call issues a kazoo request once connected and waits for its answer within the timeout.

        Reads are retried after a connection loss; writes (`idempotent` False) are not, since
        ZooKeeper may have applied them.
        """
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        generation = self._lost_generation() if generation is None else generation
        while True:
            self._wait_connected(deadline, generation, what)
            result = start()
            try:
                return result.get(timeout=max(0.001, deadline - time.monotonic()))
            except self._client.handler.timeout_exception:
                raise self._unreachable(what, "" if idempotent else "the request's outcome is unknown") from None
            except SessionExpiredError:
                raise self._session_lost(what) from None
            except (ConnectionLoss, ConnectionClosedError):
                self._check_session(generation, what)
                if not idempotent:
                    raise MetadataError(f"{what}: the connection to ZooKeeper at {self.hosts} was lost while the "
                                        f"request was in flight; its outcome is unknown") from None
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError):
                raise                   # answers, for the caller to translate
            except (NoAuthError, AuthFailedError):
                raise self._not_authorized(what) from None
            except KazooException as exc:
                raise MetadataError(f"{what}: ZooKeeper at {self.hosts} refused it: {type(exc).__name__} {exc}") from exc

    def _not_authorized(self, what: str) -> MetadataError:
        """_not_authorized is the error for a znode whose ACL does not admit this store (NoAuth)."""
        if self.security_user is None and "'security/" in what and self._policy.own is None:
            hint = OPERATOR_HINT.removeprefix("; ")
        elif self._policy.own is not None:
            hint = (f"user {self.user} is a principal (ZooKeeper's principal mode), and the znode's ACL does not "
                    f"grant it that: an operator may, with the cluster's user (walkit acl grant {self.user} LEVEL "
                    f"log NAME --metadata zk://CLUSTER-USER@...)")
        elif self.user is None:
            hint = ("its znodes are protected by a ZooKeeper ACL: give the store their user and password, "
                    "zk://user:password@host:port/root (or ?password_file=)")
        else:
            hint = (f"the znode's ACL does not admit user {self.user!r} with this password: check the user and "
                    f"password (or password_file) of the zk:// URI")
        return NoAuth(f"{what}: ZooKeeper at {self.hosts} says this client is not authorized (NoAuth) "
                             f"under {self.root}; {hint}")

    def _on_kazoo_state(self, state: str) -> None:
        """_on_kazoo_state runs on kazoo's connection thread: record the change, never block."""
        if self._closed:
            return                      # close() reports LOST itself
        if state == KazooState.CONNECTED:
            self._cancel_expiry_timer()
            self._set_state(SessionState.CONNECTED, token=self._client._session_id)
        elif state == KazooState.SUSPENDED:
            self._set_state(SessionState.SUSPENDED, "the connection to ZooKeeper dropped")
            timer = threading.Timer(self.session_timeout, self._expire_locally, args=(self._lost_generation(),))
            timer.daemon = True
            self._cancel_expiry_timer()
            self._expiry_timer = timer
            timer.start()
        elif state == KazooState.LOST:
            self._cancel_expiry_timer()
            self._set_state(SessionState.LOST, "ZooKeeper expired the session")

    def _expire_locally(self, generation: int) -> None:
        with self._cond:
            if self._state is not SessionState.SUSPENDED or self._lost_count != generation:
                return
        self._set_state(SessionState.LOST, f"no contact with ZooKeeper for the session timeout "
                                           f"({self.session_timeout:g} s); the server has expired it")

    def _cancel_expiry_timer(self) -> None:
        timer, self._expiry_timer = self._expiry_timer, None
        if timer is not None:
            timer.cancel()

    # -- MetadataStore --------------------------------------------------------------------------
    def create(self, key: str, value: bytes) -> int:
        """create makes `key` (and its parents) and returns its version; NodeExists if present.

        In principal mode a principal's store leaves deletion markers to the reaper (the module doc
        of walkit.plugins.metadata.zookeeper_principals): creating one does nothing here.
        """
        if self._policy.own is not None and key.startswith(DELETED_PREFIX):
            return 0
        self._policy.ensure_name(key)
        if self._policy.marked_deleted(key):
            raise NodeExists(f"metadata key {key!r}: a ledger of that id was deleted (its deletion marker is kept), "
                             f"so the id is not used again")
        path = self._path(key)
        acl = self._acl_for(key, value)
        witness = self._policy.witness_for(key, value)
        if witness is not None:
            return self._create_witnessed(key, path, bytes(value), acl, *witness)
        try:
            self._call(f"create {key!r}", lambda: self._client.create_async(path, bytes(value), acl=acl, makepath=True),
                       idempotent=False)
        except NodeExistsError:
            raise NodeExists(f"metadata key {key!r} already exists") from None
        except MetadataNotAuthorized:
            # ZooKeeper checks the parent's create right before whether the key exists: a principal may not create
            # a replicated name's pointer, which the cluster made (zookeeper_principals.make_name), but it exists.
            if self._policy.own is not None and znode_exists(self, key):
                raise NodeExists(f"metadata key {key!r} already exists") from None
            raise
        return 0

    def _create_witnessed(self, key: str, path: str, value: bytes, acl, witness: str, witness_acl) -> int:
        """_create_witnessed creates log `key` and its witness in one transaction (principal mode: the witness proves
        whose the log is, zookeeper_principals.OWNERS_DIR). A witness left by a deleted log of that name is deleted
        first."""
        from walkit.plugins.metadata.zookeeper_principals import ensure_owner_dir
        if self._policy.own is None:
            ensure_owner_dir(self, witness.split("/")[1])
        for _ in range(2):
            txn = self._client.transaction()
            txn.create(path, value, acl=acl)
            txn.create(self._path(witness), b"", acl=witness_acl)
            made, proof = self._call(f"create {key!r}", lambda: txn.commit_async(), idempotent=False)
            if not isinstance(made, Exception) and not isinstance(proof, Exception):
                return 0
            if isinstance(made, NodeExistsError):
                raise NodeExists(f"metadata key {key!r} already exists")
            if isinstance(made, (NoAuthError, AuthFailedError)) or isinstance(proof, (NoAuthError, AuthFailedError)):
                raise self._not_authorized(f"create {key!r}")
            if not isinstance(proof, NodeExistsError):
                raise MetadataError(f"create {key!r}: ZooKeeper refused it with its witness {witness!r} "
                                    f"({type(made).__name__}, {type(proof).__name__}): an operator's `walkit clients "
                                    f"allow` makes the witnesses' directories")
            try:                                  # a witness of a deleted log of that name
                self._call(f"delete {witness!r}", lambda: self._client.delete_async(self._path(witness)),
                           idempotent=True)
            except NoNodeError:
                pass
        raise MetadataError(f"create {key!r}: its witness {witness!r} keeps being made by another client")

    def get(self, key: str) -> tuple[bytes, int]:
        """get returns (value, version); NoSuchKey if absent."""
        path = self._path(key)
        try:
            data, stat = self._call(f"get {key!r}", lambda: self._client.get_async(path), idempotent=True)
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        if self._policy.own is not None and key.startswith("logs/") and key.count("/") == 1:
            self._policy.check_own_log(key, data, stat.czxid)
        if not stat.ephemeralOwner and key.startswith("elections/replication/") and key.count("/") == 3 \
                and self._policy.enabled():
            raise MetadataNotAuthorized(f"{key} is not ephemeral, so no election made it (a principal that held write "
                                        f"on the replicated name made it, to hold the election): it is not used; "
                                        f"the operator deletes it (docs/operations/security.md#pinned-names)")
        return data, stat.version

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put replaces the value at `expected_version` and returns the new version."""
        self._policy.check_log_write(key, value)
        path = self._path(key)
        try:
            stat = self._call(f"put {key!r}",
                              lambda: self._client.set_async(path, bytes(value), version=expected_version),
                              idempotent=False)
        except MetadataNotAuthorized:
            if not self._policy.asks_for_deletion(key):
                raise
            return self._policy.put(key, value, expected_version)     # not its own: the reaper keeps the owner
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        except BadVersionError:
            raise BadVersion(f"metadata key {key!r} is not at version {expected_version}") from None
        return stat.version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """delete removes `key` (only at `expected_version` if given); NoSuchKey if absent."""
        if self._policy.asks_for_deletion(key):
            return self._policy.delete(key, expected_version)
        path = self._path(key)
        version = -1 if expected_version is None else expected_version
        if key.startswith("logs/") and key.count("/") == 1 and self._policy.enabled():
            self._drop_put_requests(key)
        try:
            self._call(f"delete {key!r}", lambda: self._client.delete_async(path, version=version),
                       idempotent=False)
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        except BadVersionError:
            raise BadVersion(f"metadata key {key!r} is not at version {expected_version}") from None
        except NotEmptyError:
            raise MetadataError(f"cannot delete metadata key {key!r}: ZooKeeper holds keys under it") from None

    def _drop_put_requests(self, key: str) -> None:
        """_drop_put_requests deletes the znodes of log `key`'s put requests (principal mode), as far as it can."""
        from walkit.plugins.metadata.zookeeper_principals import PUT_PREFIX
        from walkit.plugins.metadata.zookeeper_principals import _delete_tree
        _delete_tree(self, f"{PUT_PREFIX}/{key.partition('/')[2]}")   # what stays counts for nothing: requests
                                                                    # are checked against who may write now

    def created_ms(self, key: str) -> int:
        """created_ms is when ZooKeeper created `key` (its ctime, the server's clock); NoSuchKey if absent."""
        path = self._path(key)
        stat = self._call(f"look at {key!r}", lambda: self._client.exists_async(path), idempotent=True)  # no ACL needed
        if stat is None:
            raise NoSuchKey(f"no metadata key {key!r}")
        return stat.ctime

    def children(self, prefix: str) -> list[str]:
        """children lists the names directly under `prefix`, sorted."""
        path = self._path(prefix)
        try:
            names = self._call(f"list {prefix!r}", lambda: self._client.get_children_async(path), idempotent=True)
        except NoNodeError:
            return []
        return sorted(names)

    def next_id(self, counter: str) -> int:
        """next_id returns 0, 1, 2, ... for `counter`, unique across clients (CAS on a counter znode)."""
        path = f"{self.root}/{COUNTERS}/{check_key(counter)}"
        what = f"next_id {counter!r}"
        self._policy.ensure_name(f"{COUNTERS}/{counter}")
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        while True:
            cached = self._counters.get(counter)
            if cached is None:
                try:
                    data, stat = self._call(what, lambda: self._client.get_async(path), idempotent=True,
                                            generation=generation, deadline=deadline)
                    cached = (_counter_value(counter, data), stat.version)
                except NoNodeError:
                    acl = self._acl_for(f"{COUNTERS}/{counter}")
                    try:
                        self._call(what, lambda: self._client.create_async(path, b"1", acl=acl, makepath=True),
                                   idempotent=True, generation=generation, deadline=deadline)
                        self._counters[counter] = (1, 0)
                        return 0
                    except NodeExistsError:
                        continue
            value, version = cached
            try:
                # A set lost in flight may have taken `value`; retrying never hands it out twice.
                stat = self._call(what, lambda: self._client.set_async(path, str(value + 1).encode(), version=version),
                                  idempotent=True, generation=generation, deadline=deadline)
            except (BadVersionError, NoNodeError):
                self._counters.pop(counter, None)
                continue
            self._counters[counter] = (value + 1, stat.version)
            return value

    def watch(self, prefix: str, callback: Callable[[str], None]) -> UserWatch:
        """watch calls `callback(key)` (on the callback thread) after keys at or under `prefix` change."""
        tree = TreeWatch(self, self._path(prefix))
        tree.user = UserWatch(prefix, callback, lambda: self._watches.discard(tree))
        self._on_callback_thread(f"watch {prefix!r}", lambda: tree.scan(notify=False))
        self._watches.add(tree)
        return tree.user

    # -- sessions -------------------------------------------------------------------------------
    def _claim(self, registration: Registration) -> None:
        path = self._path(registration.key)
        what = f"register {registration.key!r}"
        self._policy.ensure_name(registration.key)
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        acl = self._acl_for(registration.key, registration.value)
        while True:
            value = registration.value
            try:
                self._call(what, lambda: self._client.create_async(path, value, acl=acl, ephemeral=True,
                                                                   makepath=True),
                           idempotent=True, generation=generation, deadline=deadline)
                registration.owner, registration.version = self._token, 0
                return
            except NodeExistsError:
                pass
            try:
                _, stat = self._call(what, lambda: self._client.get_async(path), idempotent=True,
                                     generation=generation, deadline=deadline)
                if stat.ephemeralOwner != self._token:
                    raise NodeExists(f"metadata key {registration.key!r} is registered by another live session")
                stat = self._call(what, lambda: self._client.set_async(path, value, version=stat.version),
                                  idempotent=True, generation=generation, deadline=deadline)
                registration.owner, registration.version = self._token, stat.version
                return
            except (NoNodeError, BadVersionError):
                continue                # changed under us: look again

    def _release(self, key: str, owner: int) -> None:
        if owner != self._token:
            return                      # that session is gone, and its ephemeral keys with it
        path = self._path(key)
        what = f"unregister {key!r}"
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                _, stat = self._call(what, lambda: self._client.get_async(path), idempotent=True, deadline=deadline)
                if stat.ephemeralOwner != owner:
                    return
                self._call(what, lambda: self._client.delete_async(path, version=stat.version), idempotent=True,
                           deadline=deadline)
                return
            except NoNodeError:
                return
            except BadVersionError:
                continue

    def _resync(self, stale_only: bool) -> None:
        for tree in list(self._watches):
            if tree.stale or not stale_only:
                tree.catch_up()

    def _shutdown(self) -> None:
        self._cancel_expiry_timer()
        self._watches.clear()
        stopper = threading.Thread(target=self._stop_client, name="walkit-zk-close", daemon=True)
        stopper.start()
        stopper.join(self.timeout)

    def _stop_client(self) -> None:
        try:
            self._client.stop()
            self._client.close()
        except Exception:  # noqa: BLE001 - closing a broken connection: the session expires anyway
            log.debug("closing the ZooKeeper client failed", exc_info=True)


def _counter_value(counter: str, data: bytes) -> int:
    """_counter_value reads a counter znode: a non-negative integer, or a MetadataError that says it is broken."""
    try:
        value = int(data)
    except ValueError:
        value = -1
    if value < 0:
        raise MetadataError(f"the counter {counter!r} holds {bytes(data)[:40]!r}, not a non-negative integer: an "
                            f"operator sets it past every id in use (zkCli set)")
    return value
