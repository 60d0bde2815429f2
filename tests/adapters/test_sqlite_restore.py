"""Snapshots and point-in-time restores of walkit.adapters.sqlite on in-process bookies (fast tier).

Snapshots are SQLite backups in ledgers and the log is truncated behind them; a new node starts
from the latest snapshot. Restores to a position or a time rebuild exactly the state the leader
had then, also from snapshots when the log before them is gone, and every restored file passes
PRAGMA integrity_check.
"""

from __future__ import annotations

import datetime
import time

import apsw
import pytest

from walkit.replication.snapshots import list_snapshots, read_pointer

import walkit.adapters.sqlite as sq
from walkit.adapters.sqlite.restore import RestoreError

from .sqlitehelpers import Nodes, memory_cluster, unique
from walkit.testing.processes import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sqlite-restore")
    with memory_cluster(directory) as made:
        yield made


@pytest.fixture
def nodes(cluster, tmp_path):
    made = Nodes(cluster, tmp_path)
    yield made
    made.close()


def state(conn) -> list:
    return conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()


def file_state(path: str) -> list:
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return db.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
    finally:
        db.close()


def history(conn, transactions: int) -> list[tuple]:
    """history runs transfers and returns (position, wall-clock ms after commit, state) after each."""
    conn.execute("CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
    with conn:
        conn.executemany("INSERT INTO accounts VALUES (?, 100)", [(i,) for i in range(5)])
    seen = []
    for k in range(transactions):
        with conn:
            conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (k + 1, k % 5))
            conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (k + 1, (k + 2) % 5))
        seen.append((conn.position, int(time.time() * 1000), state(conn)))
        time.sleep(0.003)                          # distinct commit milliseconds for the time restores
    return seen


def test_a_new_node_starts_from_the_latest_snapshot_after_truncation(nodes):
    name = unique("snap")
    leader = nodes.connect(name, "n0", snapshot_every_records=5, roll_entries=4)
    history(leader, 23)
    client = leader._database.client
    pointer = wait_until(lambda: read_pointer(client.store, name)[0], 30, "no snapshot was published")
    wait_until(lambda: client.log_metadata(f"replicated-{name}").truncated_to >= 0, 30, "the log was not truncated")
    late = nodes.connect(name, "late")
    late.read_barrier()
    assert late._database.node.snapshot_position is not None, "the new node did not load the snapshot"
    assert state(late) == state(leader)


def test_restore_to_positions_and_times_equals_the_leaders_state_then(nodes, tmp_path):
    name = unique("pitr")
    leader = nodes.connect(name, "n0", snapshot_every_records=4, retention_s=3600, roll_entries=3)
    seen = history(leader, 17)
    client = leader._database.client
    wait_until(lambda: len(list_snapshots(client, name)) >= 2, 30, "snapshots were not kept for the window")
    for i in (0, 5, 11, len(seen) - 1):
        position, _, expected = seen[i]
        out = str(tmp_path / f"at-{i}.db")
        done = sq.restore(name, out, position=str(position), client=client)
        assert done.position == position and file_state(out) == expected, f"restore to {position}"
    for i in (2, 9):
        _, after_ms, expected = seen[i]
        when = datetime.datetime.fromtimestamp(after_ms / 1000, datetime.timezone.utc).isoformat()
        out = str(tmp_path / f"time-{i}.db")
        done = sq.restore(name, out, time=when, client=client)
        assert file_state(out) == expected and done.position == seen[i][0], f"restore to {when}"
    latest = str(tmp_path / "latest.db")
    sq.restore(name, latest, client=client)
    assert file_state(latest) == state(leader)


def test_restore_refuses_what_it_cannot_rebuild(nodes, tmp_path):
    name = unique("refuse")
    leader = nodes.connect(name, "n0")
    seen = history(leader, 3)
    client = leader._database.client
    last = seen[-1][0]
    with pytest.raises(RestoreError, match="past the end"):
        sq.restore(name, str(tmp_path / "beyond.db"), position=f"{last.ledger_id}:{last.entry_id + 50}", client=client)
    with pytest.raises(RestoreError, match="no replicated SQLite database"):
        sq.restore(unique("missing"), str(tmp_path / "missing.db"), client=client)
    existing = tmp_path / "exists.db"
    existing.write_bytes(b"")
    with pytest.raises(RestoreError, match="exists"):
        sq.restore(name, str(existing), client=client)
    assert not (tmp_path / "beyond.db").exists()
