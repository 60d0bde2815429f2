"""walkit.plugins.metadata.sqlite is a MetadataStore in one SQLite file (``sqlite:///path/meta.db``).

It is the embedded default: clients and bookies on one machine share the file, each process
with its own connections. Compare-and-swap runs in ``BEGIN IMMEDIATE`` transactions (one writer
at a time, across processes) in WAL mode with ``synchronous=FULL``. Reads run on a second
connection, so they never wait behind the store's own writes waiting for the write lock.

Ephemeral registrations are rows with an expiry time that a heartbeat thread pushes forward
every `ttl / 3`; a row past its expiry is treated as absent everywhere, so a killed process's
registrations vanish after `ttl` seconds, and a closed session deletes its rows at once. A
heartbeat reads the clock once it holds the write lock, so waiting for another process's commit
does not shorten the ttl it grants; a session whose rows lapsed anyway (the process was paused,
or the lock was held past the ttl) is lost, with a warning saying how late the refresh came, and
its keys are registered again in a new session. Expiry times are
on a clock that every process of the machine shares and that a change of the wall clock (NTP,
an operator, a VM resumed on another host) does not move: the kernel's CLOCK_BOOTTIME plus the
wall-clock time of the boot, which the first store of each boot (named by the kernel's boot id)
writes into the file and later ones read. So registrations neither lapse all at once when the
wall clock jumps forward nor outlive a killed process when it goes back. Rows of an earlier boot
compare by wall-clock time, as does everything off Linux. Watches poll ``PRAGMA data_version`` (which
changes when another connection commits) and compare the versions of the watched keys.

A new metadata file is created with mode 0600 (owner only), and SQLite gives its ``-wal`` and
``-shm`` files the database file's mode; an existing file keeps its mode. The file has no
users or passwords: whoever can open it can change the cluster's metadata.
"""

from __future__ import annotations

import bisect
import logging
import os
import sqlite3
import threading
import time
import uuid
from typing import Callable
from urllib.parse import parse_qsl, urlsplit

from walkit.errors import SessionLost, BadVersion, ConfigError, MetadataError, NodeExists, NoSuchKey
from walkit.plugins.metadata import check_key as _check_key
from walkit.spi import SessionState

log = logging.getLogger(__name__)

