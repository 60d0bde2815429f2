"""Adopting an existing SQLite file, and ":memory:" databases, in walkit.adapters.sqlite (fast tier, issue 45 item 3).

An adopted file keeps its rows, its schema and its position in the log's first record, and
every other node (and a restore) gets the same content; an adoption never overwrites a
replicated database that exists. ":memory:" is a private replicated database of one
connection, gone when it closes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3

import pytest

import walkit.adapters.sqlite as sq
from walkit.adapters.sqlite import adoption
from walkit.errors import NoSuchLog

from .sqlitehelpers import cluster, log_records, nodes, unique  # noqa: F401 - cluster and nodes are fixtures
from walkit.testing.processes import wait_until

SCHEMA = ("SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE '\\_walkit%' ESCAPE '\\' "
          "ORDER BY name")


def plain_file(path, page_size: int = 4096) -> None:
    """plain_file writes an ordinary SQLite database, as a program using sqlite3 would have."""
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.executescript("""
        CREATE TABLE accounts(id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance INTEGER CHECK (balance >= 0));
        CREATE INDEX accounts_owner ON accounts(owner);
        CREATE TABLE log(what);
        CREATE TRIGGER accounts_log AFTER UPDATE ON accounts BEGIN INSERT INTO log VALUES (new.id); END;
        CREATE VIEW rich AS SELECT id FROM accounts WHERE balance > 100;
        PRAGMA user_version = 3;
    """)
    conn.executemany("INSERT INTO accounts VALUES (?, ?, ?)", [(i, f"owner {i}", i * 50) for i in range(200)])
    conn.commit()
    conn.close()


def content(conn) -> list:
    return [conn.execute(SCHEMA).fetchall(), conn.execute("SELECT * FROM accounts ORDER BY id").fetchall(),
            conn.execute("PRAGMA user_version").fetchall()]


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_an_adopted_file_keeps_its_rows_and_replicates(nodes, tmp_path):
    name = unique("adopt")
    plain = str(tmp_path / f"{name}-n0.db")
    plain_file(plain)
    expected = content(sqlite3.connect(plain))
    first = nodes.connect(name, "n0", adopt=True)
    assert content(first) == expected
    assert first.position is not None and len(log_records(first)) == 1   # the adoption is the first record
    second = nodes.connect(name, "n1")                                      # a new, empty file
    second.read_barrier()
    assert content(second) == expected
    leader, follower = (first, second) if first.is_leader else (second, first)
    with leader:
        leader.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 7")
    follower.read_barrier()
    assert follower.execute("SELECT balance FROM accounts WHERE id = 7").fetchone() == (351,)
    assert follower.execute("SELECT what FROM log").fetchall() == [(7,)]    # the trigger fired on the leader
    assert follower.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    restored = str(tmp_path / "restored.db")
    sq.restore(name, restored, client=nodes.cluster.client())                # a replay from the log's start
    assert content(sqlite3.connect(restored)) == content(leader)


def test_a_file_with_another_page_size_is_adopted_by_every_node(nodes, tmp_path):
    name = unique("adopt")
    plain = str(tmp_path / f"{name}-n0.db")
    plain_file(plain, page_size=1024)
    expected = content(sqlite3.connect(plain))
    first = nodes.connect(name, "n0", adopt=True)
    second = nodes.connect(name, "n1")
    second.read_barrier()
    assert content(first) == expected and content(second) == expected


def test_adopting_refuses_a_database_that_exists_and_leaves_the_file_as_it_was(nodes, tmp_path):
    name = unique("adopt")
    existing = nodes.connect(name, "n0")
    existing.execute("CREATE TABLE acknowledged(x)")
    plain = str(tmp_path / f"{name}-n1.db")
    plain_file(plain)
    before = digest(plain)
    with pytest.raises(sq.OperationalError, match="is not adopted") as caught:
        nodes.connect(name, "n1", adopt=True)
    assert isinstance(caught.value, adoption.AdoptionRefused)
    assert digest(plain) == before
    existing.read_barrier()
    assert existing.execute("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE '\\_walkit%' "
                            "ESCAPE '\\'").fetchall() == [("acknowledged",)]


def test_a_plain_file_is_refused_without_adopt_and_the_error_says_how(nodes, tmp_path):
    name = unique("adopt")
    plain_file(str(tmp_path / f"{name}-n0.db"))
    with pytest.raises(sq.OperationalError, match=r"adopt=True"):
        nodes.connect(name, "n0")


def test_an_interrupted_adoption_goes_on_when_the_file_connects_again(nodes, cluster, tmp_path):
    name = unique("adopt")
    plain = str(tmp_path / f"{name}-n0.db")
    plain_file(plain)
    expected = content(sqlite3.connect(plain))
    adoption.adopt(cluster.client(own_store=True), plain, name, "n0")      # the record is in the log, no node ran
    conn = nodes.connect(name, "n0", adopt=True)
    assert content(conn) == expected
    assert len(log_records(conn)) == 1                                      # adopted once


def test_a_named_memory_database_is_refused_and_the_database_of_that_name_keeps_its_log(cluster, tmp_path):
    orders = sq.connect(str(tmp_path / "orders.db"), client=cluster.client(own_store=True))
    with orders:
        orders.execute("CREATE TABLE t(x)")
    with pytest.raises(ValueError, match="private to its connection"):
        sq.connect(":memory:", name="orders", client=cluster.client(own_store=True))
    with pytest.raises(ValueError, match="private to its connection"):
        sq.connect("file::memory:", uri=True, name="orders", client=cluster.client(own_store=True))
    orders.close()
    assert cluster.client(own_store=True).log_metadata("replicated-orders").segments


def test_memory_is_a_private_database_deleted_at_close(cluster):
    client = cluster.client(own_store=True)
    first = sq.connect(":memory:", client=client)
    second = sq.connect(":memory:", client=cluster.client(own_store=True))
    first.execute("CREATE TABLE t(x)")
    with first:
        first.execute("INSERT INTO t VALUES (1)")
    assert first.execute("SELECT x FROM t").fetchall() == [(1,)]
    with pytest.raises(sq.OperationalError, match="no such table"):
        second.execute("SELECT x FROM t")                                  # each :memory: is its own database
    database = first._database
    assert database.name.startswith("memory-") and database.name != second._database.name
    first.close()
    second.close()
    assert not os.path.exists(os.path.dirname(database.path))
    with pytest.raises(NoSuchLog):
        client.log_metadata(f"replicated-{database.name}")


def test_the_adopted_image_is_deleted_once_the_log_no_longer_holds_its_record(nodes, tmp_path, monkeypatch):
    from walkit.adapters.sqlite import database
    from walkit.errors import NoSuchKey, NoSuchLedger
    monkeypatch.setattr(database, "IMAGE_CHECK_S", 0.1)
    name = unique("adopt")
    plain = str(tmp_path / f"{name}-n0.db")
    plain_file(plain)
    expected = content(sqlite3.connect(plain))
    conn = nodes.connect(name, "n0", adopt=True, snapshot_every_records=3, roll_entries=3)
    store = conn._database.client.store
    image = json.loads(store.get(adoption.image_key(name))[0])["ledger"]
    conn._database.client.ledger_metadata(image)                           # kept while the log holds the record
    for i in range(12):                                                    # snapshots truncate the first ledgers
        with conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = ?", (i,))

    def collected() -> bool:
        try:
            store.get(adoption.image_key(name))
            return False
        except NoSuchKey:
            return True
    wait_until(collected, 30, "the adopted image was not collected")
    with pytest.raises(NoSuchLedger):
        conn._database.client.ledger_metadata(image)
    newcomer = nodes.connect(name, "n1")                                   # starts from a snapshot
    newcomer.read_barrier()
    assert content(newcomer) == content(conn) and content(conn)[0] == expected[0]
