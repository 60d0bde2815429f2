"""A record that cannot apply, in real processes (issue 45, item 1): a clear stop and `walkit sqlite skip` as the way out.

A node whose schema needs a function its process did not register refuses to open, naming it,
while the node that has it goes on reading and writing. A record that no node can apply,
appended through walkit.replicate's submit (the trial the leader runs before appending is what
normally keeps it out), stops the leader and a `walkit sqlite replica` process, each naming its
position and the skip command; `walkit sqlite skip` refuses a record a running node applied,
records the skip of the bad one in the log, and the restarted nodes move past it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import apsw
import pytest

import walkit.adapters.sqlite as sq
from walkit.adapters.sqlite.records import Transaction
from walkit.local import LocalCluster
from walkit.testing.processes import wait_until

pytestmark = pytest.mark.slow


def walkit_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "walkit", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def url(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        yield cluster.metadata_url + "?ttl=1"


def rows(path: str) -> list:
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return db.execute("SELECT x FROM t ORDER BY x").fetchall()
    finally:
        db.close()


def test_a_node_lacking_a_function_the_schema_uses_refuses_to_open_naming_it_while_the_others_serve(url, tmp_path):
    sq.create_function("shard_of", 1, lambda x: x % 4, deterministic=True)    # on the database, in this process
    conn = sq.connect(str(tmp_path / "a.db"), name="shards", metadata=url, node_id="a")
    try:
        conn.execute("CREATE TABLE t(x)")
        conn.execute("CREATE INDEX t_shard ON t(x) WHERE shard_of(x) = 0")
        with conn:
            conn.executemany("INSERT INTO t VALUES (?)", [(4,), (5,)])
        shell = walkit_cli("sqlite", "shell", "shards", "--metadata", url, "-c", "SELECT count(*) FROM t;")
        assert shell.returncode != 0
        assert "MissingFunction" in shell.stderr and "SQL function 'shard_of'" in shell.stderr, \
            shell.stderr
        assert "walkit.adapters.sqlite.create_function('shard_of', ...) before connect" in shell.stderr
        with conn:
            conn.execute("INSERT INTO t VALUES (8)")
        conn.read_barrier()
        assert conn.execute("SELECT x FROM t WHERE shard_of(x) = 0 ORDER BY x").fetchall() == [(4,), (8,)]
    finally:
        conn.close()


def test_a_record_no_node_can_apply_stops_them_and_walkit_sqlite_skip_lets_them_go_on(url, tmp_path):
    path, replica_file = str(tmp_path / "a.db"), str(tmp_path / "replica.db")
    conn = sq.connect(path, name="ledger", metadata=url, node_id="a")
    replica = None

    def start_replica() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "walkit", "sqlite", "replica", "ledger", replica_file,
                                 "--metadata", url, "--node-id", "replica"], stderr=subprocess.PIPE, text=True)
    try:
        conn.execute("CREATE TABLE t(x)")
        with conn:
            conn.execute("INSERT INTO t VALUES (1)")
        replica = start_replica()
        good = wait_until(lambda: caught_up(url, str(conn.position)), 60, "the replica did not catch up")
        refused = walkit_cli("sqlite", "skip", "ledger", good, "--yes", "--metadata", url)
        assert refused.returncode != 0 and "a record that applies is not skipped" in refused.stderr, refused.stderr

        bad = Transaction(commit_ms=1, node="a")
        bad.add_sql("CREATE TABLE t(x)")                      # t exists: no node can apply it
        with pytest.raises(sq.ReplicaStopped):                # the leader stops on its own record, and says so
            conn._database.node.submit(bad.encode(), timeout=30)
        stopped = wait_until(lambda: conn._database.machine.failed, 30, "the leader did not stop")
        position = str(stopped.position)                      # the bad record is alone in its entry
        assert f"walkit sqlite skip ledger {position}" in str(stopped) and "table t already exists" in str(stopped)
        with pytest.raises(sq.ReplicaStopped):
            conn.execute("SELECT x FROM t")
        assert replica.wait(60) != 0
        assert f"stopped at log position {position}" in replica.stderr.read()

        conn.close()                                          # the stopped node's process ends
        skipped = walkit_cli("sqlite", "skip", "ledger", position, "--yes", "--metadata", url)
        assert skipped.returncode == 0, skipped.stderr + skipped.stdout
        assert "sql: CREATE TABLE t(x)" in skipped.stdout and f"recorded the skip of {position}" in skipped.stdout

        conn = sq.connect(path, name="ledger", metadata=url, node_id="a")      # started again: it moves on
        wait_until(lambda: conn.is_leader, 60, "the node did not lead again")
        with conn:
            conn.execute("INSERT INTO t VALUES (2)")
        assert conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
        replica = start_replica()
        wait_until(lambda: rows(replica_file) == [(1,), (2,)], 60, "the replica did not move past the record")
        assert replica.poll() is None
    finally:
        conn.close()
        if replica is not None and replica.poll() is None:
            replica.terminate()
            replica.wait(30)


def caught_up(url: str, position: str) -> str | None:
    """caught_up is `position` once nodes a and replica both publish that they applied it."""
    applied = {node: doc.get("applied") for node, doc in sq_status(url).items()}
    return position if applied.get("a") == applied.get("replica") == position else None


def sq_status(url: str) -> dict:
    """sq_status is what the nodes of database ledger publish, by node id."""
    from walkit.adapters.sqlite.status import gather
    from walkit.cli.common import client_for
    with client_for(url) as client:
        return {node["node_id"]: node for node in gather(client, "ledger").nodes}
