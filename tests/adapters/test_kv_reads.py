"""When a server may answer from its state: LOADING at start-up, leader reads under a lease or after a barrier."""

from __future__ import annotations

import asyncio
import threading

import pytest

from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.server import KVServer

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402


@pytest.fixture
def unstarted_server():
    """unstarted_server is a KVServer whose node has not started yet (as in the first moments of a restart)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = KVServer(KVMachine(), loop, port=0)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_a_loading_server_answers_data_commands_and_ping_with_loading(unstarted_server):
    r = redis.Redis(port=unstarted_server.port, socket_timeout=10, client_name="loader",    # CLIENT works
                    retry=Retry(NoBackoff(), 0))
    for command in (("PING",), ("ECHO", "x"), ("GET", "k"), ("MGET", "a", "b"), ("DBSIZE",), ("SET", "k", "v"),
                    ("INCR", "n"), ("KEYS", "*"), ("SCAN", "0")):
        with pytest.raises(redis.BusyLoadingError, match="is loading the store"):
            r.execute_command(*command)
    info = r.info()                                    # INFO, ROLE, CONFIG answer, as on redis-server
    assert info["loading"] == 1 and info["walkit_role"] == "loading"
    assert r.execute_command("ROLE")[3] == b"sync"
    assert r.config_get("port") == {"port": str(unstarted_server.port)}
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("GET")


def test_an_idle_leader_proves_it_leads_before_reading_and_concurrent_reads_share_barriers(kv_nodes):
    node = kv_nodes(lease_ms=0)                        # no lease: every read needs a barrier
    wait_until(lambda: node.is_leader, 10)
    r = node.redis()
    assert r.set("k", "v") and r.get("k") == b"v"
    before = r.info("replication")["read_barriers"]
    assert before >= 1
    results: list = []

    def reader() -> None:
        client = node.redis()
        results.extend(client.get("k") for _ in range(20))
    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [b"v"] * 160
    barriers = r.info("replication")["read_barriers"] - before
    assert 1 <= barriers < 160, f"{barriers} barriers for 160 reads"
    pipe = r.pipeline(transaction=False)               # reads chained to writes see exactly those writes
    for i in range(50):
        pipe.set("k", i).get("k").incr("n")
    assert pipe.execute() == [x for i in range(50) for x in (True, b"%d" % i, i + 1)]


def test_a_deposed_leader_without_a_lease_reads_what_the_new_leader_wrote(kv_nodes):
    a = kv_nodes(lease_ms=0)
    wait_until(lambda: a.is_leader, 10)
    b = kv_nodes()
    assert a.redis().set("k", "old")
    # a loses the election without noticing (as if paused): b wins, opens the log and writes.
    a.node.election.resign()
    wait_until(lambda: b.is_leader, 20, message="b takes over")
    assert b.redis().set("k", "new")
    assert a.node.is_leader                            # a has not noticed yet
    assert a.redis().get("k") == b"new"                # its barrier finds b's ledger: a steps down, catches up
    assert not a.node.is_leader


def test_a_leader_that_stepped_down_catches_up_before_it_serves_reads_as_a_follower(kv_nodes):
    a = kv_nodes()
    wait_until(lambda: a.is_leader, 10)
    b = kv_nodes()
    old = a.redis()
    assert old.set("k", "old") and old.get("k") == b"old"
    a.node.election.resign()
    wait_until(lambda: b.is_leader, 20, message="b takes over")
    with pytest.raises(redis.ResponseError, match="LedgerFenced"):
        old.set("late", "write")                       # a finds out and steps down
    wait_until(lambda: not a.node.is_leader, 10)
    assert b.redis().set("k", "new")
    assert old.get("k") == b"new"                      # never the state a had when it stopped leading
    barriers = old.info("replication")["read_barriers"]
    assert barriers >= 1
    assert b.redis().set("k", "newer")                 # caught up as a follower: a's reads are a follower's
    wait_until(lambda: old.get("k") == b"newer", 10)   # (stale at times, like a Redis replica's), no barrier
    assert old.info("replication")["read_barriers"] == barriers


@pytest.mark.parametrize("ready, leads, elected, leader, ping, write", [
    (False, False, False, None, "is loading the store", "LOADING"),
    (True, False, True, None, "elected leader and is replaying", "LOADING"),      # promoting
    (True, False, False, None, "an election is under way", "READONLY"),           # nobody leads
    (True, False, False, "b", None, "READONLY"),                                  # a follower of b
    (True, True, True, "a", None, None),                                          # the leader
])
def test_ping_says_loading_until_a_write_can_be_placed(unstarted_server, ready, leads, elected, leader, ping, write):
    """PING answers LOADING while a write gets LOADING and while no server leads, so a client that
    waits for PONG can write at once; a write while nobody leads gets READONLY at once (redis-py
    would retry LOADING with backoff). The node's state is set by hand here (each state lasts
    moments in a real run); test_kv_processes restarts a real server and writes on its first PONG."""
    from types import SimpleNamespace
    unstarted_server.node = SimpleNamespace(ready=ready, is_leader=leads, leader=leader,
                                            election=SimpleNamespace(is_leader=elected))
    r = redis.Redis(port=unstarted_server.port, socket_timeout=10, retry=Retry(NoBackoff(), 0))
    if ping is None:
        assert r.ping() is True
    else:
        with pytest.raises(redis.BusyLoadingError, match=ping):
            r.ping()
    if write is not None:
        assert str(unstarted_server.not_leader_error()).startswith(write)
    unstarted_server.node = None
