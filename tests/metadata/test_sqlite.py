"""The sqlite:// metadata backend passes the MetadataStore conformance suite."""

from __future__ import annotations

import sqlite3
import time

import pytest

from walkit.testing.metadata import MetadataStoreConformance


class TestSqliteConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, sqlite_factory):
        """metadata_store_factory opens stores on one SQLite file."""
        return sqlite_factory


def register_once_free(store, key: str, value: bytes, failure: str, timeout: float = 10.0) -> None:
    """register_once_free registers `key` as soon as another process's registration of it lapsed."""
    from walkit.errors import NodeExists

    deadline = time.monotonic() + timeout
    while True:
        try:
            store.register(key, value)
            return
        except NodeExists:
            assert time.monotonic() < deadline, failure
            time.sleep(0.1)


@pytest.mark.processes
def test_a_paused_holder_never_touches_its_successors_registration(tmp_path):
    """A process paused past its TTL loses its key; when it wakes it must not refresh or delete the new holder's.

    The holder is SIGSTOPped until its registration lapses, another store registers the key, then
    the holder is resumed and closed: the successor's registration stays, with its value.
    """
    import signal
    import time

    from walkit.plugins import open_metadata
    from walkit.testing.holders import Holder

    url = f"sqlite://{tmp_path}/meta.db?ttl=1&timeout=5"
    with open_metadata(url) as successor:
        holder = Holder("register", url, "bookies/b1", "old")
        try:
            holder.process.send_signal(signal.SIGSTOP)
            # The paused holder's row lapses, then the key is free.
            register_once_free(successor, "bookies/b1", b"new", "the paused holder's registration never lapsed")
            holder.process.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 3          # let the woken holder run its heartbeats
            while time.monotonic() < deadline:
                assert successor.get("bookies/b1")[0] == b"new"
                time.sleep(0.1)
        finally:
            holder.close()
        assert successor.get("bookies/b1")[0] == b"new"     # the holder's close deleted nothing of ours


def test_a_failed_heartbeat_is_tried_again_soon_not_a_period_later(tmp_path, monkeypatch):
    """A heartbeat that fails (the file busy for a moment) is retried within HEARTBEAT_RETRY_S.

    With ttl 6 s a period is 2 s; waiting that long after a failure would leave the
    registration one failure away from lapsing.
    """
    import threading
    import time

    from walkit.errors import MetadataError
    from walkit.plugins.metadata.sqlite import SqliteMetadataStore

    calls: list[float] = []
    retried = threading.Event()

    def flaky_heartbeat(self) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise MetadataError("database is locked")
        retried.set()

    monkeypatch.setattr(SqliteMetadataStore, "_heartbeat", flaky_heartbeat)
    store = SqliteMetadataStore(str(tmp_path / "meta.db"), ttl=6)
    try:
        assert retried.wait(30), "the heartbeat was not tried again"
        assert calls[1] - calls[0] < 1.5        # a retry, not the next 2 s period
    finally:
        store.close()


def test_heartbeats_commit_without_fsync_and_other_writes_with_it(tmp_path):
    """Only the heartbeat's expiry refresh commits with synchronous=NORMAL (no fsync in WAL mode).

    An fsync stuck behind a busy disk must not outlast the ttl; every other write still commits
    with synchronous=FULL.
    """
    from walkit.plugins.metadata.sqlite import SqliteMetadataStore

    store = SqliteMetadataStore(str(tmp_path / "meta.db"), ttl=30)
    try:
        store.register("walkit/test/eph", b"v")
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        store._heartbeat()
        heartbeat, statements[:] = list(statements), []
        store.create("walkit/test/persistent", b"p")
        create = list(statements)
        store._db.set_trace_callback(None)
        assert heartbeat[0] == "PRAGMA synchronous = NORMAL" and heartbeat[-1] == "PRAGMA synchronous = FULL"
        assert any(s.startswith("UPDATE nodes SET expires_ms") for s in heartbeat)
        assert not any("synchronous" in s for s in create)
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2      # FULL
    finally:
        store.close()


