"""A replicated counter in three processes; its leader is SIGKILLed under load (issue 13's must-show).

Four threads submit increments with unique ids to whichever node leads. The leader process is
killed mid-run; another node leads within seconds; then every increment that was acknowledged
is counted exactly once on every surviving node, and what each node applied, the killed leader
included, is a prefix of the one history of the log: no node applied a record that did not
become part of the log (a leader applies only what the log acknowledged).
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from walkit.local import LocalCluster, stop_process
from walkit.testing.processes import wait_until
from tests.support import counter_node

pytestmark = pytest.mark.slow



class Node:
    """Node is one counter process and its HTTP address."""

    def __init__(self, url: str, node_id: str, applied_file: str) -> None:
        self.node_id = node_id
        self.applied_file = applied_file
        self.process = subprocess.Popen([sys.executable, counter_node.__file__, url, node_id, applied_file],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.startswith("listening "), line
        self.base = f"http://127.0.0.1:{int(line.split()[1])}"

    def call(self, path: str, body: bytes | None = None, timeout: float = 15) -> tuple[int, dict]:
        request = urllib.request.Request(self.base + path, data=body, method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def state(self) -> dict:
        return self.call("/state")[1]

    def applied(self) -> list[tuple[str, str]]:
        with open(self.applied_file) as f:
            return [tuple(line.split()) for line in f if line.strip() and line.strip() != "restored"]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        stop_process(self.process, 10)


def test_leader_killed_under_load_loses_no_acknowledged_increment(tmp_path):
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        url = cluster.metadata_url + "?ttl=1"              # a dead leader's session expires after 1 s
        nodes = [Node(url, f"node{i}", str(tmp_path / f"applied-{i}.txt")) for i in range(3)]
        try:
            live = list(nodes)

            def leader() -> Node | None:
                for node in live:
                    try:
                        if node.state()["is_leader"]:
                            return node
                    except (OSError, http.client.HTTPException):    # killed mid-answer
                        continue
                return None

            first = wait_until(leader, 30, "no leader was elected")
            acked: list[str] = []
            refused: list[str] = []            # NotLeader: never appended
            lock = threading.Lock()
            stop = threading.Event()
            killed_at: list[float] = []
            resumed_at: list[float] = []

            def load(k: int) -> None:
                i = 0
                while not stop.is_set():
                    target = leader()
                    if target is None:
                        continue
                    ident = f"t{k}-{i}"
                    i += 1
                    try:
                        status, doc = target.call("/submit", f"{ident}:1".encode())
                    except (OSError, http.client.HTTPException):
                        continue                  # the leader died mid-call: outcome unknown
                    with lock:
                        if status == 200:
                            acked.append(ident)
                            if killed_at and not resumed_at and target is not first:
                                resumed_at.append(time.monotonic())
                        elif status == 409:
                            refused.append(ident)

            threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(4)]
            for thread in threads:
                thread.start()
            wait_until(lambda: len(acked) >= 200, 60, "the load did not get going")
            killed_at.append(time.monotonic())
            first.kill()
            live.remove(first)
            wait_until(lambda: resumed_at, 30, "no other node took over")
            wait_until(lambda: len(acked) >= 400, 60, "the load did not resume")
            stop.set()
            for thread in threads:
                thread.join(30)
            failover = resumed_at[0] - killed_at[0]

            states = [node.call("/barrier", b"")[1] for node in live]
            histories = [node.applied() for node in nodes]
            survivors = histories[1:] if nodes[0] is first else [h for n, h in zip(nodes, histories) if n is not first]
            assert survivors[0] == survivors[1], "the surviving nodes applied different histories"
            history = survivors[0]
            ids = [ident for _, ident in history]
            assert len(ids) == len(set(ids)), "a record was applied twice"
            assert set(acked) <= set(ids), f"acknowledged increments lost: {sorted(set(acked) - set(ids))[:5]}"
            assert not set(refused) & set(ids), "a refused submission was applied"
            assert all(s["value"] == len(ids) for s in states), [s["value"] for s in states]
            for node, applied in zip(nodes, histories):
                assert applied == history[:len(applied)], f"{node.node_id} applied records off the log's history"
            print(f"\nfailover {failover:.2f} s; {len(acked)} acknowledged, {len(ids)} applied")
            assert failover < 15
        finally:
            for node in nodes:
                node.stop()
