"""Writes from any node and adopted files of walkit.adapters.sqlite, with each node a real process (issue 45's tests).

Nodes are tests/adapters/sqlite_sql_node.py processes on a LocalCluster whose metadata store is
on this machine, so every node serves forwarded writes on 127.0.0.1 by default. A follower
process writes and reads its own write at once (no read barrier); a leader SIGKILLed under
forwarded writes loses none that was acknowledged and applies none twice; an adopted file keeps
its rows, and a node started on an empty file gets them and writes through the adopting leader;
a secured cluster takes no forwarded writes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys

import pytest

import walkit
from walkit.local import LocalCluster
from walkit.testing.processes import wait_until

pytestmark = pytest.mark.slow

NODE = __file__.replace("test_sqlite_any_node_processes.py", "sqlite_sql_node.py")


class Node:
    """Node is one sqlite_sql_node.py process and its request pipe."""

    def __init__(self, url: str, name: str, node_id: str, path: str, key: str | None = None, **options) -> None:
        self.node_id = node_id
        env = {**os.environ, "WALKIT_KEY": key} if key else None          # a secured cluster's client key
        self.process = subprocess.Popen([sys.executable, NODE, url, name, node_id, path, json.dumps(options)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self.process.stdout.readline()
        assert hello, f"{node_id} exited ({self.process.wait(10)})"

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"{self.node_id} exited ({self.process.poll()})"
        return json.loads(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def roles(nodes: list[Node]) -> tuple[Node, Node]:
    leader = wait_until(lambda: next((n for n in nodes if n.ask(op="state")["is_leader"]), None), 60, "no leader")
    return leader, next(n for n in nodes if n is not leader)


def test_a_follower_process_writes_and_reads_its_own_write(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        nodes = [Node(cluster.metadata_url, "notes", f"node{i}", str(tmp_path / f"node{i}.db")) for i in range(2)]
        try:
            leader, follower = roles(nodes)
            made = leader.ask(op="transaction", statements=[["CREATE TABLE notes(id TEXT PRIMARY KEY, body)", []]])
            assert "error" not in made, made
            follower.ask(op="read", sql="SELECT 1", barrier=True)          # the follower knows the table
            wrote = follower.ask(op="transaction", statements=[
                ["INSERT INTO notes VALUES (?, ?)", ["n1", "from the follower"]],
                ["SELECT body FROM notes WHERE id = 'n1'", []],            # its own write, before COMMIT
            ], then="SELECT id, body FROM notes")                          # right after COMMIT, no barrier
            assert "error" not in wrote, wrote
            assert wrote["is_leader"] is False
            assert wrote["results"][1] == [["from the follower"]]
            assert wrote["then"] == [["n1", "from the follower"]]
            assert leader.ask(op="read", sql="SELECT id FROM notes", barrier=True)["rows"] == [["n1"]]

            refused = follower.ask(op="transaction", statements=[["INSERT INTO notes VALUES ('n1', 'again')", []]])
            assert refused["error"] == "IntegrityError", refused                # the leader's error, its class

            sql = "INSERT INTO notes(id) VALUES (?)"
            local = leader.ask(op="time", sql=sql, count=100)["latencies_ms"]
            forwarded = follower.ask(op="time", sql=sql, count=100)["latencies_ms"]
            print(f"\nCOMMIT of a one-row transaction, median of 100: {statistics.median(local):.2f} ms on the "
                  f"leader, {statistics.median(forwarded):.2f} ms forwarded from a follower (p90 "
                  f"{statistics.quantiles(local, n=10)[-1]:.2f} / {statistics.quantiles(forwarded, n=10)[-1]:.2f} ms)")
            assert follower.ask(op="read", sql="SELECT count(*) FROM notes")["rows"] == [[201]]
        finally:
            for node in nodes:
                node.stop()


def test_a_leader_killed_under_forwarded_writes_loses_none_and_doubles_none(tmp_path):
    """A follower forwards one-row transactions while the leader process is SIGKILLed. Every write
    whose COMMIT returned is in the database once; one that failed with another error is not in it;
    one whose COMMIT raised CommitFailed is in it at most once. The table has no key, so a write
    applied twice would show as two rows."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        url = cluster.metadata_url + "?ttl=1"
        nodes = [Node(url, "stream", f"node{i}", str(tmp_path / f"node{i}.db")) for i in range(2)]
        try:
            leader, follower = roles(nodes)
            assert "error" not in leader.ask(op="transaction", statements=[["CREATE TABLE w(id TEXT)", []]])
            follower.ask(op="read", sql="SELECT 1", barrier=True)
            follower.process.stdin.write(json.dumps({"op": "stream", "sql": "INSERT INTO w VALUES (?)",
                                                     "count": 600}) + "\n")
            follower.process.stdin.flush()
            wait_until(lambda: leader.ask(op="read", sql="SELECT count(*) FROM w")["rows"][0][0] >= 100, 60,
                       "the forwarded writes did not get going")
            leader.process.kill()
            leader.process.wait(10)
            streamed = json.loads(follower.process.stdout.readline())
            outcomes = dict(streamed["outcomes"])
            rows = follower.ask(op="read", sql="SELECT id, count(*) FROM w GROUP BY id", barrier=True)["rows"]
            held = dict(rows)
            assert all(count == 1 for count in held.values()), [r for r in rows if r[1] > 1]
            acked = {ident for ident, outcome in outcomes.items() if outcome == "ok"}
            unknown = {ident for ident, outcome in outcomes.items() if outcome == "unknown"}
            failed = {ident for ident, outcome in outcomes.items() if outcome not in ("ok", "unknown")}
            assert acked <= set(held), f"acknowledged writes lost: {sorted(acked - set(held))[:5]}"
            assert not failed & set(held), f"writes that failed are in the database: {sorted(failed & set(held))[:5]}"
            assert set(held) <= acked | unknown
            assert streamed["is_leader"] and len(acked) > 300       # the follower was promoted and wrote on
            print(f"\n{len(acked)} acknowledged, {len(unknown)} unknown ({len(unknown & set(held))} of them in the "
                  f"database), {len(failed)} failed: {sorted({o for o in outcomes.values()} - {'ok', 'unknown'})}")
        finally:
            for node in nodes:
                node.stop()


