"""walkit.plugins.metadata.zookeeper is a MetadataStore in ZooKeeper, through kazoo.

    zk://host:port[,host:port]/root[?session_timeout=S&timeout=S]

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
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError, ConnectionClosedError, ConnectionLoss, KazooException, NodeExistsError, NoNodeError,
    NotEmptyError, SessionExpiredError,
)
from kazoo.protocol.states import EventType, KazooState
from kazoo.retry import KazooRetry

from walkit.errors import BadVersion, MetadataError, NodeExists, NoSuchKey
from walkit.plugins.metadata import COUNTERS, check_key
from walkit.plugins.metadata.session import Registration, SessionStore, UserWatch, parse_uri
from walkit.spi import SessionState

log = logging.getLogger(__name__)

_OPTIONS = {"session_timeout": 10.0, "timeout": 10.0}


class ZooKeeperMetadataStore(SessionStore):
    """ZooKeeperMetadataStore is the ``zk://`` MetadataStore (see the module docstring).

    `session_timeout` is the ZooKeeper session timeout asked for (the server may bound it);
    `timeout` bounds every call, connecting included.
    """

    backend = "zookeeper"

    def __init__(self, hosts: list[str], root: str, *, session_timeout: float = 10.0, timeout: float = 10.0,
                 uri: str | None = None) -> None:
        self.hosts = ",".join(hosts)
        self.root = root
        self.session_timeout = session_timeout
        super().__init__(uri or f"zk://{self.hosts}{root}", timeout, tick_s=max(0.1, session_timeout / 3))
        self._counters: dict[str, tuple[int, int]] = {}      # counter -> (next value, znode version)
        self._watches: set[_TreeWatch] = set()
        self._expiry_timer: threading.Timer | None = None
        self._client = KazooClient(
            hosts=self.hosts, timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_jitter=0.2,
                                        max_delay=min(1.0, session_timeout / 3)),
            logger=logging.getLogger("kazoo.client"))
        self._client.add_listener(self._on_kazoo_state)
        try:
            self._client.start(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - kazoo raises its own timeout type or socket errors
            self.close()
            raise MetadataError(f"cannot connect to ZooKeeper at {self.hosts} within {timeout:g} s: {exc}") from exc

    @classmethod
    def from_uri(cls, uri: str, **options) -> "ZooKeeperMetadataStore":
        """from_uri connects to ``zk://host:port[,host:port]/root[?session_timeout=S&timeout=S]``."""
        hosts, root, values = parse_uri(uri, "zk", _OPTIONS, options)
        return cls(hosts, root, uri=uri, **values)

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
            except KazooException as exc:
                raise MetadataError(f"{what}: ZooKeeper at {self.hosts} refused it: {type(exc).__name__} {exc}") from exc

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
        """create makes `key` (and its parents) and returns its version; NodeExists if present."""
        path = self._path(key)
        try:
            self._call(f"create {key!r}", lambda: self._client.create_async(path, bytes(value), makepath=True),
                       idempotent=False)
        except NodeExistsError:
            raise NodeExists(f"metadata key {key!r} already exists") from None
        return 0

    def get(self, key: str) -> tuple[bytes, int]:
        """get returns (value, version); NoSuchKey if absent."""
        path = self._path(key)
        try:
            data, stat = self._call(f"get {key!r}", lambda: self._client.get_async(path), idempotent=True)
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        return data, stat.version

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put replaces the value at `expected_version` and returns the new version."""
        path = self._path(key)
        try:
            stat = self._call(f"put {key!r}",
                              lambda: self._client.set_async(path, bytes(value), version=expected_version),
                              idempotent=False)
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        except BadVersionError:
            raise BadVersion(f"metadata key {key!r} is not at version {expected_version}") from None
        return stat.version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """delete removes `key` (only at `expected_version` if given); NoSuchKey if absent."""
        path = self._path(key)
        version = -1 if expected_version is None else expected_version
        try:
            self._call(f"delete {key!r}", lambda: self._client.delete_async(path, version=version),
                       idempotent=False)
        except NoNodeError:
            raise NoSuchKey(f"no metadata key {key!r}") from None
        except BadVersionError:
            raise BadVersion(f"metadata key {key!r} is not at version {expected_version}") from None
        except NotEmptyError:
            raise MetadataError(f"cannot delete metadata key {key!r}: ZooKeeper holds keys under it") from None

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
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        while True:
            cached = self._counters.get(counter)
            if cached is None:
                try:
                    data, stat = self._call(what, lambda: self._client.get_async(path), idempotent=True,
                                            generation=generation, deadline=deadline)
                    cached = (int(data), stat.version)
                except NoNodeError:
                    try:
                        self._call(what, lambda: self._client.create_async(path, b"1", makepath=True),
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
        tree = _TreeWatch(self, self._path(prefix))
        tree.user = UserWatch(prefix, callback, lambda: self._watches.discard(tree))
        self._on_callback_thread(f"watch {prefix!r}", lambda: tree.scan(notify=False))
        self._watches.add(tree)
        return tree.user

    # -- sessions -------------------------------------------------------------------------------
    def _claim(self, registration: Registration) -> None:
        path = self._path(registration.key)
        what = f"register {registration.key!r}"
        deadline = time.monotonic() + self.timeout
        generation = self._lost_generation()
        while True:
            value = registration.value
            try:
                self._call(what, lambda: self._client.create_async(path, value, ephemeral=True, makepath=True),
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


class _TreeWatch:
    """_TreeWatch follows every znode at or under one path with kazoo's one-shot watches.

    It keeps the data version of each znode it saw. An event re-reads what it names (the node,
    or its children) and re-arms the watch; the differences are reported to the user callback.
    After a reconnection (kazoo drops watches with the connection), or when reading failed, it
    re-reads the whole subtree. All of it runs on the store's callback thread.
    """

    def __init__(self, store: ZooKeeperMetadataStore, path: str) -> None:
        self.store = store
        self.path = path
        self.user: UserWatch | None = None
        self.known: dict[str, int] = {}          # znode path -> data version
        self.stale = False                       # an event may have been missed: scan again

    def _key(self, path: str) -> str:
        return path[len(self.store.root) + 1:]

    def _fire(self, paths) -> None:
        for path in sorted(paths):
            self.user.fire(self._key(path))

    def _on_event(self, event) -> None:
        """_on_event runs on kazoo's thread: hand the event to the callback thread."""
        if event.type != EventType.NONE and not self.user.cancelled:
            self.store._dispatcher.submit(lambda: self._handle(event))

    def _handle(self, event) -> None:
        if self.user.cancelled:
            return
        try:
            if event.type == EventType.CHILD:
                self._refresh_children(event.path)
            else:
                self._refresh_node(event.path)
        except (MetadataError, KazooException) as exc:
            self.stale = True
            log.warning("watch on %s may have missed a change (%s); it will catch up", self.path, exc)

    def catch_up(self) -> None:
        """catch_up re-reads the subtree and reports what changed; if that fails, the watch stays stale."""
        if self.user.cancelled:
            return
        try:
            self.scan(notify=True)
            self.stale = False
        except (MetadataError, KazooException) as exc:
            self.stale = True
            log.warning("watch on %s could not catch up yet (%s); it will try again", self.path, exc)

    def _exists(self, path: str):
        return self.store._call(f"watch {self._key(path)!r}", lambda: self.store._client.exists_async(path, self._on_event),
                                idempotent=True)

    def _children(self, path: str) -> list[str]:
        try:
            return self.store._call(f"watch {self._key(path)!r}",
                                    lambda: self.store._client.get_children_async(path, self._on_event), idempotent=True)
        except NoNodeError:
            return []

    def _walk(self, path: str, found: dict[str, int]) -> None:
        stat = self._exists(path)
        if stat is None:
            return
        found[path] = stat.version
        for name in self._children(path):
            self._walk(f"{path}/{name}", found)

    def _subtree(self, path: str) -> set[str]:
        return {p for p in self.known if p == path or p.startswith(path + "/")}

    def scan(self, notify: bool) -> None:
        """scan re-reads the whole subtree, re-arming every watch, and reports what differs."""
        found: dict[str, int] = {}
        self._walk(self.path, found)
        changed = {p for p in found.keys() | self.known.keys() if found.get(p) != self.known.get(p)}
        self.known = found
        if notify:
            self._fire(changed)

    def _refresh_node(self, path: str) -> None:
        stat = self._exists(path)
        if stat is None:
            gone = self._subtree(path)
            for p in gone:
                del self.known[p]
            self._fire(gone)
        elif path not in self.known:
            self._refresh_subtree(path)
        elif self.known[path] != stat.version:
            self.known[path] = stat.version
            self._fire([path])

    def _refresh_children(self, path: str) -> None:
        names = set(self._children(path))
        before = {p.rsplit("/", 1)[1] for p in self.known if p.rsplit("/", 1)[0] == path}
        for name in sorted(before - names):
            gone = self._subtree(f"{path}/{name}")
            for p in gone:
                del self.known[p]
            self._fire(gone)
        for name in sorted(names - before):
            self._refresh_subtree(f"{path}/{name}")

    def _refresh_subtree(self, path: str) -> None:
        found: dict[str, int] = {}
        self._walk(path, found)
        old = self._subtree(path)
        changed = {p for p in found.keys() | old if found.get(p) != self.known.get(p)}
        for p in old - found.keys():
            del self.known[p]
        self.known.update(found)
        self._fire(changed)
