"""`walkit kv serve` as real processes: SIGKILL and restart, failover between two servers, redis tools."""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

import walkit
from walkit.local import LocalCluster
from tests.support import pause

from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess, redis, redis_cli
from redis.backoff import NoBackoff  # noqa: E402  (a test dependency)
from redis.retry import Retry  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def servers(tmp_path):
    """servers makes KVProcesses (`servers(**options)`) and stops every one at the end."""
    made: list[KVProcess] = []

    def make(**options) -> KVProcess:
        server = KVProcess(tmp_path, **options)
        made.append(server)
        return server
    yield make
    for server in made:
        server.stop()


def write_everything(server: KVProcess, tag: str, count: int) -> dict[bytes, bytes]:
    """write_everything writes through redis-py (pipelined and not) and redis-cli; it returns what was acked."""
    r = server.redis()
    expected: dict[bytes, bytes] = {}
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"{tag}:py:{i}", f"value-{i}")
        expected[f"{tag}:py:{i}".encode()] = f"value-{i}".encode()
    assert all(pipe.execute())
    for _ in range(25):
        r.incr(f"{tag}:counter")
    expected[f"{tag}:counter".encode()] = b"25"
    assert r.set(f"{tag}:ttl", "lasting", ex=3600)
    expected[f"{tag}:ttl".encode()] = b"lasting"
    for i in range(5):
        assert redis_cli(server.port, "SET", f"{tag}:cli:{i}", f"from cli {i}") == "OK"
        expected[f"{tag}:cli:{i}".encode()] = f"from cli {i}".encode()
    assert redis_cli(server.port, "INCRBY", f"{tag}:cli:counter", "7") == "7"
    expected[f"{tag}:cli:counter".encode()] = b"7"
    return expected


def assert_present(server: KVProcess, expected: dict[bytes, bytes]) -> None:
    keys = sorted(expected)
    assert server.redis().mget(keys) == [expected[k] for k in keys]
    for key in [k for k in keys if b":cli:" in k]:
        assert redis_cli(server.port, "GET", key.decode()) == expected[key].decode()


def test_values_survive_sigkill_of_the_server_and_of_the_server_with_its_bookies(servers, tmp_path):
    server = servers(data_dir=tmp_path / "data", args=("--snapshot-every", "150", "--roll-entries", "20"))
    server.start().wait_role(b"master")
    expected = write_everything(server, "first", 400)

    server.kill()                                        # the server only; its bookies follow on their own
    server.start().wait_role(b"master")
    assert_present(server, expected)
    assert server.redis().info("persistence")["snapshot_position"]     # it started from a snapshot
    assert 3500 < server.redis().ttl("first:ttl") <= 3600
    expected |= write_everything(server, "second", 300)

    server.kill(with_bookies=True)                       # the server and every bookie at once
    server.start().wait_role(b"master")
    assert_present(server, expected)
    assert server.redis().dbsize() == len(expected)


def test_failover_keeps_every_acked_write_and_the_old_leader_comes_back_as_a_follower(servers, tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url).start()
        a.wait_role(b"master")
        b = servers(metadata=cluster.metadata_url).start()
        assert b.wait_role(b"slave")[1:3] == [b"127.0.0.1", a.port]
        expected = write_everything(a, "before", 300)

        acked: dict[bytes, bytes] = {}
        attempted: list[bytes] = []
        stop = threading.Event()

        def writer() -> None:                            # writes until the leader dies under it
            r = a.redis(socket_timeout=5)
            i = 0
            while not stop.is_set():
                key, value = f"live:{i}".encode(), f"v{i}".encode()
                attempted.append(key)
                try:
                    if r.set(key, value):
                        acked[key] = value
                except redis.RedisError:
                    return
                i += 1
        thread = threading.Thread(target=writer)
        thread.start()
        wait_until(lambda: len(acked) >= 200, 30, message="writes acknowledged before the kill")
        a.kill()
        killed = time.monotonic()
        thread.join(30)
        stop.set()

        b.wait_role(b"master", timeout=30)
        took = time.monotonic() - killed
        assert took < 10, f"failover took {took:.1f} s"
        expected |= acked
        assert_present(b, expected)
        expected |= write_everything(b, "after", 100)

        a.start()                                        # the old leader, restarted, must follow
        assert a.wait_role(b"slave")[1:3] == [b"127.0.0.1", b.port]
        with pytest.raises(redis.ReadOnlyError, match=f"Leader: {b.address}"):
            a.redis().set("behind-its-back", "x")
        assert redis_cli(a.port, "SET", "behind-its-back", "x") == f"READONLY You can't write against a read " \
                                                                  f"only replica. Leader: {b.address}"
        leader_records = b.redis().info("replication")["applied_records"]
        wait_until(lambda: a.redis().info("replication")["applied_records"] == leader_records, 30)
        assert_present(a, expected)
        in_doubt = {attempted[-1]}                       # sent when the leader died: it may or may not be in
        keys = set(b.redis().keys("*"))
        assert keys - set(expected) <= in_doubt and set(a.redis().keys("*")) == keys
        assert b.redis().get("behind-its-back") is None