def test_an_adopted_file_keeps_its_rows_and_replicates(tmp_path):
    plain = str(tmp_path / "shop.db")
    with sqlite3.connect(plain) as made:
        made.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL)")
        made.executemany("INSERT INTO items VALUES (?, ?, ?)", [(i, f"item {i}", i * 1.5) for i in range(1000)])
    made.close()
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        adopter = Node(cluster.metadata_url, "shop", "adopter", plain, adopt=True)
        nodes = [adopter]
        try:
            count = "SELECT count(*), sum(price) FROM items"
            assert adopter.ask(op="read", sql=count)["rows"] == [[1000, 749250.0]]
            nodes.append(Node(cluster.metadata_url, "shop", "newcomer", str(tmp_path / "newcomer.db")))
            newcomer = nodes[1]
            assert newcomer.ask(op="read", sql=count, barrier=True)["rows"] == [[1000, 749250.0]]
            leader, follower = roles(nodes)
            assert leader is adopter                                        # it led first; it still does
            wrote = follower.ask(op="transaction", statements=[["INSERT INTO items VALUES (1000, 'new', 1.0)", []]],
                                 then="SELECT name FROM items WHERE id = 1000")
            assert wrote["then"] == [["new"]], wrote
            assert adopter.ask(op="read", sql=count, barrier=True)["rows"] == [[1001, 749251.0]]
        finally:
            for node in nodes:
                node.stop()


def test_a_secured_cluster_takes_no_forwarded_writes(tmp_path):
    """On a cluster with CurveZMQ keys the forwarding channel would bypass the log's ACLs: no node
    publishes a forwarding address, and a follower's write raises NotLeader saying why."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory", security=True) as cluster:
        nodes = [Node(cluster.metadata_url, "vault", f"node{i}", str(tmp_path / f"node{i}.db"), key=cluster.client_key)
                 for i in range(2)]
        try:
            leader, follower = roles(nodes)
            assert "error" not in leader.ask(op="transaction", statements=[["CREATE TABLE v(x)", []]])
            follower.ask(op="read", sql="SELECT 1", barrier=True)
            refused = follower.ask(op="transaction", statements=[["INSERT INTO v VALUES (1)", []]])
            assert refused["error"] == "NotLeader" and "secured cluster" in refused["message"], refused
            assert leader.ask(op="read", sql="SELECT count(*) FROM v", barrier=True)["rows"] == [[0]]
            with walkit.Client(cluster.metadata_url, key=cluster.client_key) as client:
                assert client.store.children("sqlite/vault") == ["nodes"]      # no forward/ addresses
        finally:
            for node in nodes:
                node.stop()