def test_a_heartbeat_that_waited_for_the_write_lock_grants_a_whole_ttl(tmp_path):
    """A heartbeat kept waiting by another process's commit counts the new expiry from its own commit.

    Another connection holds the write lock for 2 s (a commit and its fsync on a busy disk), so
    the heartbeats due meanwhile wait. The clock is read holding the lock: the expiry written is
    at least ttl after the lock came free, not ttl after the heartbeat started waiting.
    """

    from walkit.plugins.metadata.sqlite import SqliteMetadataStore

    path = str(tmp_path / "meta.db")
    store = SqliteMetadataStore(path, ttl=3)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        store.register("walkit/test/eph", b"v")

        def expiry() -> int:
            return other.execute("SELECT expires_ms FROM nodes WHERE key = 'walkit/test/eph'").fetchone()[0]
        other.execute("BEGIN IMMEDIATE")
        before = expiry()
        time.sleep(2.0)                  # the stall itself: a heartbeat (every 1 s) is due and waits
        released = store._now_ms()
        other.execute("COMMIT")
        deadline = time.monotonic() + 10
        while expiry() == before:
            assert time.monotonic() < deadline, "no heartbeat after the lock came free"
            time.sleep(0.01)
        assert expiry() >= released + 3000
    finally:
        other.close()
        store.close()


def test_reads_do_not_wait_behind_a_heartbeat_waiting_for_the_write_lock(tmp_path):
    """While another process holds the write lock, this store's heartbeat waits for it; its reads do not.

    A bookie's metadata reads (garbage collection, decommission checks, access checks) must not
    stall for the store's timeout because its own heartbeat is queued for the file's write lock.
    """
    import threading

    from walkit.plugins.metadata.sqlite import SqliteMetadataStore

    path = str(tmp_path / "meta.db")
    store = SqliteMetadataStore(path, ttl=30, timeout=30)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        store.register("walkit/test/eph", b"v")
        store.create("walkit/test/persistent", b"p")
        other.execute("BEGIN IMMEDIATE")
        heartbeat = threading.Thread(target=store._heartbeat)
        heartbeat.start()                           # it takes the store's lock, then waits for the file's
        deadline = time.monotonic() + 10
        while store._lock.acquire(blocking=False):
            store._lock.release()
            assert time.monotonic() < deadline, "the heartbeat never took the store's lock"
            time.sleep(0.01)
        assert store.get("walkit/test/persistent")[0] == b"p"
        assert store.children("walkit/test") == ["eph", "persistent"]
        assert heartbeat.is_alive()                 # the reads were served while it still waited
        other.execute("COMMIT")
        heartbeat.join(10)
        assert not heartbeat.is_alive()
    finally:
        other.close()
        store.close()


def test_a_lapsed_session_says_in_the_log_how_late_its_refresh_came(tmp_path, caplog):
    """A session whose registrations lapsed logs a warning naming how long ago they were refreshed.

    The store's lock is held past the ttl, as a paused process would: the heartbeat that runs
    afterwards finds the row lapsed, warns, and the session is lost and renewed.
    """
    import re
    import threading

    from walkit.plugins.metadata.sqlite import SqliteMetadataStore
    from walkit.spi import SessionState

    store = SqliteMetadataStore(str(tmp_path / "meta.db"), ttl=0.5)
    try:
        store.register("walkit/test/eph", b"v")
        lost, connected = threading.Event(), threading.Event()
        store.add_state_listener(lambda state: (lost if state == SessionState.LOST else connected).set())
        with store._lock:               # the heartbeat thread cannot refresh meanwhile
            expires = store._db.execute("SELECT expires_ms FROM nodes").fetchone()[0]
            while store._now_ms() <= expires:
                time.sleep(0.05)
        assert lost.wait(10), "the lapse was not noticed"
        warnings = [r.getMessage() for r in caplog.records if "lapsed" in r.getMessage()]
        assert warnings, "no warning about the lapse"
        late = float(re.search(r"last refreshed ([0-9.]+) s ago, ttl 0.5 s", warnings[0]).group(1))
        assert late >= 0.5
        assert connected.wait(10), "the keys were not registered again"
        assert store.children("walkit/test") == ["eph"]          # registered again, in a new session
    finally:
        store.close()


class _FailingCursor:
    """A cursor that raises sqlite3.OperationalError on the statements named in `fail`."""

    def __init__(self, cursor, fail: set[str]):
        self._cursor, self._fail = cursor, fail

    def execute(self, sql, *args):
        if sql in self._fail:
            self._fail.discard(sql)
            raise sqlite3.OperationalError(f"injected failure of {sql!r}")
        return self._cursor.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