def test_many_writers_a_paused_bookie_and_a_killed_leader_lose_no_acked_write(servers, tmp_path):
    """Sixteen connections write at once, so the leader's entries linger for them (LINGER_MS); then
    a bookie of the log's ensemble is held with SIGSTOP (its acks stop until the writer replaces
    it) and the leader is killed while the bookie is still held, which it stays until the new
    leader took writes of its own. The new leader has every acknowledged write, and nothing else
    but the one write each connection had in flight."""
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url).start()
        a.wait_role(b"master")
        b = servers(metadata=cluster.metadata_url).start()
        b.wait_role(b"slave")
        writers = 16
        acked: dict[bytes, bytes] = {}
        in_flight: dict[int, bytes] = {}

        def writer(k: int) -> None:                     # closed loop: the next SET once the last was acked
            r = a.redis(socket_timeout=60)
            for i in itertools.count():
                key, value = f"w{k}:{i}".encode(), f"{k}-{i}".encode()
                in_flight[k] = key
                try:
                    if not r.set(key, value):
                        return
                except redis.RedisError:
                    return                              # the leader died under it
                acked[key] = value
        threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(writers)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(acked) >= 400, 60, message="writes acknowledged before the pause")

        with walkit.Client(cluster.metadata_url) as client:
            ledger = client.ledger_metadata(client.log_metadata("replicated-kv-default").ledger_ids[-1])
        held = cluster.pid(cluster.addresses.index(ledger.ensembles[max(ledger.ensembles)][0]))
        pause.stop(held, cluster.metadata_url)              # never inside a write to the metadata file
        try:
            at_pause = len(acked)
            # Acks from the held bookie stop; the writer replaces it after the add timeout and goes on.
            wait_until(lambda: len(acked) >= at_pause + 400, 90,
                       message=lambda: f"{len(acked) - at_pause} writes acknowledged since the pause")
            a.kill()                                    # the bookie is still held
            for thread in threads:
                thread.join(60)
            assert not any(thread.is_alive() for thread in threads)
            b.wait_role(b"master", timeout=60)          # and still while b recovers the log and takes writes
            r = b.redis()
            for i in range(50):
                assert r.set(f"after:{i}", "x")
        finally:
            os.kill(held, signal.SIGCONT)

        keys = sorted(acked)
        assert r.mget(keys) == [acked[k] for k in keys]
        assert r.dbsize() == len(set(r.keys("w*"))) + 50
        unexpected = set(r.keys("w*")) - set(acked)
        assert unexpected <= set(in_flight.values()), sorted(unexpected)[:10]


