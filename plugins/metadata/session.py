"""walkit.plugins.metadata.session holds what the ZooKeeper and etcd stores share: the session.

Both servers tie ephemeral keys to a client session (a ZooKeeper session, an etcd lease). A
`SessionStore` tracks that session's state (walkit.spi.SessionState): CONNECTED; SUSPENDED
while the connection is down but the session may come back; LOST once the session is gone (the
server expired it, or it cannot have survived that long without contact). Operations issued
while the connection is down wait for it up to the store's `timeout`, then fail with a
MetadataError that says the store is unreachable; operations in flight when the session is
lost fail with SessionLost.

Registrations (`register`) outlive sessions: once a new session is established, the store
creates their keys again, so a bookie whose session expired registers again on its own. A
registration closed while the store cannot reach the server is deleted once it can. User
callbacks (watches, state listeners) run in order on one thread per store, never on the
threads that do I/O.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable
from urllib.parse import parse_qsl, urlsplit

from walkit.errors import ConfigError, MetadataError, NodeExists, SessionLost
from walkit.plugins.metadata import check_key
from walkit.plugins.metadata.credentials import Credentials, redact, split_userinfo
from walkit.spi import SessionState

log = logging.getLogger(__name__)

#: The option naming a file that holds the password of the URI's user.
PASSWORD_FILE = "password_file"


def parse_uri(uri: str, scheme: str, options: dict[str, float],
              given: dict) -> tuple[list[str], str, dict, Credentials | None]:
    """parse_uri splits ``scheme://[user[:password]@]host:port[,host:port]/root?name=value``.

    It returns (hosts, root, options, credentials). `options` maps each allowed numeric option
    to its default; values in `given` (keyword arguments) win over the query string. Every
    option is a positive number, except ``password_file``, the path of a file holding the
    user's password (walkit.plugins.metadata.credentials). Credentials are None without a user.
    It raises ConfigError for a URI without hosts or root, an unknown option, or a bad value;
    its messages show the URI redacted.
    """
    shown = redact(uri)
    parts = urlsplit(uri)
    if parts.scheme != scheme:
        raise ConfigError(f"{shown!r} is not a {scheme}:// URI")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    given = dict(given)
    password_file = given.pop(PASSWORD_FILE, query.pop(PASSWORD_FILE, None))
    netloc, credentials = split_userinfo(parts.netloc, shown, password_file)
    hosts = [h for h in netloc.split(",") if h]
    example = f"{scheme}://127.0.0.1:{2181 if scheme == 'zk' else 2379}/walkit"
    if not hosts or any(":" not in h for h in hosts):
        raise ConfigError(f"{shown!r} names no host:port; expected {example}")
    root = "/" + parts.path.strip("/")
    if root == "/" or "//" in root:
        raise ConfigError(f"{shown!r} names no root path; expected {example}")
    unknown = (set(query) | set(given)) - set(options)
    if unknown:
        raise ConfigError(f"{scheme} metadata: unknown option(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted([*options, PASSWORD_FILE]))}")
    values = dict(options)
    for name, text in query.items():
        try:
            values[name] = float(text)
        except ValueError:
            raise ConfigError(f"{scheme} metadata: {name}={text!r} is not a number") from None
    values.update(given)
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{scheme} metadata: {name} must be a positive number of seconds, got {value!r}")
    return hosts, root, values, credentials


class Dispatcher:
    """Dispatcher runs a store's callbacks in submission order on one thread, and a periodic tick."""

    _STOP = object()

    def __init__(self, name: str, tick_s: float, on_tick: Callable[[], None]) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._tick_s = tick_s
        self._on_tick = on_tick
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        """submit queues `fn` to run after everything submitted before it."""
        self._queue.put(fn)

    def on_thread(self) -> bool:
        """on_thread is True when called from the dispatcher's own thread."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: float) -> None:
        """stop runs what is queued, then ends the thread (waiting up to `timeout` s unless on it)."""
        self._queue.put(self._STOP)
        if not self.on_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                item = None
            if item is self._STOP:
                return
            if item is None or time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_s
                self._safely(self._on_tick)
            if item is not None:
                self._safely(item)

    @staticmethod
    def _safely(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a callback's bug must not stop the others
            log.exception("metadata callback failed")


class Registration:
    """Registration is an ephemeral key of a SessionStore (the walkit.spi.Session contract).

    `owner` is the session (ZooKeeper session id, etcd lease id) that holds the key now, or
    None while the key waits to be created again in a new session.
    """

    def __init__(self, store: "SessionStore", key: str, value: bytes) -> None:
        self._store = store
        self._key = key
        self.value = value
        self.owner: int | None = None
        self.version = 0
        self.closed = False

    @property
    def key(self) -> str:
        """key is the registered key."""
        return self._key

    def update(self, value: bytes) -> None:
        """update replaces the registered value."""
        self._store._update_registration(self, bytes(value))

    def close(self) -> None:
        """close ends the registration and deletes its key (once the server is reachable)."""
        self._store._close_registration(self)

    def __repr__(self) -> str:
        return f"<Registration {self._key!r} owner={self.owner}>"


class UserWatch:
    """UserWatch is a watch's callback; after cancel() it is never called again."""

    def __init__(self, prefix: str, callback: Callable[[str], None], on_cancel: Callable[[], None]) -> None:
        self.prefix = prefix
        self._callback = callback
        self._on_cancel = on_cancel
        self.cancelled = False

    def fire(self, key: str) -> None:
        """fire calls the callback with `key` unless the watch was cancelled."""
        if not self.cancelled:
            self._callback(key)

    def cancel(self) -> None:
        """cancel stops further calls; changes made after it returns are never reported."""
        if not self.cancelled:
            self.cancelled = True
            self._on_cancel()


