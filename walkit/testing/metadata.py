"""walkit.testing.metadata is the MetadataStore conformance suite; every backend runs it unchanged.

    # tests/metadata/test_mine.py
    import pytest
    from walkit.testing.metadata import MetadataStoreConformance, StoreFactory

    class TestMineConformance(MetadataStoreConformance):
        @pytest.fixture
        def metadata_store_factory(self, tmp_path):
            factory = StoreFactory("mine://...", expiry=2.0)
            yield factory
            factory.close_all()

`metadata_store_factory()` returns a new store, connected to the same key space as every other
store of that factory (a fresh key space per test); `factory.url` opens that key space from
another process; `factory.expiry` is how long (seconds) the registrations of a process that
died without closing its store may outlive it (its session timeout, lease TTL or heartbeat TTL).

The suite checks the MetadataStore contract of `walkit.spi`: create, get, put and delete with
their versions and errors (NodeExists, NoSuchKey, BadVersion), children (direct children only,
sorted), next_id (0, 1, 2, ...; unique across concurrent stores), ephemeral registrations
(visible everywhere; gone at once when closed or when their store closes; gone within `expiry`
when their process is killed; Session.update), watches (create, change and delete under a
prefix; nothing after cancel) and the session state (CONNECTED; LOST on close).

What the contract leaves open is not checked: the values of versions (only that they change on
every write and work for compare-and-swap), and whether a path that only leads to deeper keys
(``a`` when only ``a/b`` was created) is itself a key (it is in ZooKeeper, not in etcd or SQLite).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import pytest

from walkit.errors import BadVersion, ConfigError, MetadataError, NodeExists, NoSuchKey
from walkit.plugins import open_metadata
from walkit.spi import MetadataStore, SessionState
from walkit.testing.holders import Holder
from walkit.testing.processes import wait_until

#: Slack, in seconds, on top of a backend's `expiry` for a dead process's keys to vanish.
EXPIRY_MARGIN = 5.0


def absent(store, key: str) -> bool:
    """absent is True when `key` does not exist in `store`."""
    try:
        store.get(key)
    except NoSuchKey:
        return True
    return False


class StoreFactory:
    """StoreFactory opens stores on one key space of one backend and closes them all at the end."""

    def __init__(self, url: str, expiry: float, **options) -> None:
        self.url = url
        self.expiry = expiry
        self.options = options
        self._stores: list = []

    def __call__(self):
        store = open_metadata(self.url, **self.options)
        self._stores.append(store)
        return store

    def close_all(self) -> None:
        """close_all closes every store this factory opened (closing twice is harmless)."""
        for store in self._stores:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - teardown: close the others too
                pass
        self._stores.clear()


class Recorder:
    """Recorder collects the keys a watch reports, and waits for one to be reported."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, key: str) -> None:
        with self._cond:
            self.keys.append(key)
            self._cond.notify_all()

    def mark(self) -> int:
        """mark returns a position: `wait_for(key, since=mark)` waits for a report after it."""
        with self._cond:
            return len(self.keys)

    def wait_for(self, key: str, since: int = 0, timeout: float = 10.0) -> None:
        """wait_for returns once `key` was reported after position `since`, or fails after `timeout` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: key in self.keys[since:], timeout):
                raise AssertionError(f"the watch did not report {key!r} within {timeout:g} s; "
                                     f"it reported {self.keys[since:]}")


class StateLog:
    """StateLog records the states a store reports to its listeners."""

    def __init__(self, store) -> None:
        self.states: list[SessionState] = []
        store.add_state_listener(self.states.append)

    def saw(self, *states: SessionState) -> bool:
        """saw is True when `states` were reported in this order (others may come between)."""
        it = iter(self.states)
        return all(any(s is want for s in it) for want in states)


class MetadataStoreConformance:
    """MetadataStoreConformance is the contract test every MetadataStore passes unchanged."""

    @pytest.fixture
    def metadata_store_factory(self) -> StoreFactory:
        """metadata_store_factory is overridden by each backend's test class (see the module docstring)."""
        raise NotImplementedError("define a metadata_store_factory fixture that returns a StoreFactory")

    @pytest.fixture
    def store(self, metadata_store_factory):
        """store is a new store of the backend under test."""
        return metadata_store_factory()

    @pytest.fixture
    def other(self, metadata_store_factory):
        """other is a second store (another session) on the same key space."""
        return metadata_store_factory()

    # -- the Protocol ----------------------------------------------------------------------------
    def test_store_satisfies_the_protocol(self, store):
        assert isinstance(store, MetadataStore)

    # -- create / get ----------------------------------------------------------------------------
    def test_create_then_get_returns_the_value_and_version(self, store):
        version = store.create("a", b"one")
        assert store.get("a") == (b"one", version)

    def test_create_of_an_existing_key_is_node_exists(self, store):
        version = store.create("a", b"one")
        with pytest.raises(NodeExists):
            store.create("a", b"two")
        assert store.get("a") == (b"one", version)

    def test_get_of_a_missing_key_is_no_such_key(self, store):
        with pytest.raises(NoSuchKey):
            store.get("missing")
        with pytest.raises(NoSuchKey):
            store.get("missing/deeper")

    @pytest.mark.parametrize("value", [b"", bytes(range(256)), os.urandom(64 * 1024)], ids=["empty", "all-bytes", "64KiB"])
    def test_values_round_trip_byte_for_byte(self, store, value):
        version = store.create("v", value)
        assert store.get("v") == (value, version)
        new_version = store.put("v", value[::-1], version)
        assert store.get("v") == (value[::-1], new_version)

    @pytest.mark.parametrize("key", ["", "/a", "a/", "a//b"])
    def test_malformed_keys_are_config_errors(self, store, key):
        with pytest.raises(ConfigError):
            store.create(key, b"x")
        with pytest.raises(ConfigError):
            store.get(key)

    # -- put -------------------------------------------------------------------------------------
    def test_put_at_the_current_version_returns_a_new_version(self, store):
        v0 = store.create("a", b"0")
        v1 = store.put("a", b"1", v0)
        v2 = store.put("a", b"2", v1)
        assert len({v0, v1, v2}) == 3
        assert store.get("a") == (b"2", v2)

    def test_put_at_a_stale_version_is_bad_version_and_changes_nothing(self, store):
        v0 = store.create("a", b"0")
        v1 = store.put("a", b"1", v0)
        with pytest.raises(BadVersion):
            store.put("a", b"lost", v0)
        assert store.get("a") == (b"1", v1)

    def test_put_of_a_missing_key_is_no_such_key(self, store):
        with pytest.raises(NoSuchKey):
            store.put("missing", b"x", 0)
        with pytest.raises(NoSuchKey):
            store.put("missing", b"x", 1)
        assert absent(store, "missing")

    def test_compare_and_swap_works_across_stores(self, store, other):
        version = store.create("a", b"0")
        assert other.get("a") == (b"0", version)
        theirs = other.put("a", b"theirs", version)
        with pytest.raises(BadVersion):
            store.put("a", b"mine", version)
        assert store.get("a") == (b"theirs", theirs)

    # -- delete ----------------------------------------------------------------------------------
    def test_delete_without_a_version(self, store):
        store.create("a", b"0")
        store.delete("a")
        assert absent(store, "a")
        with pytest.raises(NoSuchKey):
            store.delete("a")

    def test_delete_with_a_version(self, store):
        v0 = store.create("a", b"0")
        v1 = store.put("a", b"1", v0)
        with pytest.raises(BadVersion):
            store.delete("a", v0)
        assert store.get("a") == (b"1", v1)
        store.delete("a", v1)
        assert absent(store, "a")
        with pytest.raises(NoSuchKey):
            store.delete("a", v1)

    def test_a_deleted_key_can_be_created_again(self, store):
        store.create("a", b"old")
        store.delete("a")
        version = store.create("a", b"new")
        assert store.get("a") == (b"new", version)
        assert store.get("a")[0] == b"new"
        store.put("a", b"newer", version)

    # -- children --------------------------------------------------------------------------------
    def test_children_lists_direct_children_sorted(self, store):
        for key in ("c/b", "c/a", "c/a/x/y", "c/z/deep/er", "c-other/1", "cx", "d/1"):
            store.create(key, b"")
        assert store.children("c") == ["a", "b", "z"]
        assert store.children("c/a") == ["x"]
        assert store.children("c/a/x") == ["y"]
        assert store.children("c/z/deep") == ["er"]
        assert store.children("c/b") == []
        assert store.children("nothing") == []

    def test_children_follow_creates_and_deletes(self, store, other):
        for name in ("3", "1", "2"):
            store.create(f"ledgers/{name}", b"")
        assert other.children("ledgers") == ["1", "2", "3"]
        store.delete("ledgers/2")
        assert other.children("ledgers") == ["1", "3"]

    # -- next_id ---------------------------------------------------------------------------------
    def test_next_id_counts_from_zero_per_counter(self, store, other):
        assert [store.next_id("ids") for _ in range(5)] == [0, 1, 2, 3, 4]
        assert store.next_id("other-ids") == 0
        assert other.next_id("ids") == 5
        assert store.next_id("ids") == 6

    def test_next_id_is_unique_across_concurrent_stores(self, store, other):
        got: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def draw(s) -> None:
            try:
                for _ in range(25):
                    value = s.next_id("shared")
                    with lock:
                        got.append(value)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=draw, args=(s,)) for s in (store, other) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert sorted(got) == list(range(200))

    # -- registrations ---------------------------------------------------------------------------
    def test_registration_is_visible_to_other_stores(self, store, other):
        session = store.register("bookies/b1", b"info")
        assert session.key == "bookies/b1"
        assert other.get("bookies/b1")[0] == b"info"
        assert other.children("bookies") == ["b1"]

    def test_session_update_replaces_the_value(self, store, other):
        session = store.register("bookies/b1", b"rw")
        session.update(b"ro")
        assert other.get("bookies/b1")[0] == b"ro"
        assert store.get("bookies/b1")[0] == b"ro"

    def test_a_key_registered_by_another_store_is_node_exists(self, store, other):
        store.register("bookies/b1", b"first")
        with pytest.raises(NodeExists):
            other.register("bookies/b1", b"second")
        with pytest.raises(NodeExists):
            other.create("bookies/b1", b"second")
        assert other.get("bookies/b1")[0] == b"first"

    def test_registering_again_in_the_same_store_replaces_the_value(self, store, other):
        store.register("bookies/b1", b"first")
        session = store.register("bookies/b1", b"second")
        assert other.get("bookies/b1")[0] == b"second"
        session.close()
        assert absent(other, "bookies/b1")

    def test_a_closed_registration_is_gone_at_once(self, store, other):
        session = store.register("bookies/b1", b"info")
        store.register("bookies/b2", b"info")
        session.close()
        assert absent(other, "bookies/b1")
        assert other.children("bookies") == ["b2"]
        other.register("bookies/b1", b"new owner")
        session.close()                                      # closing twice is harmless
        assert other.get("bookies/b1")[0] == b"new owner"

    def test_closing_the_store_removes_its_registrations_at_once(self, store, other):
        store.register("bookies/b1", b"info")
        store.register("bookies/b2", b"info")
        store.create("ledgers/1", b"persistent")
        store.close()
        assert absent(other, "bookies/b1") and absent(other, "bookies/b2")
        assert other.get("ledgers/1")[0] == b"persistent"

    def test_the_registration_of_a_killed_process_expires(self, metadata_store_factory, other):
        with Holder("register", metadata_store_factory.url, "bookies/dead", "info") as holder:
            assert other.get("bookies/dead")[0] == b"info"
            holder.kill()
            killed_at = time.monotonic()
            wait_until(lambda: absent(other, "bookies/dead"), metadata_store_factory.expiry + EXPIRY_MARGIN,
                       "the killed holder's registration expired")
            assert time.monotonic() - killed_at <= metadata_store_factory.expiry + EXPIRY_MARGIN
        other.register("bookies/dead", b"taken over")

    # -- watches ---------------------------------------------------------------------------------
    def test_watch_reports_creates_changes_and_deletes_under_the_prefix(self, store, other):
        seen = Recorder()
        watch = store.watch("w", seen)
        steps = [
            ("w", lambda: other.create("w", b"the prefix itself")),
            ("w/a", lambda: other.create("w/a", b"1")),
            ("w/a", lambda: other.put("w/a", b"2", other.get("w/a")[1])),
            ("w/a", lambda: other.delete("w/a")),
            ("w/b/c", lambda: other.create("w/b/c", b"")),
        ]
        for key, step in steps:
            mark = seen.mark()
            step()
            seen.wait_for(key, since=mark)
        other.create("w-other/1", b"")
        other.create("wx", b"")
        other.create("elsewhere", b"")
        mark = seen.mark()
        other.create("w/last", b"")                         # reported after the three above
        seen.wait_for("w/last", since=mark)
        assert not {"w-other/1", "wx", "elsewhere"} & set(seen.keys)
        watch.cancel()

    def test_watch_reports_changes_made_by_the_same_store(self, store):
        seen = Recorder()
        store.watch("w", seen)
        store.create("w/mine", b"")
        seen.wait_for("w/mine")

    def test_a_cancelled_watch_is_not_called_again(self, store, other):
        first, second = Recorder(), Recorder()
        watch = store.watch("p", first)
        other.create("p/a", b"")
        first.wait_for("p/a")
        watch.cancel()
        store.watch("p", second)
        other.create("p/b", b"")
        second.wait_for("p/b")
        assert "p/b" not in first.keys
        watch.cancel()                                        # cancelling twice is harmless

    def test_watch_callbacks_may_call_the_store(self, store, other):
        values: list[bytes] = []
        done = threading.Event()

        def callback(key: str) -> None:
            if key == "p/a":
                values.append(store.get(key)[0])
                done.set()

        store.watch("p", callback)
        other.create("p/a", b"read from the callback")
        assert done.wait(10)
        assert values[-1] == b"read from the callback"

    # -- session state ---------------------------------------------------------------------------
    def test_state_is_connected_and_close_reports_lost(self, store):
        assert store.state is SessionState.CONNECTED
        states: list[SessionState] = []
        store.add_state_listener(states.append)
        store.close()
        wait_until(lambda: SessionState.LOST in states, 10, "the listener heard LOST")
        assert store.state is SessionState.LOST
        store.close()                                         # closing twice is harmless

    def test_operations_on_a_closed_store_are_metadata_errors(self, store):
        store.create("a", b"")
        store.close()
        for operation in (lambda: store.get("a"), lambda: store.create("b", b""), lambda: store.next_id("ids"),
                          lambda: store.register("bookies/b1", b"")):
            with pytest.raises(MetadataError):
                operation()
