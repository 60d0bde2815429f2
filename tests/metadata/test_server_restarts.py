"""Real servers going away under connected stores: calls fail in time, then the stores carry on.

Each test runs its own ZooKeeper or etcd server, so stopping it disturbs no other test. No
call may hang: during an outage every call fails within the store's timeout, with a
MetadataError that says the store is unreachable, or SessionLost for calls caught by the loss of
the session. Registrations survive: a resumed session still holds them, and a store whose
session expired creates them again in its next one.
"""

from __future__ import annotations

import threading
import time

import pytest

from walkit.errors import MetadataError, SessionLost
from walkit.spi import SessionState
from walkit.testing.metadata import Recorder, StateLog, StoreFactory
from walkit.testing.processes import wait_until
from walkit.testing.servers import EtcdServer, ZooKeeperServer, etcd_missing, zookeeper_missing

from .expiry import expire_session, owner_of

pytestmark = [pytest.mark.servers, pytest.mark.processes]    # each test starts and restarts its own servers

TIMEOUT_S = 2.0
SLACK_S = 1.5          # scheduling slack on top of the timeout


def assert_fails_in_time(call, error=MetadataError, limit: float = TIMEOUT_S + SLACK_S) -> BaseException:
    """assert_fails_in_time checks that `call()` raises `error` within `limit` seconds, and returns it."""
    started = time.monotonic()
    with pytest.raises(error) as info:
        call()
    elapsed = time.monotonic() - started
    assert elapsed <= limit, f"{call} took {elapsed:.1f} s to fail"
    return info.value


@pytest.fixture
def zk():
    missing = zookeeper_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def etcd():
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with EtcdServer() as server:
        yield server


@pytest.fixture
def factories():
    made: list[StoreFactory] = []

    def make(url: str) -> StoreFactory:
        made.append(StoreFactory(url, expiry=0))
        return made[-1]
    yield make
    for factory in made:
        factory.close_all()


# -- ZooKeeper -----------------------------------------------------------------------------------
def test_zookeeper_restart_under_a_connected_store(zk, factories):
    stores = factories(zk.url("/r", session_timeout=10, timeout=TIMEOUT_S))
    store, other = stores(), stores()
    log = StateLog(store)
    store.register("bookies/b1", b"info")
    version = store.create("ledgers/1", b"v0")
    seen = Recorder()
    store.watch("ledgers", seen)

    zk.stop()
    wait_until(lambda: store.state is SessionState.SUSPENDED, 10, "the store noticed the outage")
    error = assert_fails_in_time(lambda: store.get("ledgers/1"))
    # On a loaded machine the 2 s lease may run out before the 2 s call timeout: either error says why.
    assert "unreachable" in str(error) or "session was lost" in str(error), error
    assert_fails_in_time(lambda: store.put("ledgers/1", b"v1", version))
    assert_fails_in_time(lambda: store.next_id("ids"))

    zk.restart()
    wait_until(lambda: log.saw(SessionState.SUSPENDED, SessionState.CONNECTED), 20, "the store reconnected")
    assert store.get("ledgers/1") == (b"v0", version)
    mark = seen.mark()
    other.put("ledgers/1", b"v1", version)
    seen.wait_for("ledgers/1", since=mark)                 # the watch was re-armed
    assert other.get("bookies/b1")[0] == b"info"           # the session survived: so did its key
    assert store.next_id("ids") == 0


def test_zookeeper_outage_longer_than_the_session(zk, factories):
    stores = factories(zk.url("/r", session_timeout=1.5, timeout=TIMEOUT_S))
    store = stores()
    log = StateLog(store)
    store.register("bookies/b1", b"info")
    store.create("ledgers/1", b"v0")

    zk.stop()
    wait_until(lambda: store.state is SessionState.SUSPENDED, 10, "the store noticed the outage")
    caught: list[BaseException] = []
    waiting = threading.Thread(target=lambda: caught.append(assert_fails_in_time(lambda: store.get("ledgers/1"),
                                                                                error=MetadataError)))
    waiting.start()
    wait_until(lambda: store.state is SessionState.LOST, 10, "the store gave the session up")
    waiting.join()
    assert isinstance(caught[0], SessionLost), caught[0]    # the call in flight lost its session
    assert "session was lost" in str(caught[0])
    assert_fails_in_time(lambda: store.get("ledgers/1"))   # new calls: unreachable, in time

    zk.restart()
    wait_until(lambda: log.saw(SessionState.SUSPENDED, SessionState.LOST, SessionState.CONNECTED), 20,
               "the store reconnected")
    assert store.get("ledgers/1")[0] == b"v0"
    other = stores()
    wait_until(lambda: other.children("bookies") == ["b1"], 10, "the registration is back")


def test_zookeeper_expired_session_registers_again(zk, factories):
    stores = factories(zk.url("/r", session_timeout=2, timeout=TIMEOUT_S))
    store, other = stores(), stores()
    log = StateLog(store)
    store.register("bookies/b1", b"info")
    first_owner = owner_of(store, "bookies/b1")

    assert expire_session(store) == first_owner
    wait_until(lambda: log.saw(SessionState.LOST, SessionState.CONNECTED), 20, "a new session")
    wait_until(lambda: other.children("bookies") == ["b1"], 10, "the registration is back")
    assert owner_of(store, "bookies/b1") not in (0, first_owner)
    assert other.get("bookies/b1")[0] == b"info"


# -- etcd ----------------------------------------------------------------------------------------
def test_etcd_restart_under_a_connected_store(etcd, factories):
    stores = factories(etcd.url("/r", lease_ttl=2, timeout=TIMEOUT_S))
    store, other = stores(), stores()
    log = StateLog(store)
    store.register("bookies/b1", b"info")
    version = store.create("ledgers/1", b"v0")
    seen = Recorder()
    store.watch("ledgers", seen)

    etcd.stop()
    error = assert_fails_in_time(lambda: store.get("ledgers/1"))
    # On a loaded machine the 2 s lease may run out before the 2 s call timeout: either error says why.
    assert "unreachable" in str(error) or "session was lost" in str(error), error
    assert_fails_in_time(lambda: store.put("ledgers/1", b"v1", version))
    assert_fails_in_time(lambda: store.next_id("ids"))
    wait_until(lambda: store.state is SessionState.LOST, 10, "the lease could not be kept alive")
    assert_fails_in_time(lambda: store.register("bookies/b2", b"info"))

    etcd.restart()
    wait_until(lambda: log.saw(SessionState.SUSPENDED, SessionState.LOST, SessionState.CONNECTED), 20,
               "the store reconnected")
    assert store.get("ledgers/1") == (b"v0", version)
    mark = seen.mark()
    other.put("ledgers/1", b"v1", version)
    seen.wait_for("ledgers/1", since=mark)                 # the watch resumed
    wait_until(lambda: other.children("bookies") == ["b1"], 10, "the registration is there")
    assert store.next_id("ids") == 0


def test_etcd_expired_lease_registers_again(etcd, factories):
    stores = factories(etcd.url("/r", lease_ttl=2, timeout=TIMEOUT_S))
    store, other = stores(), stores()
    log = StateLog(store)
    store.register("bookies/b1", b"info")
    first_lease = owner_of(store, "bookies/b1")

    assert expire_session(store) == first_lease
    wait_until(lambda: log.saw(SessionState.LOST, SessionState.CONNECTED), 20, "a new lease")
    wait_until(lambda: other.children("bookies") == ["b1"], 10, "the registration is back")
    assert owner_of(store, "bookies/b1") not in (0, first_lease)
    assert other.get("bookies/b1")[0] == b"info"