class _FailingConnection:
    def __init__(self, db, fail: set[str]):
        self._db, self.fail = db, fail

    def cursor(self):
        return _FailingCursor(self._db.cursor(), self.fail)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_failing_heartbeat_pragma_is_a_metadata_error_and_full_sync_comes_back(tmp_path):
    """A failure of the heartbeat's synchronous pragmas is a MetadataError (the heartbeat thread
    retries those) and never leaves later writes committing without an fsync."""
    from walkit.errors import MetadataError
    from walkit.plugins.metadata.sqlite import SqliteMetadataStore

    store = SqliteMetadataStore(str(tmp_path / "meta.db"), ttl=30)
    real = store._db
    try:
        store.register("walkit/test/eph", b"v")
        store._db = _FailingConnection(real, {"PRAGMA synchronous = NORMAL"})
        with pytest.raises(MetadataError, match="injected"):
            store._heartbeat()
        assert real.execute("PRAGMA synchronous").fetchone()[0] == 2      # still FULL

        store._db.fail.add("PRAGMA synchronous = FULL")      # the restore after the heartbeat fails
        store._heartbeat()
        assert real.execute("PRAGMA synchronous").fetchone()[0] == 1      # NORMAL, left behind
        statements: list[str] = []
        real.set_trace_callback(statements.append)
        store.create("walkit/test/persistent", b"p")
        real.set_trace_callback(None)
        assert statements[0] == "PRAGMA synchronous = FULL"       # before the create's BEGIN
        assert statements[1].startswith("BEGIN")
        assert real.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        store._db = real
        store.close()


def test_a_wall_clock_jump_forward_lapses_no_live_registration(tmp_path, monkeypatch):
    """Expiries do not follow the wall clock: set an hour ahead, it takes no live registration away.

    (NTP or an operator stepping the clock, a VM resumed elsewhere.) On wall-clock expiries
    every row would look lapsed at once: bookies would vanish from the listing and every
    session would be lost.
    """
    import threading

    from walkit.errors import NodeExists
    from walkit.plugins.metadata.sqlite import SqliteMetadataStore
    from walkit.spi import SessionState

    path = str(tmp_path / "meta.db")
    store = SqliteMetadataStore(path, ttl=1)
    later = None
    try:
        store.register("walkit/test/eph", b"v")
        lost = threading.Event()
        store.add_state_listener(lambda state: lost.set() if state == SessionState.LOST else None)
        expiry = lambda: store._db.execute("SELECT expires_ms FROM nodes").fetchone()[0]  # noqa: E731
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600)
        assert store.children("walkit/test") == ["eph"]
        seen, deadline = {expiry()}, time.monotonic() + 10
        while len(seen) < 4:                        # three heartbeats ran after the jump
            assert time.monotonic() < deadline, "no heartbeats after the jump"
            time.sleep(0.05)
            seen.add(expiry())
        assert not lost.is_set(), "the jump lost the session"
        assert store.children("walkit/test") == ["eph"]
        later = SqliteMetadataStore(path, ttl=1)      # a process started after the jump agrees
        assert later.children("walkit/test") == ["eph"]
        with pytest.raises(NodeExists):
            later.register("walkit/test/eph", b"other")
    finally:
        if later is not None:
            later.close()
        store.close()


@pytest.mark.processes
def test_a_killed_holders_registration_lapses_though_the_wall_clock_went_back(tmp_path, monkeypatch):
    """Set an hour back, the wall clock does not keep a dead process's registration alive for that hour."""
    from walkit.errors import NodeExists
    from walkit.plugins.metadata.sqlite import SqliteMetadataStore
    from walkit.testing.holders import Holder

    path = tmp_path / "meta.db"
    holder = Holder("register", f"sqlite://{path}?ttl=1", "walkit/test/b1", "old")
    store = None
    try:
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - 3600)
        store = SqliteMetadataStore(str(path), ttl=1)
        with pytest.raises(NodeExists):             # alive: its row holds the key
            store.register("walkit/test/b1", b"new")
        holder.kill()
        register_once_free(store, "walkit/test/b1", b"new", "the killed holder's registration did not lapse in 10 s")
        assert store.get("walkit/test/b1")[0] == b"new"
    finally:
        holder.close()
        if store is not None:
            store.close()
