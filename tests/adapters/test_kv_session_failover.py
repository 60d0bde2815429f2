"""Retried INCRs across a SIGKILLed leader, as real processes: with SESSION once, without it at least once.

The leader is killed at the worst moment for a retry: its entry is in the log (acknowledged by
the bookies) and nobody was answered yet (the failpoint ``replicate.acked``). The client's
retry then goes to the new leader, which replayed that entry.
"""

from __future__ import annotations

import random
import threading

import pytest

from walkit.local import LocalCluster

from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess, redis

pytestmark = pytest.mark.slow

#: A server started with this dies (SIGKILL) once an entry it appended as leader was acknowledged.
DIES_AT_ACK = {"WALKIT_FAILPOINTS": "replicate.acked=kill"}


@pytest.fixture
def servers(tmp_path):
    made: list[KVProcess] = []

    def make(**options) -> KVProcess:
        server = KVProcess(tmp_path, **options)
        made.append(server)
        return server
    yield make
    for server in made:
        server.stop()


def retried(servers: list[KVProcess], *command, timeout: float = 60.0):
    """retried sends `command` to whichever server leads until one answers it (as a client library retries)."""
    def attempt():
        for server in servers:
            if server.process.poll() is not None:
                continue
            try:
                return ("ok", server.redis(socket_timeout=10).execute_command(*command))
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, redis.BusyLoadingError):
                continue
            except redis.ResponseError as exc:
                if str(exc).startswith(("TRYAGAIN", "LOADING", "ERR the log refused", "ERR this server")):
                    continue
                raise
        return None
    return wait_until(attempt, timeout, message=f"a leader answered {command}")[1]


def test_a_session_incr_whose_leader_died_at_its_ack_applies_once_on_the_new_leader(servers, tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url, env=DIES_AT_ACK).start()
        a.wait_role(b"master")
        b = servers(metadata=cluster.metadata_url).start()
        b.wait_role(b"slave")
        with pytest.raises(redis.ConnectionError):
            a.redis().execute_command("SESSION", "app", 1, "INCR", "hits")
        assert a.process.wait(30) != 0                  # killed at the failpoint: the INCR is in the log
        assert retried([b], "SESSION", "app", 1, "INCR", "hits") == 1
        assert b.redis().get("hits") == b"1"
        assert retried([b], "SESSION", "app", 2, "INCR", "hits") == 2


def test_a_plain_incr_whose_leader_died_at_its_ack_applies_twice_when_retried(servers, tmp_path):
    """What the docs say of plain redis clients: a retry after a lost answer is at-least-once."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url, env=DIES_AT_ACK).start()
        a.wait_role(b"master")
        b = servers(metadata=cluster.metadata_url).start()
        b.wait_role(b"slave")
        with pytest.raises(redis.ConnectionError):
            a.redis().incr("hits")
        a.process.wait(30)
        assert retried([b], "INCR", "hits") == 2
        assert b.redis().get("hits") == b"2"


def test_a_stream_of_session_incrs_across_leader_kills_applies_each_once(servers, tmp_path):
    """Three servers; a client counts to 150 with SESSION INCR, retrying each seq until some server answers.
    The first leader dies at its first ack; the next one is SIGKILLed from outside mid-stream.
    Every reply is the count the seq made, and the counter ends at 150."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url, env=DIES_AT_ACK).start()
        a.wait_role(b"master")
        others = [servers(metadata=cluster.metadata_url).start() for _ in range(2)]
        for server in others:
            server.wait_role(b"slave")
        everyone = [a, *others]
        replies: list[int] = []
        killed = threading.Event()
        rng = random.Random(7)
        kill_at = rng.randrange(40, 110)

        def killer() -> None:
            wait_until(lambda: len(replies) >= kill_at, 120)
            for server in others:
                if server.process.poll() is None and server.role()[0] == b"master":
                    server.kill()
                    killed.set()
                    return
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        for seq in range(1, 151):
            replies.append(retried(everyone, "SESSION", "counter-app", seq, "INCR", "count"))
        thread.join(30)
        assert killed.is_set(), "the second leader was killed mid-stream"
        assert a.process.poll() is not None
        assert replies == list(range(1, 151))
        assert retried(everyone, "GET", "count") == b"150"