class SessionStore:
    """SessionStore is the session half of a MetadataStore whose ephemeral keys need a session.

    A backend calls `_set_state` as its connection comes and goes, uses `_wait_connected` /
    `_lost_generation` around operations, and implements `_claim` (create or adopt a
    registration's key in the current session), `_release` (delete it if this session holds
    it), `_resync` (called after a reconnection) and `_shutdown`.
    """

    backend = "metadata"

    def __init__(self, uri: str, timeout: float, tick_s: float) -> None:
        self.uri = redact(uri)                   # shown in logs and errors: never with a password
        self.timeout = timeout
        self._cond = threading.Condition(threading.RLock())
        self._state = SessionState.SUSPENDED
        self._lost_count = 0
        self._lost_reason = ""
        self._closed = False
        self._token: int | None = None           # the current session (id or lease)
        self._listeners: list[Callable[[SessionState], None]] = []
        self._registrations: dict[str, Registration] = {}
        self._releases: set[tuple[str, int]] = set()     # (key, owner) to delete once reachable
        self._dispatcher = Dispatcher(f"walkit-{self.backend}-callbacks", tick_s, self._tick)

    # -- for the backends ---------------------------------------------------------------------
    def _claim(self, registration: Registration) -> None:
        """_claim creates (or adopts, if this session holds it) the registration's key; NodeExists if another holds it."""
        raise NotImplementedError

    def _release(self, key: str, owner: int) -> None:
        """_release deletes `key` if the session `owner` holds it and is the current one."""
        raise NotImplementedError

    def _resync(self, stale_only: bool) -> None:
        """_resync lets watches catch up, on the callback thread: all after a reconnection, else the stale ones."""

    def _shutdown(self) -> None:
        """_shutdown ends the session (its ephemeral keys go at once) and stops the I/O threads."""
        raise NotImplementedError

    def _set_state(self, new: SessionState, reason: str = "", token: int | None = None) -> None:
        """_set_state records a session state change and tells the listeners (on the callback thread)."""
        with self._cond:
            if self._closed and new is not SessionState.LOST:
                return
            old = self._state
            replaced = token is not None and self._token not in (None, token) and old is not SessionState.LOST
            if token is not None:
                self._token = token
            if replaced:                                # a new session, and nobody said the old one died
                self._lost_count += 1
                self._lost_reason = "the server replaced the session"
                self._dispatcher.submit(lambda: self._notify(SessionState.LOST))
                old = SessionState.LOST
            if new is old:
                return
            if new is SessionState.LOST:
                self._lost_count += 1
                self._lost_reason = reason
            self._state = new
            self._cond.notify_all()
        if new is SessionState.LOST and not self._closed:
            log.warning("%s session lost (%s): %s", self.backend, self.uri, reason)
        else:
            log.info("%s session %s (%s)%s", self.backend, new.value, self.uri, f": {reason}" if reason else "")
        if new is SessionState.CONNECTED:
            self._dispatcher.submit(lambda: self._reconnected(reclaim=old is SessionState.LOST))
        self._dispatcher.submit(lambda: self._notify(new))

    def _lost_generation(self) -> int:
        """_lost_generation counts lost sessions; an operation that sees it change lost its session."""
        with self._cond:
            return self._lost_count

    def _check_session(self, generation: int, what: str) -> None:
        """_check_session raises MetadataError if closed, SessionLost if a session was lost since `generation`."""
        with self._cond:
            if self._closed:
                raise MetadataError(f"{what}: the {self.backend} metadata store is closed")
            if self._lost_count != generation:
                raise self._session_lost(what)

    def _session_lost(self, what: str) -> SessionLost:
        """_session_lost is the error for an operation in flight when the session was lost."""
        return SessionLost(f"{what} failed: the {self.backend} session was lost "
                           f"({self._lost_reason or 'the server expired it'}); its ephemeral keys are gone "
                           f"and this store's registrations are being created again")

    def _on_callback_thread(self, what: str, fn: Callable[[], None]) -> None:
        """_on_callback_thread runs `fn` on the callback thread (after what is queued) and waits for it."""
        if self._dispatcher.on_thread():
            fn()
            return
        done = threading.Event()
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.append(exc)
            finally:
                done.set()
        self._dispatcher.submit(run)
        if not done.wait(self.timeout):
            raise MetadataError(f"{what}: the {self.backend} store's callback thread is busy "
                                f"(a watch or state callback has run for over {self.timeout:g} s)")
        if outcome:
            raise outcome[0]

    def _wait_connected(self, deadline: float, generation: int, what: str) -> None:
        """_wait_connected returns once CONNECTED, or raises SessionLost, or MetadataError at `deadline`."""
        with self._cond:
            while True:
                self._check_session(generation, what)
                if self._state is SessionState.CONNECTED:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._unreachable(what)
                self._cond.wait(remaining)

    def _unreachable(self, what: str, detail: str = "") -> MetadataError:
        """_unreachable is the error for an operation that ran out of time waiting for the server."""
        return MetadataError(f"{what}: the {self.backend} metadata store at {self.uri} is unreachable "
                             f"(no answer within {self.timeout:g} s; session {self._state.value})"
                             + (f": {detail}" if detail else ""))

    # -- MetadataStore: registrations, state -----------------------------------------------------
    def register(self, key: str, value: bytes) -> Registration:
        """register creates an ephemeral key; a live registration of another session is NodeExists.

        The key lives as long as the returned Session and this store: a lost session's keys are
        created again in the next session. A key this store registered already is replaced.
        """
        check_key(key)
        registration = Registration(self, key, bytes(value))
        self._claim(registration)
        with self._cond:
            previous = self._registrations.get(key)
            if previous is not None:
                previous.closed = True          # replaced: its key now belongs to `registration`
            self._registrations[key] = registration
        return registration

    def _update_registration(self, registration: Registration, value: bytes) -> None:
        if registration.closed:
            raise MetadataError(f"the registration of {registration.key!r} is closed")
        registration.value = value
        self._claim(registration)

    def _close_registration(self, registration: Registration) -> None:
        with self._cond:
            if registration.closed:
                return
            registration.closed = True
            if self._registrations.get(registration.key) is registration:
                del self._registrations[registration.key]
            owner, connected = registration.owner, self._state is SessionState.CONNECTED and not self._closed
        if owner is None:
            return
        if connected:
            try:
                self._release(registration.key, owner)
                return
            except MetadataError as exc:
                log.warning("cannot delete registration %r now (%s); will retry", registration.key, exc)
        with self._cond:
            self._releases.add((registration.key, owner))

    @property
    def state(self) -> SessionState:
        """state is the current session state."""
        return self._state

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """add_state_listener calls `listener(state)` (on the callback thread) on every state change."""
        self._listeners.append(listener)

    def close(self) -> None:
        """close ends the session (ephemeral keys go at once), tells listeners LOST and stops threads."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        try:
            self._shutdown()
        finally:
            self._set_state(SessionState.LOST, "the store was closed")
            self._dispatcher.stop(self.timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- on the callback thread ------------------------------------------------------------------
    def _notify(self, state: SessionState) -> None:
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:  # noqa: BLE001 - one listener's bug must not hide the change from others
                log.exception("metadata state listener failed")

    def _reconnected(self, reclaim: bool) -> None:
        if reclaim:
            self._reclaim()
        self._release_pending()
        self._resync(stale_only=False)

    def _tick(self) -> None:
        if self._state is not SessionState.CONNECTED or self._closed:
            return
        self._reclaim(only_unclaimed=True)
        self._release_pending()
        self._resync(stale_only=True)

    def _reclaim(self, only_unclaimed: bool = False) -> None:
        with self._cond:
            registrations = [r for r in self._registrations.values()
                             if not (only_unclaimed and r.owner == self._token)]
        for registration in registrations:
            if registration.closed:
                continue
            try:
                self._claim(registration)
                log.info("re-registered %r in the new %s session", registration.key, self.backend)
            except NodeExists:
                registration.owner = None
                log.warning("cannot re-register %r yet: another session holds it", registration.key)
            except MetadataError as exc:
                registration.owner = None
                if not self._closed:
                    log.warning("cannot re-register %r yet: %s", registration.key, exc)

    def _release_pending(self) -> None:
        with self._cond:
            pending = list(self._releases)
        for key, owner in pending:
            try:
                self._release(key, owner)
            except MetadataError:
                continue
            with self._cond:
                self._releases.discard((key, owner))
