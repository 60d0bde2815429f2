"""A KV leader cut off from ZooKeeper, and from nothing else, while clients write and read through every server.

Real processes: a ZooKeeper server, three bookies and three `walkit kv serve` on it. The first
leader reaches ZooKeeper only through a TCP proxy (walkit.testing.proxy); the test cuts that
link, so the leader still reaches the bookies and its clients, and its session expires on the
server while it goes on believing it may lead. Another server is elected, fences the log and
takes writes. Every read answered by a server that said it was the master (ROLE right after the
GET, on the same connection) must show every INCR acknowledged before the read was sent.
"""

from __future__ import annotations

import bisect
import threading
import time

import pytest

from walkit.local import LocalCluster
from walkit.replication.node import LEADER_CACHE_S
from walkit.testing.proxy import TcpProxy

from ..conftest import ZK_SESSION_S, fresh_root
from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess, redis

pytestmark = pytest.mark.slow


def test_a_leader_cut_off_from_zookeeper_only_answers_no_read_that_misses_an_acknowledged_write(zk_server, tmp_path):
    url = zk_server.url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=10)
    servers: list[KVProcess] = []
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files", metadata=url), \
            TcpProxy("127.0.0.1", zk_server.port) as proxy:
        try:
            a = KVProcess(tmp_path, metadata=url.replace(zk_server.address, proxy.address)).start()
            servers.append(a)
            a.wait_role(b"master")
            for _ in range(2):
                servers.append(KVProcess(tmp_path, metadata=url).start())
            for server in servers[1:]:
                server.wait_role(b"slave")

            acked: list[tuple[float, int]] = []          # (when the INCR's answer came, the count it made)
            reads: list[tuple[float, int, str, int]] = []  # (when sent, the count read, role, server index)
            stop = threading.Event()

            def writer() -> None:
                while not stop.is_set():
                    for server in servers:
                        try:
                            value = server.redis(socket_timeout=5).incr("n")
                        except redis.RedisError:
                            continue
                        acked.append((time.monotonic(), value))
                    time.sleep(0.005)

            def reader(index: int) -> None:
                r = servers[index].redis(socket_timeout=15)
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        pipe = r.pipeline(transaction=False)
                        pipe.get("n")
                        pipe.execute_command("ROLE")
                        value, role = pipe.execute()
                    except redis.RedisError:
                        time.sleep(0.01)
                        continue
                    reads.append((sent, int(value or 0), role[0].decode(), index))

            threads = [threading.Thread(target=writer, daemon=True)]
            threads += [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(3) for _ in range(2)]
            for thread in threads:
                thread.start()
            try:
                wait_until(lambda: len(acked) >= 50, 60, message="INCRs acknowledged before the cut")
                proxy.cut()                               # a reaches the bookies and its clients, not ZooKeeper
                cut_at = time.monotonic()
                by_a = len(acked)

                def new_leader_took_writes():
                    roles = []
                    for server in servers[1:]:
                        try:
                            roles.append(server.role()[0])
                        except redis.RedisError:
                            roles.append(None)
                    return b"master" in roles and len(acked) >= by_a + 50
                wait_until(new_leader_took_writes, 90, message="another server leads and takes writes")
                healed_at = len(reads) + 300              # reads and writes go on against both for a while
                wait_until(lambda: len(reads) >= healed_at, 60, message="reads after the new leader took over")
                proxy.heal()
                wait_until(lambda: a.role()[0] == b"slave", 90, message="the old leader follows once it is back")
                more = len(reads) + 100
                wait_until(lambda: len(reads) >= more, 60, message="reads after the old leader came back")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(30)

            acked.sort()
            checked = stale = 0
            highest_before: list[int] = []
            best = 0
            for _, value in acked:
                best = max(best, value)
                highest_before.append(best)
            times = [t for t, _ in acked]
            for sent, value, role, index in reads:
                if role != "master":
                    continue                              # a replica's read may be stale, as Redis' are
                i = bisect.bisect_left(times, sent)
                must_see = highest_before[i - 1] if i else 0
                checked += 1
                if value < must_see:
                    stale += 1
            assert checked > 100, f"only {checked} reads were answered by a master"
            assert stale == 0, f"{stale} of {checked} reads answered by a master missed an acknowledged INCR"
            after_cut = [r for r in reads if r[0] > cut_at and r[3] == 0 and r[2] == "master"]
            final = max(v for _, v in acked)
            for server in servers:
                wait_until(lambda server=server: int(server.redis().get("n")) >= final, 60,
                           message=f"{server.address} applied every acknowledged INCR")
            print(f"{checked} master reads checked, {len(after_cut)} of them from the cut-off leader after the cut")
        finally:
            for server in servers:
                server.stop()


def test_a_follower_cut_off_from_zookeeper_answers_role_and_readonly_at_once(zk_server, tmp_path):
    """A follower whose ZooKeeper link is cut answers ROLE, INFO and a write's READONLY within a
    2 s client timeout, naming the leader it knew, for longer than its leader cache lasts: nothing
    on its event loop waits for ZooKeeper (a read there waited the store's 10 s timeout, and every
    client of the server timed out, the writers of the test above among them)."""
    url = zk_server.url(fresh_root(), session_timeout=ZK_SESSION_S, timeout=10)
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files", metadata=url), \
            TcpProxy("127.0.0.1", zk_server.port) as proxy:
        leader = follower = None
        try:
            leader = KVProcess(tmp_path, metadata=url).start()
            leader.wait_role(b"master")
            follower = KVProcess(tmp_path, metadata=url.replace(zk_server.address, proxy.address)).start()
            known = follower.wait_role(b"slave")
            assert known[1:3] == [b"127.0.0.1", leader.port], known
            proxy.cut()
            client = follower.redis(socket_timeout=2)
            answered = 0
            until = time.monotonic() + 3 * LEADER_CACHE_S + ZK_SESSION_S   # past the cache, and the session
            while time.monotonic() < until:
                assert client.execute_command("ROLE")[:3] == [b"slave", b"127.0.0.1", leader.port]
                assert client.info("replication")["role"] == "slave"
                with pytest.raises(redis.ReadOnlyError, match=f"127.0.0.1:{leader.port}"):
                    client.set("k", "v")
                answered += 1
            assert answered > 1
            proxy.heal()
            leader.redis().set("k", "after")
            wait_until(lambda: follower.redis().get("k") == b"after", 60,
                       message="the follower applies the leader's writes once its link is back")
        finally:
            for server in (follower, leader):
                if server is not None:
                    server.stop()
