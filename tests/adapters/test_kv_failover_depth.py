"""Scans, transactions and scripts across a SIGKILLed leader, as real processes.

- A SCAN cursor names a key, not a server's memory: a scan begun on the leader goes on on the
  new leader after a SIGKILL, and returns every key that existed throughout it.
- A transaction (MULTI ... EXEC) and a script (EVAL) are one log record each: when the leader is
  killed while clients stream them, every one is on the new leader whole or not at all, and
  every one acknowledged is there.
"""

from __future__ import annotations

import threading

import pytest

from walkit.local import LocalCluster

from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess, redis

pytestmark = pytest.mark.slow


@pytest.fixture
def pair(tmp_path):
    """pair is a leader and a follower `walkit kv serve` of one store on three bookies."""
    made: list[KVProcess] = []
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        try:
            a = KVProcess(tmp_path, metadata=cluster.metadata_url)
            made.append(a)
            a.start().wait_role(b"master")
            b = KVProcess(tmp_path, metadata=cluster.metadata_url)
            made.append(b)
            b.start().wait_role(b"slave")
            yield a, b
        finally:
            for server in made:
                server.stop()


def test_a_scan_goes_on_after_the_leader_is_killed_and_returns_every_key_that_existed_throughout(pair):
    a, b = pair
    r = a.redis()
    pipe = r.pipeline(transaction=False)
    for i in range(3000):
        pipe.set(f"key:{i:05d}", i)
    pipe.execute()
    wait_until(lambda: b.redis().dbsize() == 3000, 30, message="the follower did not apply every key")
    seen: list[bytes] = []
    cursor = 0
    for _ in range(10):                                  # a third of the scan on the leader
        cursor, keys = r.scan(cursor, count=100)
        seen += keys
    assert cursor != 0
    deleted = {f"key:{i:05d}".encode() for i in range(0, 3000, 7)}
    r.delete(*deleted)                                   # changes during the scan
    r.mset({f"new:{i}": i for i in range(100)})
    a.kill()
    b.wait_role(b"master")
    survivor = b.redis()
    while True:                                          # the same cursor, on the other server
        cursor, keys = survivor.scan(cursor, count=100)
        seen += keys
        if cursor == 0:
            break
    throughout = {f"key:{i:05d}".encode() for i in range(3000)} - deleted
    assert throughout <= set(seen)
    assert len(seen) == len(set(seen))                  # and none twice


def test_transactions_and_scripts_streamed_through_a_killed_leader_apply_whole_or_not_at_all(pair):
    a, b = pair
    script = ("redis.call('set', KEYS[1] .. ':a', ARGV[1]); redis.call('set', KEYS[1] .. ':b', ARGV[1]); "
              "redis.call('incrby', 'total', 2); return redis.call('incr', 'scripts')")
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def stream(worker: int) -> None:
        client = a.redis(socket_timeout=10)
        for n in itertools_count():
            if stop.is_set():
                return
            name = f"w{worker}:{n}"
            try:
                if n % 2:
                    with client.pipeline() as pipe:     # MULTI ... EXEC
                        pipe.set(f"{name}:a", n).set(f"{name}:b", n).incrby("total", 2)
                        pipe.execute()
                else:
                    client.eval(script, 1, name, n)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                return                                   # the leader was killed under it
            with lock:
                acked.append(name)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(acked) >= 200, 60, message="the writers did not get going")
        a.kill()                                         # mid-stream: records in flight, some answered
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    b.wait_role(b"master")
    r = b.redis()
    applied = {key.rsplit(b":", 1)[0] for key in r.keys("w*")}
    for name in applied:
        first, second = r.mget(name + b":a", name + b":b")
        assert first is not None and first == second, name      # both or neither
    assert {name.encode() for name in acked} <= applied          # every acknowledged one is there
    assert int(r.get("total")) == 2 * len(applied)               # and each counted once, whole
    assert len(r.keys("w*")) == 2 * len(applied)


def itertools_count():
    n = 0
    while True:
        yield n
        n += 1