def test_redis_benchmark_and_redis_cli_work_unchanged(servers, tmp_path):
    server = servers(data_dir=tmp_path / "data").start()
    server.wait_role(b"master")
    # every default test of redis-benchmark (strings, lists, sets, hashes, sorted sets, MSET)
    done = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port),
                           "-n", "2000", "-c", "20", "-r", "1000", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rates = dict(re.findall(r"^(\S[^:]*): ([\d.]+) requests per second", done.stdout.replace("\r", "\n"), re.M))
    assert set(rates) == {"PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "LPUSH", "RPUSH", "LPOP", "RPOP", "SADD",
                          "HSET", "SPOP", "ZADD", "ZPOPMIN", "LPUSH (needed to benchmark LRANGE)",
                          "LRANGE_100 (first 100 elements)", "LRANGE_300 (first 300 elements)",
                          "LRANGE_500 (first 500 elements)", "LRANGE_600 (first 600 elements)", "MSET (10 keys)"}, rates
    assert all(float(v) > 0 for v in rates.values())
    assert "ERR" not in done.stdout + done.stderr
    assert int(redis_cli(server.port, "DBSIZE")) > 0
    counters = server.redis().keys("counter:*")
    assert sum(int(v) for v in server.redis().mget(counters)) == 2000      # every INCR applied once
    scanned = subprocess.run(["redis-cli", "-p", str(server.port), "--scan", "--pattern", "key:*"],
                             capture_output=True, text=True, timeout=30)
    assert scanned.returncode == 0
    assert sorted(scanned.stdout.split()) == sorted(k.decode() for k in server.redis().keys("key:*"))
    piped = subprocess.run(["redis-cli", "-p", str(server.port)], input="SET piped yes\nGET piped\nNOSUCH\nPING\n",
                           capture_output=True, text=True, timeout=30)
    assert [line for line in piped.stdout.splitlines() if line] == [
        "OK", "yes", "ERR unknown command 'NOSUCH', with args beginning with: ", "PONG"]
    assert "role:master" in redis_cli(server.port, "INFO", "replication")
    # the data types and a transaction, typed into redis-cli
    typed = subprocess.run(["redis-cli", "-p", str(server.port)],
                           input="HSET h a 1 b 2\nHGETALL h\nRPUSH l x y\nLRANGE l 0 -1\nSADD s m\nZADD z 1.5 m\n"
                                 "ZSCORE z m\nMULTI\nINCR n\nINCR n\nEXEC\nGET h\n",
                           capture_output=True, text=True, timeout=30)
    assert [line for line in typed.stdout.splitlines() if line] == [
        "2", "a", "1", "b", "2", "2", "x", "y", "1", "1", "1.5", "OK", "QUEUED", "QUEUED", "1", "2",
        "WRONGTYPE Operation against a key holding the wrong kind of value"]


def test_a_restart_waits_until_bookies_of_the_previous_run_release_their_ports(tmp_path):
    data = str(tmp_path / "data")
    with LocalCluster(bookies=1, data_dir=data, storage="memory") as cluster:
        port = int(cluster.addresses[0].rsplit(":", 1)[1])
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    # Like a bookie of a killed run that is still shutting down: it lets go of its port later.
    release = threading.Timer(3.0, squatter.close)
    release.start()
    try:
        with LocalCluster(bookies=1, data_dir=data, storage="memory") as cluster:
            assert cluster.is_running(0) and cluster.addresses == [f"127.0.0.1:{port}"]
    finally:
        release.cancel()
        squatter.close()


def first_pong(server: KVProcess, timeout: float = 90.0) -> None:
    """first_pong returns as soon as PING answers PONG (LOADING and refused connections are "not yet"),
    as a script that waits for the server would; the server must not have exited."""
    client = server.redis(socket_timeout=5, retry=Retry(NoBackoff(), 0))
    server.wait(lambda: client.ping(), timeout, "answering PONG", interval=0.005)


def test_a_single_server_is_writable_on_its_first_pong_over_many_restarts(servers, tmp_path):
    """Issue 43, readiness: PING answers LOADING for as long as a write would, so the usual
    "wait for PONG, then write" works on a fresh data dir and after each restart (clean or SIGKILL)."""
    server = servers(data_dir=tmp_path / "data")
    written: dict[bytes, bytes] = {}
    for round_ in range(8):
        server.start()
        first_pong(server)
        r = server.redis(retry=Retry(NoBackoff(), 0))             # redis-py retries LOADING by default: not here
        assert r.set(f"round:{round_}", round_) is True             # the first command after PONG writes
        assert r.info("persistence")["loading"] == 0
        written[f"round:{round_}".encode()] = str(round_).encode()
        assert {k: r.get(k) for k in written} == written
        if round_ % 2:
            server.kill(with_bookies=True)
            server.wait_bookies_gone()
        else:
            server.stop()
