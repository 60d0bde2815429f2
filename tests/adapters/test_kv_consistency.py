"""`walkit kv serve` processes never answer from a state that may be stale: at start-up, after a pause.

- A server restarted on its data dir answers LOADING, never a wrong value, until it applied
  the log as far as it reached at start-up (issue 13, item 5).
- A leader held by SIGSTOP while another server took over and acknowledged a write does not
  answer reads from the state it had when it stopped once it runs again (issue 13, item 6).
"""

from __future__ import annotations

import os
import random
import signal

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from walkit.local import LocalCluster
from tests.support import pause

from ..integration.helpers import wait_until
from tests.support.serverprocess import KVProcess, redis

pytestmark = pytest.mark.slow

KEYS = 40_000


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
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def impatient(server: KVProcess) -> redis.Redis:
    """impatient is a redis-py client that reports every error at once (no retries)."""
    return server.redis(socket_timeout=30, socket_connect_timeout=5, retry=Retry(NoBackoff(), 0))


def first_answers(server: KVProcess, probes: dict[bytes, bytes], restart: int) -> str:
    """first_answers connects as soon as the server accepts and sends GETs until every probe was answered.

    Every answer must be LOADING or the right value, never another. It returns "loading" if a
    LOADING came before the values, else "ready". (wait_until retries on exceptions, so the
    predicate records wrong answers instead of asserting.)
    """
    outcome = "ready"
    pending = dict(probes)
    wrong: list[str] = []
    client = None

    def attempt() -> bool:
        nonlocal client, outcome
        assert server.process.poll() is None, f"the server exited:\n{server.log_tail()}"
        key, value = next(iter(pending.items()))
        try:
            client = client or impatient(server)
            got = client.get(key)
        except redis.BusyLoadingError:
            outcome = "loading"
            return False
        except redis.ConnectionError:
            client = None                      # not listening yet
            return False
        if got != value:
            wrong.append(f"restart {restart}: GET {key!r} answered {got!r}, the store holds {value!r}")
            return True
        del pending[key]
        return not pending
    wait_until(attempt, 120, interval=0.005, message=lambda: f"restart {restart}:\n{server.log_tail()}")
    assert not wrong, wrong
    return outcome


def test_a_restarted_server_answers_loading_never_a_wrong_value_until_it_replayed_the_log(servers, tmp_path):
    server = servers(data_dir=tmp_path / "data", args=("--snapshot-every", "10000000"))
    server.start().wait_role(b"master")
    r = server.redis()
    values = {b"key:%06d" % i: b"value-%06d-" % i + b"x" * 64 for i in range(KEYS)}
    pipe = r.pipeline(transaction=False)
    for key, value in values.items():                  # one record each: replay takes a moment
        pipe.set(key, value)
    assert all(pipe.execute())
    assert r.set("last", "written last")
    values[b"last"] = b"written last"
    rng = random.Random(13)
    probes = {key: values[key] for key in [b"last", *rng.sample(sorted(values), 5)]}
    outcomes = []
    for restart in range(6):
        if restart % 2:
            server.kill()                      # SIGKILL: its registration lingers, it starts as a follower
        else:
            server.stop()                      # SIGTERM: it resigns
        server.start()
        outcomes.append(first_answers(server, probes, restart))
    server.wait_role(b"master")
    assert server.redis().dbsize() == len(values)
    assert "loading" in outcomes, f"no restart was caught loading: {outcomes}"


def test_a_paused_leader_that_lost_the_lead_never_answers_from_its_old_state(servers, tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        a = servers(metadata=cluster.metadata_url).start()
        a.wait_role(b"master")
        b = servers(metadata=cluster.metadata_url).start()
        b.wait_role(b"slave")
        assert a.redis().set("k", "old") and a.redis().get("k") == b"old"
        wait_until(lambda: b.redis().get("k") == b"old", 30)
        early = redis.Connection(host="127.0.0.1", port=a.port, socket_timeout=60)
        early.connect()                        # its handshake is done while a runs
        pause.stop(a.process.pid, cluster.metadata_url)   # never inside a write to the metadata file
        try:
            b.wait_role(b"master", timeout=60)     # a's registration expired (3 s): b opened the log
            assert b.redis().set("k", "new")
            early.send_command("GET", "k")         # waits in a's socket until a runs again
        finally:
            os.kill(a.process.pid, signal.SIGCONT)
        answers: list = []

        def ask(read) -> None:
            try:
                answers.append(read())
            except redis.ResponseError as exc:     # e.g. TRYAGAIN while it cannot tell: never a value
                answers.append(exc)
        ask(early.read_response)                   # the first command a runs after SIGCONT
        followed = []

        def settled() -> bool:
            client = impatient(a)
            ask(lambda: client.get("k"))
            role = client.execute_command("ROLE")
            if role[0] == b"slave" and role[3] == b"connected":
                followed.append(role)
            return len(followed) >= 3
        wait_until(settled, 60, interval=0.005, message=lambda: f"a follows b:\n{a.log_tail()}")
        early.disconnect()
        values = [answer for answer in answers if not isinstance(answer, Exception)]
        assert values and all(value == b"new" for value in values), \
            f"the resumed ex-leader answered from its old state: {answers}"
        assert followed[-1][1:3] == [b"127.0.0.1", b.port]
