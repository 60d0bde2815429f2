"""Resources of walkit.adapters.sqlite connections, as sqlite3 manages them (fast tier, issue 45 item 5).

A connection dropped without close() is closed when it is collected, and its node with the
last connection of its file; `timeout` bounds connect's wait for another program's lock on
the file, as it bounds a statement's.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import walkit.adapters.sqlite as sq
from walkit.adapters.sqlite import database as databases

from .sqlitehelpers import memory_cluster, unique


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sqlite-resources")
    with memory_cluster(directory) as made:
        yield made


def test_a_connection_dropped_without_close_closes_its_node(cluster, tmp_path):
    path = str(tmp_path / "dropped.db")
    conn = sq.connect(path, name=unique("dropped"), client=cluster.client(own_store=True))
    conn.execute("CREATE TABLE t(x)")
    database = conn._database
    assert database in databases._registry.values()
    del conn                                           # no close(): refcounting alone collects it
    assert database not in databases._registry.values()
    assert database.node._stopped.is_set(), "the node of the dropped connection still runs"
    assert not database._publisher.is_alive()


def test_a_dropped_connection_in_a_transaction_lets_the_write_lock_go(cluster, tmp_path):
    path = str(tmp_path / "locked.db")
    name = unique("locked")
    keeper = sq.connect(path, name=name, client=cluster.client(own_store=True))
    keeper.execute("CREATE TABLE t(x)")
    dropped = sq.connect(path, name=name)
    dropped.execute("INSERT INTO t VALUES (1)")        # an open write transaction holds the file's write lock
    del dropped
    keeper.execute("INSERT INTO t VALUES (2)")         # the lock was let go: this write does not wait
    keeper.commit()
    assert keeper.execute("SELECT x FROM t").fetchall() == [(2,)]
    keeper.close()


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.processes      # SQLite's POSIX locks do not exclude a process from itself: another process holds it
def test_connect_with_timeout_zero_to_a_locked_file_fails_at_once(cluster, tmp_path):
    path = str(tmp_path / "busy.db")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(sq.OperationalError, match="database is locked"):
            sq.connect(path, timeout=0, name=unique("busy"), client=cluster.client(own_store=True))
        assert time.monotonic() - started < 2.0
        started = time.monotonic()
        with pytest.raises(sq.OperationalError, match="database is locked"):
            sq.connect(path, timeout=0.5, name=unique("busy"), client=cluster.client(own_store=True))
        assert 0.4 < time.monotonic() - started < 3.0
    finally:
        holder.kill()
        holder.wait(10)
    assert not any(d.path == path for d in databases._registry.values())