#: How soon a heartbeat that failed (the file busy or gone for a moment) is tried again.
HEARTBEAT_RETRY_S = 0.1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    expires_ms INTEGER,           -- NULL: persistent; else ephemeral, absent once past
    owner TEXT                    -- the session (store instance) that holds an ephemeral key
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS boots (
    boot_id TEXT PRIMARY KEY,     -- the kernel's boot id
    base_ms INTEGER NOT NULL      -- wall-clock time at that boot, as the first store of the boot saw it
);
"""

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _since_boot_ms() -> tuple[str, int] | None:
    """_since_boot_ms is (this boot's id, ms since boot on CLOCK_BOOTTIME), or None off Linux."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    try:
        with open(_BOOT_ID) as f:
            boot_id = f.read().strip()
    except OSError:
        return None
    return boot_id, int(time.clock_gettime(clock) * 1000)


def _create_private(path: str) -> None:
    """_create_private creates `path` empty with mode 0600 unless it exists (SQLite takes an empty file as a new database)."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


class _Registration:
    """_Registration is an ephemeral key kept alive by the store's heartbeat thread."""

    def __init__(self, store: "SqliteMetadataStore", key: str) -> None:
        self._store = store
        self._key = key

    @property
    def key(self) -> str:
        return self._key

    def update(self, value: bytes) -> None:
        self._store._update_ephemeral(self._key, value)

    def close(self) -> None:
        self._store._end_registration(self._key)


class _PollingWatch:
    def __init__(self, store: "SqliteMetadataStore", prefix: str, callback: Callable[[str], None]) -> None:
        self.prefix = prefix
        self.callback = callback
        self.snapshot = store._versions_under(prefix)
        self.cancelled = False
        self._store = store

    def cancel(self) -> None:
        self.cancelled = True
        self._store._watches.discard(self)


class SqliteMetadataStore:
    """SqliteMetadataStore is the ``sqlite://`` MetadataStore.

    Options (also as URI query parameters): `timeout` seconds for every call (default 10) and
    `ttl` seconds for ephemeral registrations (default 3).
    """

    def __init__(self, path: str, *, timeout: float = 10.0, ttl: float = 3.0) -> None:
        if ttl <= 0 or timeout <= 0:
            raise ConfigError("sqlite metadata: timeout and ttl must be positive")
        self.path = path
        self.timeout = timeout
        self.ttl = ttl
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
            _create_private(path)
            self._db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = %d" % int(timeout * 1000))
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(nodes)")}
            if "owner" not in columns:      # a file made before sessions had owners
                self._db.execute("ALTER TABLE nodes ADD COLUMN owner TEXT")
            self._base_ms = self._boot_base()
            # Reads have a connection of their own: they never queue behind this store's writes,
            # which may wait up to `timeout` for the file's write lock (WAL readers do not).
            self._reader = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise MetadataError(f"cannot open sqlite metadata at {path}: {exc}") from exc
        self._lock = threading.RLock()
        self._read_lock = threading.Lock()
        self._sync_relaxed = False        # synchronous = NORMAL is in force (a heartbeat's, not yet restored)
        self._registrations: dict[str, _Registration] = {}
        self._values: dict[str, bytes] = {}       # registered values, to register again in a new session
        self._watches: set[_PollingWatch] = set()
        self._watched_version = -1                # PRAGMA data_version when the watches were last compared
        self._watched_count = 0
        self._next_lapse = 0                      # when the next live registration lapses (ms)
        self._listeners: list[Callable[[SessionState], None]] = []
        self._closed = threading.Event()
        self._session = uuid.uuid4().hex      # owner of this store's ephemeral rows; renewed when lost
        self._refreshed = time.monotonic()    # when this session's rows last got a new expiry
        self._thread = threading.Thread(target=self._background, name="walkit-sqlite-meta", daemon=True)
        self._thread.start()

    @classmethod
    def from_uri(cls, uri: str, **options) -> "SqliteMetadataStore":
        """from_uri opens ``sqlite:///abs/path.db`` or ``sqlite://rel/path.db`` (?timeout=&ttl=)."""
        from walkit.plugins import path_of
        query = dict(parse_qsl(urlsplit(uri).query))
        for name in ("timeout", "ttl"):
            if name in query:
                try:
                    options.setdefault(name, float(query[name]))
                except ValueError:
                    raise ConfigError(f"sqlite metadata: {name}={query[name]!r} is not a number") from None
        return cls(path_of(uri.split("?", 1)[0]), **options)

    # -- the clock of expiries ----------------------------------------------------------------
    def _boot_base(self) -> int | None:
        """_boot_base is this boot's wall-clock base from the file (written by its first store), or None off Linux."""
        since = _since_boot_ms()
        if since is None:
            return None
        boot_id, elapsed = since
        select = "SELECT base_ms FROM boots WHERE boot_id = ?"
        row = self._db.execute(select, (boot_id,)).fetchone()
        if row is None:       # only the first store of a boot writes: later opens need no write lock
            self._db.execute("INSERT OR IGNORE INTO boots (boot_id, base_ms) VALUES (?, ?)",
                             (boot_id, int(time.time() * 1000) - elapsed))
            row = self._db.execute(select, (boot_id,)).fetchone()
        return row[0]

    def _now_ms(self) -> int:
        """_now_ms is the time expiries are measured on: this boot's base plus CLOCK_BOOTTIME (see the module doc)."""
        if self._base_ms is None:
            return int(time.time() * 1000)
        return self._base_ms + int(time.clock_gettime(time.CLOCK_BOOTTIME) * 1000)

    # -- plumbing -------------------------------------------------------------------------
    def _run(self, work: Callable[[sqlite3.Cursor], object], write: bool = True, durable: bool = True):
        """_run runs `work` in one transaction; `durable=False` commits without an fsync.

        Only heartbeats commit without one: a refresh of an expiry that a crash of the machine
        takes back is harmless, and an fsync queued behind a busy disk could outlast the ttl.
        """
        if self._closed.is_set():
            raise MetadataError("the sqlite metadata store is closed")
        if not write:
            return self._read(work)
        with self._lock:
            cursor = self._db.cursor()
            try:
                if not durable or self._sync_relaxed:
                    # NORMAL for a heartbeat; FULL again if an earlier restore of it failed.
                    cursor.execute("PRAGMA synchronous = NORMAL" if not durable else "PRAGMA synchronous = FULL")
                    self._sync_relaxed = not durable
                cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(cursor)
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise
                cursor.execute("COMMIT")
                return result
            except sqlite3.OperationalError as exc:
                raise MetadataError(f"sqlite metadata at {self.path}: {exc}") from exc
            finally:
                if self._sync_relaxed:
                    try:
                        cursor.execute("PRAGMA synchronous = FULL")
                        self._sync_relaxed = False
                    except sqlite3.Error:
                        pass        # the next durable write sets FULL before its BEGIN
                cursor.close()

    def _read(self, work: Callable[[sqlite3.Cursor], object]):
        """_read runs `work` in a read transaction on the reading connection."""
        with self._read_lock:
            cursor = self._reader.cursor()
            try:
                cursor.execute("BEGIN")
                try:
                    return work(cursor)
                finally:
                    cursor.execute("COMMIT")
            except (sqlite3.OperationalError, sqlite3.ProgrammingError) as exc:    # (closed meanwhile)
                raise MetadataError(f"sqlite metadata at {self.path}: {exc}") from exc
            finally:
                cursor.close()

    def _live(self, cursor: sqlite3.Cursor, key: str) -> tuple[bytes, int] | None:
        row = cursor.execute("SELECT value, version, expires_ms FROM nodes WHERE key = ?", (key,)).fetchone()
        if row is None or (row[2] is not None and row[2] < self._now_ms()):
            return None
        return row[0], row[1]

    # -- MetadataStore --------------------------------------------------------------------
    def create(self, key: str, value: bytes) -> int:
        """create makes `key`; NodeExists if it is present."""
        _check_key(key)

        def work(c: sqlite3.Cursor) -> int:
            if self._live(c, key) is not None:
                raise NodeExists(f"metadata key {key!r} already exists")
            c.execute("INSERT OR REPLACE INTO nodes (key, value, version, expires_ms) VALUES (?, ?, 0, NULL)",
                      (key, bytes(value)))
            return 0
        return self._run(work)

    def get(self, key: str) -> tuple[bytes, int]:
        """get returns (value, version); NoSuchKey if absent."""
        _check_key(key)
        found = self._run(lambda c: self._live(c, key), write=False)
        if found is None:
            raise NoSuchKey(f"no metadata key {key!r}")
        return found

    def put(self, key: str, value: bytes, expected_version: int) -> int:
        """put replaces the value at `expected_version`; BadVersion or NoSuchKey otherwise."""
        _check_key(key)

        def work(c: sqlite3.Cursor) -> int:
            found = self._live(c, key)
            if found is None:
                raise NoSuchKey(f"no metadata key {key!r}")
            if found[1] != expected_version:
                raise BadVersion(f"metadata key {key!r} is at version {found[1]}, not {expected_version}")
            c.execute("UPDATE nodes SET value = ?, version = version + 1 WHERE key = ?", (bytes(value), key))
            return expected_version + 1
        return self._run(work)

    def delete(self, key: str, expected_version: int | None = None) -> None:
        """delete removes `key`, checking its version if `expected_version` is given."""
        _check_key(key)

        def work(c: sqlite3.Cursor) -> None:
            found = self._live(c, key)
            if found is None:
                raise NoSuchKey(f"no metadata key {key!r}")
            if expected_version is not None and found[1] != expected_version:
                raise BadVersion(f"metadata key {key!r} is at version {found[1]}, not {expected_version}")
            c.execute("DELETE FROM nodes WHERE key = ?", (key,))
        self._run(work)

    def children(self, prefix: str) -> list[str]:
        """children lists the names directly under `prefix`."""
        _check_key(prefix)
        low = prefix + "/"
        high = prefix + "0"          # '0' sorts right after '/'

        def work(c: sqlite3.Cursor) -> list[str]:
            rows = c.execute("SELECT key FROM nodes WHERE key >= ? AND key < ? AND "
                             "(expires_ms IS NULL OR expires_ms >= ?)", (low, high, self._now_ms())).fetchall()
            return sorted({row[0][len(low):].split("/", 1)[0] for row in rows})
        return self._run(work, write=False)

    def next_id(self, counter: str) -> int:
        """next_id returns 0, 1, 2, ... for `counter`, unique across processes."""
        def work(c: sqlite3.Cursor) -> int:
            row = c.execute("INSERT INTO counters (name, value) VALUES (?, 0) ON CONFLICT(name) "
                            "DO UPDATE SET value = value + 1 RETURNING value", (counter,)).fetchone()
            return row[0]
        return self._run(work)

    def register(self, key: str, value: bytes) -> _Registration:
        """register creates an ephemeral key; a live registration of another session is NodeExists.

        A stale row left by a killed process expires after `ttl` seconds; one of this store is
        replaced. Rows carry this store's session id: heartbeats, updates and deletes touch only
        rows of the session, so a paused process that wakes up never refreshes or removes the
        registration of whoever took the key over.
        """
        _check_key(key)
        self._insert_ephemeral(key, value)
        registration = self._registrations[key] = _Registration(self, key)
        self._values[key] = bytes(value)
        return registration

    def _insert_ephemeral(self, key: str, value: bytes) -> None:
        session = self._session

        def work(c: sqlite3.Cursor) -> None:
            row = c.execute("SELECT expires_ms, owner FROM nodes WHERE key = ?", (key,)).fetchone()
            now = self._now_ms()
            if row is not None and (row[0] is None or row[0] >= now) and row[1] != session:
                raise NodeExists(f"metadata key {key!r} is registered by a live session")
            c.execute("INSERT OR REPLACE INTO nodes (key, value, version, expires_ms, owner) VALUES (?, ?, 0, ?, ?)",
                      (key, bytes(value), now + int(self.ttl * 1000), session))
        first = not self._registrations
        self._run(work)
        if first:                              # the session's only row: its refresh time is now
            self._refreshed = time.monotonic()

    def _update_ephemeral(self, key: str, value: bytes) -> None:
        session = self._session

        def work(c: sqlite3.Cursor) -> int:
            now = self._now_ms()
            return c.execute("UPDATE nodes SET value = ?, version = version + 1, expires_ms = ? "
                             "WHERE key = ? AND owner = ? AND expires_ms >= ?",
                             (bytes(value), now + int(self.ttl * 1000), key, session, now)).rowcount
        if not self._run(work):
            raise SessionLost(f"the registration of {key!r} expired (its session was lost)")
        self._values[key] = bytes(value)

    def _end_registration(self, key: str) -> None:
        self._values.pop(key, None)
        if self._registrations.pop(key, None) is None or self._closed.is_set():
            return
        session = self._session
        self._run(lambda c: c.execute("DELETE FROM nodes WHERE key = ? AND owner = ?", (key, session)))

    def watch(self, prefix: str, callback: Callable[[str], None]) -> _PollingWatch:
        """watch calls `callback(key)` from the store's thread after keys under `prefix` change."""
        _check_key(prefix)
        watch = _PollingWatch(self, prefix, callback)
        self._watches.add(watch)
        return watch

    @property
    def state(self) -> SessionState:
        """state is CONNECTED while open, LOST once closed (a lapsed session is renewed at once: see `_heartbeat`)."""
        return SessionState.LOST if self._closed.is_set() else SessionState.CONNECTED

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """add_state_listener registers `listener`, called with LOST when the store closes or its
        registrations lapsed, then with CONNECTED once a new session registered them again."""
        self._listeners.append(listener)

    def close(self) -> None:
        """close deletes this store's ephemeral keys and closes the connections."""
        if self._closed.is_set():
            return
        for key in list(self._registrations):
            try:
                self._end_registration(key)
            except MetadataError:
                pass
        self._closed.set()
        self._thread.join(timeout=self.timeout)
        with self._lock:
            self._db.close()
        with self._read_lock:
            self._reader.close()
        for listener in self._listeners:
            listener(SessionState.LOST)

    def __enter__(self) -> "SqliteMetadataStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- background: heartbeats and watches --------------------------------------------
    def _versions_under(self, prefix: str) -> dict[str, int]:
        low, high = prefix + "/", prefix + "0"

        def work(c: sqlite3.Cursor) -> dict[str, int]:
            rows = c.execute("SELECT key, version FROM nodes WHERE ((key >= ? AND key < ?) OR key = ?) AND "
                             "(expires_ms IS NULL OR expires_ms >= ?)", (low, high, prefix, self._now_ms())).fetchall()
            return dict(rows)
        return self._run(work, write=False)

    def _background(self) -> None:
        beat_every = self.ttl / 3
        next_beat = time.monotonic() + beat_every
        failing = False
        while not self._closed.wait(0.05):
            if time.monotonic() >= next_beat:
                started = time.monotonic()
                try:
                    self._heartbeat()
                except MetadataError as exc:
                    # The file is busy or gone for a moment: tried again soon, not a period later
                    # (registrations lapse `ttl` after their last refresh).
                    next_beat = started + HEARTBEAT_RETRY_S
                    if not failing and not self._closed.is_set():
                        log.warning("sqlite metadata at %s: refreshing registrations failed (%s); "
                                    "retrying every %g s", self.path, exc, HEARTBEAT_RETRY_S)
                    failing = True
                else:
                    failing = False
                    next_beat = started + beat_every
                    took = time.monotonic() - started
                    if took > beat_every:
                        log.warning("sqlite metadata at %s: refreshing registrations took %.1f s "
                                    "(they lapse %g s after a refresh)", self.path, took, self.ttl)
            if self._watches:
                try:
                    self._poll_watches()
                except MetadataError:
                    pass     # the file is busy or gone for a moment; the next round retries

    def _heartbeat(self) -> None:
        """_heartbeat pushes this session's registrations forward; a lapsed one means the session is lost.

        Like a ZooKeeper session that expired (for example while the process was paused), a
        lapsed registration ends the session: listeners hear LOST, a new session re-registers
        the keys still registered (those free to take) and listeners hear CONNECTED.
        """
        if not self._registrations:
            return
        session, ttl_ms = self._session, int(self.ttl * 1000)

        def work(c: sqlite3.Cursor) -> tuple[int, int, float]:
            # The clock is read holding the write lock: a wait for it (another process's commit
            # and fsync) neither shortens the ttl granted nor hides that a row already lapsed.
            # The keys too: a registration ended meanwhile has its row deleted under the lock.
            keys = list(self._registrations)
            now, refreshed = self._now_ms(), time.monotonic()
            return sum(c.execute("UPDATE nodes SET expires_ms = ? WHERE key = ? AND owner = ? AND expires_ms >= ?",
                                 (now + ttl_ms, k, session, now)).rowcount for k in keys), len(keys), refreshed
        updated, expected, refreshed = self._run(work, durable=False)
        if updated == expected:
            self._refreshed = refreshed
            return
        log.warning("sqlite metadata at %s: registrations of this process lapsed (last refreshed %.1f s ago, "
                    "ttl %g s): the session is lost, and the keys are registered again in a new one",
                    self.path, time.monotonic() - self._refreshed, self.ttl)
        # Like ZooKeeper expiring a session: every ephemeral row of the old session goes.
        self._run(lambda c: c.execute("DELETE FROM nodes WHERE owner = ?", (session,)))
        self._session = uuid.uuid4().hex
        for listener in list(self._listeners):
            listener(SessionState.LOST)
        for key in list(self._registrations):
            try:
                self._insert_ephemeral(key, self._values[key])
            except NodeExists:
                self._registrations.pop(key, None)
                self._values.pop(key, None)
        self._refreshed = time.monotonic()
        for listener in list(self._listeners):
            listener(SessionState.CONNECTED)

    def _poll_watches(self) -> None:
        """_poll_watches reports what changed under each watch: one read of the table per round, only when
        something may have changed (another connection committed, or a registration may have lapsed)."""
        watches = list(self._watches)
        now = self._now_ms()

        def changed_since(c: sqlite3.Cursor):
            version = c.execute("PRAGMA data_version").fetchone()[0]
            if version == self._watched_version and now < self._next_lapse and len(watches) == self._watched_count:
                return version, None
            return version, c.execute("SELECT key, version, expires_ms FROM nodes WHERE expires_ms IS NULL "
                                      "OR expires_ms >= ? ORDER BY key", (now,)).fetchall()
        version, rows = self._run(changed_since, write=False)
        if rows is None:
            return
        self._watched_version, self._watched_count = version, len(watches)
        self._next_lapse = min((r[2] for r in rows if r[2] is not None), default=1 << 62) + 1
        keys = [r[0] for r in rows]
        for watch in watches:
            prefix = watch.prefix
            low, high = bisect.bisect_left(keys, prefix + "/"), bisect.bisect_left(keys, prefix + "0")
            current = {keys[i]: rows[i][1] for i in range(low, high)}
            exact = bisect.bisect_left(keys, prefix)
            if exact < len(keys) and keys[exact] == prefix:
                current[prefix] = rows[exact][1]
            if current == watch.snapshot:
                continue
            changed = {k for k in current.keys() | watch.snapshot.keys()
                       if current.get(k) != watch.snapshot.get(k)}
            watch.snapshot = current
            for key in sorted(changed):
                if watch.cancelled:          # cancelled while this round ran: report nothing more
                    break
                try:
                    watch.callback(key)
                except Exception:  # noqa: BLE001 - a watcher's bug must not stop the heartbeats
                    pass
