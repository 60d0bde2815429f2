"""The SQLite replicator in real processes: a bank whose leader is SIGKILLed mid-run (issue 14's must-show).

Two bank processes (tests/adapters/sqlite_bank_node.py) are nodes of database "bank"; four
threads in each transfer money between accounts through connect() while their node leads.
`walkit sqlite replica` keeps a third file. Mid-run the leader's state is dumped with its log
position; then the leader process is SIGKILLed. The other node is promoted and goes on. Then:
every transfer whose COMMIT returned is in the promoted node's database, the balances still sum
to what they started with and match the transfers, the replica file read with the sqlite3
command line equals the leader's, `walkit sqlite restore --position` rebuilds exactly the
mid-run state, and `status` and `shell` report the new leader.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import walkit
from walkit.local import LocalCluster
from tests.support import pause

from walkit.testing.processes import wait_until

pytestmark = pytest.mark.slow

NODE = os.path.join(os.path.dirname(__file__), "sqlite_bank_node.py")
ACCOUNTS, BALANCE = 10, 1000


class Bank:
    """Bank is one bank process and its command pipe."""

    def __init__(self, url: str, node_id: str, directory) -> None:
        self.node_id = node_id
        self.acked_file = str(directory / f"{node_id}.acked")
        self.process = subprocess.Popen([sys.executable, NODE, url, "bank", node_id, str(directory / f"{node_id}.db"),
                                         self.acked_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = json.loads(self.process.stdout.readline())

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"{self.node_id} exited ({self.process.poll()})"
        return json.loads(line)

    def acked(self) -> list[str]:
        if not os.path.exists(self.acked_file):
            return []
        with open(self.acked_file) as f:
            return [line.strip() for line in f if line.strip()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def open_bank(banks: list[Bank], transfers: int) -> tuple[Bank, Bank]:
    """open_bank opens the accounts through the elected leader, starts four transfer threads in
    each bank process and waits until the leader committed `transfers`; it returns (leader, other)."""
    leader = wait_until(lambda: next((b for b in banks if b.ask("state")["is_leader"]), None), 60, "no leader")
    assert leader.ask(f"init {ACCOUNTS} {BALANCE}")["initialized"]
    for bank in banks:
        bank.ask("load 4")
    wait_until(lambda: len(leader.acked()) >= transfers, 120, "the transfers did not get going")
    return leader, next(b for b in banks if b is not leader)


def walkit_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "walkit", *args], capture_output=True, text=True, timeout=timeout)


def sqlite3_cli(path: str, sql: str) -> list[dict]:
    done = subprocess.run(["sqlite3", "-readonly", "-json", path, sql], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout or "[]")


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 command line (Debian: sqlite3)")
def test_bank_survives_its_leaders_sigkill(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        url = cluster.metadata_url + "?ttl=1"
        banks = [Bank(url, f"bank{i}", tmp_path) for i in range(2)]
        replica_file = str(tmp_path / "replica.db")
        replica = subprocess.Popen([sys.executable, "-m", "walkit", "sqlite", "replica", "bank", replica_file,
                                    "--metadata", url, "--node-id", "replica"], stderr=subprocess.PIPE, text=True)
        try:
            leader, other = open_bank(banks, 150)
            middle = leader.ask("dump")                                   # the state at a position, mid-run
            # (the leader's file commits whole entries: a group commits once the entry of its last record
            # was applied, and the next group's records come in later entries; so "L:E" restores it)
            wait_until(lambda: len(leader.acked()) >= 300, 120, "the transfers stalled")
            leader.process.send_signal(signal.SIGKILL)
            leader.process.wait(10)
            killed_acked = len(leader.acked())
            wait_until(lambda: other.ask("state")["is_leader"], 60, "the follower was not promoted")
            wait_until(lambda: len(other.acked()) >= 100, 120, "the promoted node did not take transfers")
            stopped = other.ask("stop")
            final = other.ask("dump")

            acked = set(leader.acked()) | set(other.acked())
            held = set(final["transfers"])
            assert acked <= held, f"committed transfers lost: {sorted(acked - held)[:5]}"
            assert sum(balance for _, balance in final["balances"]) == ACCOUNTS * BALANCE
            print(f"\n{killed_acked} transfers acknowledged by the killed leader, {len(other.acked())} by the "
                  f"promoted one ({stopped['failed']} failed, {stopped['refused']} refused); {len(held)} in the database")

            rows = lambda path: sqlite3_cli(path, "SELECT ledger, entry FROM _walkit_position")  # noqa: E731
            wait_until(lambda: [f"{r['ledger']}:{r['entry']}" for r in rows(replica_file)] == [final["position"]], 60,
                     "the replica did not catch up")
            assert [[r["id"], r["balance"]] for r in sqlite3_cli(replica_file, "SELECT id, balance FROM accounts "
                                                                               "ORDER BY id")] == final["balances"]
            assert [r["id"] for r in sqlite3_cli(replica_file, "SELECT id FROM transfers ORDER BY id")] \
                == final["transfers"]

            restored = str(tmp_path / "middle.db")
            done = walkit_cli("sqlite", "restore", "bank", restored, "--position", middle["position"], "--metadata", url)
            assert done.returncode == 0, done.stderr
            assert sqlite3_cli(restored, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]
            assert [[r["id"], r["balance"]] for r in sqlite3_cli(restored, "SELECT id, balance FROM accounts "
                                                                           "ORDER BY id")] == middle["balances"]
            assert [r["id"] for r in sqlite3_cli(restored, "SELECT id FROM transfers ORDER BY id")] == middle["transfers"]

            status = walkit_cli("sqlite", "status", "bank", "--metadata", url)
            assert status.returncode == 0, status.stderr
            assert f"leader    {other.node_id}" in status.stdout and "replica" in status.stdout, status.stdout
            shell = walkit_cli("sqlite", "shell", "bank", "--metadata", url, "-c", "SELECT count(*) AS n FROM transfers;")
            assert shell.returncode == 0, shell.stderr + shell.stdout
            assert str(len(held)) in shell.stdout and "(1 row)" in shell.stdout, shell.stdout
            other.process.stdin.write("quit\n")
            other.process.stdin.flush()
            assert other.process.wait(30) == 0
        finally:
            replica.send_signal(signal.SIGTERM)
            try:
                replica.wait(30)
            except subprocess.TimeoutExpired:
                replica.kill()
                replica.wait(10)
            for bank in banks:
                bank.stop()


def test_a_held_bookie_and_a_killed_leader_lose_no_committed_transfer(tmp_path):
    """A bookie of the log's current ensemble is held with SIGSTOP while eight threads transfer:
    its acks stop until the leader's writer replaces it (after the add timeout). The leader is
    then SIGKILLed, and the bookie stays held until the promoted node took transfers of its own.
    Every transfer whose COMMIT returned is in the promoted node's database; no money appeared
    or vanished."""
    with LocalCluster(bookies=4, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        url = cluster.metadata_url + "?ttl=1"
        banks = [Bank(url, f"bank{i}", tmp_path) for i in range(2)]
        held = None
        try:
            leader, other = open_bank(banks, 100)

            with walkit.Client(cluster.metadata_url) as client:
                ledger = client.ledger_metadata(client.log_metadata("replicated-bank").ledger_ids[-1])
            held = cluster.pid(cluster.addresses.index(ledger.ensembles[max(ledger.ensembles)][0]))
            pause.stop(held, cluster.metadata_url)                    # never inside a write to the metadata file
            at_pause, paused = len(leader.acked()), time.monotonic()
            # The first entry for the held bookie waits the add timeout; then its writer replaces it.
            wait_until(lambda: len(leader.acked()) >= at_pause + 100, 120,
                     "no transfers were committed after the bookie was held")
            print(f"\n{len(leader.acked()) - at_pause} transfers committed while the bookie was held, "
                  f"{time.monotonic() - paused:.1f} s after it was")
            leader.process.send_signal(signal.SIGKILL)
            leader.process.wait(10)
            wait_until(lambda: other.ask("state")["is_leader"], 60, "the follower was not promoted")
            wait_until(lambda: len(other.acked()) >= 100, 120, "the promoted node did not take transfers")
            os.kill(held, signal.SIGCONT)                                 # only now
            held = None
            other.ask("stop")
            final = other.ask("dump")
            acked, held_by_it = set(leader.acked()) | set(other.acked()), set(final["transfers"])
            assert acked <= held_by_it, f"committed transfers lost: {sorted(acked - held_by_it)[:5]}"
            assert sum(balance for _, balance in final["balances"]) == ACCOUNTS * BALANCE
        finally:
            if held is not None:
                os.kill(held, signal.SIGCONT)
            for bank in banks:
                bank.stop()
