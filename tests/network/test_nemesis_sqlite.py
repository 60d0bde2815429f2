"""The SQLite replicator under a nemesis across hosts: a bank loses no commit and conserves its money.

Eight hosts: ZooKeeper, four bookies (listening on 0.0.0.0 with --advertise) and three nodes of
database "bank", each a process on its own host (tests/network/sqlite_bank_client.py) that is a
walkit.adapters.sqlite node and the bank's application at once: two threads transfer money
between five accounts, one reads every balance and every transfer id in one transaction after a
read barrier, and each operation goes to a history. A seeded schedule (walkit.testing.nemesis)
partitions halves, isolates the leader, cuts it from ZooKeeper only, one bookie from it, its
packets to ZooKeeper one way, and kills and pauses the leader's process. Afterwards the network
is healed, transfers start again, the workload stops and every node makes one final read; the
leader's is the `final` of walkit.testing.history.check_bank: no acknowledged transfer lost,
balances summing to the total and equal to the initial ones plus the transfers listed, reads
current as of their invocation, no transfer un-committed, none failed or never invoked listed.

The nemesis's "servers" are the node processes. Its "clients" fault (leader-from-clients) cuts
the leader from the hosts of the other nodes (`NodeNemesis`): an SQLite node's clients are
threads of its own process, with no network between them, and the nodes reach each other only
through ZooKeeper and the bookies, so the fault must change nothing. They are not passed as the
Nemesis's `clients` list, which `halves` adds to the hosts it splits: the node hosts would count
twice there, and the leader's "minority" would hold half the distinct hosts or more.

The leader is whom the election names, as `walkit sqlite status` shows it, asked on ZooKeeper's
host, which reaches ZooKeeper under every fault, of one process kept running there (`LeaderAsker`).

The broken-rule test runs the nodes with --trust-role: a read skips the barrier and counts when
the node said it led before and after it. The nemesis isolates the leader's host past its
session: another node is elected and takes transfers while the isolated one still believes it
leads and reads its own copy; the checker must find those stale reads (a lost commit).

Replay a seed: pytest tests/network/test_nemesis_sqlite.py --nemesis-seed S; run longer:
--nemesis-seeds N --nemesis-seconds T.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import sys
import time

from walkit.testing.history import check_bank
from walkit.testing.multihost import Deployment
from walkit.testing.nemesis import Nemesis, Schedule, unavailability
from walkit.testing.network import Network

from .sqlite_bank_client import ACCOUNTS, BALANCE, read_history

import pytest

pytestmark = pytest.mark.network

HERE = os.path.dirname(__file__)
NAME = "bank"
TOTAL = ACCOUNTS * BALANCE


@dataclasses.dataclass
class NodeNemesis(Nemesis):
    """NodeNemesis is a Nemesis whose leader-from-clients fault cuts the leader from the other nodes' hosts.

    In SQLite the clients are threads of the node (see the module doc); everything else is Nemesis's.
    """

    def _apply(self, fault, target, applied):
        if fault.kind == "leader-from-clients":
            others = [server.host for server in self.servers if server is not target]
            return Nemesis._apply(dataclasses.replace(self, clients=others), fault, target, applied)
        return super()._apply(fault, target, applied)


def bank_cluster(net: Network, d: Deployment, seed: int, flags: list[str]):
    """bank_cluster starts ZooKeeper, 4 bookies and 3 bank nodes; returns (meta, bookies, nodes)."""
    meta = net.add_host("meta")
    d.zookeeper(meta)
    bookies = d.bookies([net.add_host(f"b{i}") for i in range(4)], listen="0.0.0.0:3181")
    nodes = []
    for i in range(3):
        host = net.add_host(f"n{i}")
        nodes.append(d.service(host, "bank", [sys.executable, os.path.join(HERE, "sqlite_bank_client.py"),
                                              d.metadata_url, NAME, host.name,
                                              os.path.join(d.workdir, f"{host.name}.db"), d.workdir, str(seed), *flags]))
    for node in nodes:
        node.wait_log(r"bank ready", timeout=120)
    return meta, bookies, nodes


#: A program run on ZooKeeper's host: for each line it reads, it prints the candidate leading database
#: NAME's election as `walkit sqlite status NAME` names it (walkit.adapters.sqlite.status), or an empty line.
_ASK_LEADER = """
import sys
from walkit.client.api import Client
from walkit.election import LeaderElection
with Client(sys.argv[1]) as client:
    election = LeaderElection(client.store, f"replication/{sys.argv[2]}", "walkit-sqlite-status")
    for _ in sys.stdin:
        try:
            print(election.leader() or "", flush=True)
        except Exception as exc:  # noqa: BLE001 - no answer is "nobody leads" for the nemesis
            print(f"leader? {exc!r}", file=sys.stderr, flush=True)
            print("", flush=True)
"""


class LeaderAsker:
    """LeaderAsker asks ZooKeeper's host which node the election names (None if none leads), through one
    process kept running there: a `walkit sqlite status` per fault took 0.45 CPU s and 1.5-3.7 s, which
    stretched the nemesis's schedule by seconds a fault."""

    def __init__(self, d: Deployment, meta) -> None:
        self.log = open(os.path.join(d.workdir, f"{meta.name}-leader.log"), "w")
        self.process = meta.popen([sys.executable, "-c", _ASK_LEADER, d.metadata_url, NAME], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.log, text=True, env=d.env, cwd=d.workdir)

    def leader_of(self, nodes, timeout: float = 30.0):
        """leader_of is the node the election names now (None if none leads)."""
        self.process.stdin.write("?\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"the leader asker on ZooKeeper's host did not answer in {timeout:g} s"
        name = self.process.stdout.readline().strip()
        return next((node for node in nodes if node.host.name == name), None)


def histories(d: Deployment, nodes) -> list:
    ops = []
    for node in nodes:
        path = os.path.join(d.workdir, f"{node.host.name}.history.jsonl")
        if os.path.exists(path):
            ops += read_history(path)
    return ops


def wait_for_transfer_after(d: Deployment, nodes, since: float, timeout: float) -> bool:
    """wait_for_transfer_after waits until a node recorded a transfer acknowledged after `since`; it reads
    only the whole lines added to each history since it last looked (a completion is one line)."""
    deadline = time.monotonic() + timeout
    read = {}
    while time.monotonic() < deadline:
        for node in nodes:
            path = os.path.join(d.workdir, f"{node.host.name}.history.jsonl")
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                f.seek(read.get(path, 0))
                added = f.read()
            whole = added[:added.rfind(b"\n") + 1]           # a line being written is read next time
            read[path] = read.get(path, 0) + len(whole)
            for line in whole.splitlines():
                record = json.loads(line) if line.strip() else {}
                if record.get("f") == "transfer" and record.get("outcome") == "ok" and record["complete_time"] > since:
                    return True
        time.sleep(0.2)
    return False


def run_bank(tmp_path, seed: int, seconds: float, flags: list[str], **schedule_options):
    """run_bank runs one seeded nemesis against the bank; returns (applied faults, ops, final reads by node)."""
    schedule = Schedule.random(seed, seconds, **schedule_options)
    print(f"nemesis seed {seed}: {[f.kind for f in schedule.faults]}")
    with Network() as net, Deployment(net, str(tmp_path)) as d:
        meta, bookies, nodes = bank_cluster(net, d, seed, flags)
        asker = LeaderAsker(d, meta)
        nemesis = NodeNemesis(net, schedule, servers=nodes, bookies=bookies, meta=meta, clients=[],
                              leader=lambda: asker.leader_of(nodes))
        applied = nemesis.run()
        net.heal()
        last_heal = max(fault.healed for fault in applied)
        resumed = wait_for_transfer_after(d, nodes, last_heal, timeout=60)
        open(os.path.join(d.workdir, "STOP"), "w").close()
        for node in nodes:
            node.wait_log(r"workload stopped", timeout=60)
        open(os.path.join(d.workdir, "FINAL"), "w").close()
        finals = {}
        for node in nodes:
            assert node.process.wait(timeout=90) == 0, node.log()[-3000:]
            with open(os.path.join(d.workdir, f"{node.host.name}.final.json")) as f:
                final = json.load(f)
            finals[node.host.name] = {**final, "balances": dict(final["balances"])}
        ops = histories(d, nodes)
    for fault in applied:
        print(f"  {fault.kind:22} {fault.detail}")
    print(f"a transfer was acknowledged after the last heal: {resumed}")
    return applied, ops, finals


def leader_final(finals: dict) -> dict:
    leading = [final for final in finals.values() if final["leader"]]
    assert leading, f"no node led during its final read: {[(n, f['leader']) for n, f in finals.items()]}"
    return leading[0]


def test_the_sqlite_bank_loses_no_commit_and_conserves_money_under_a_seeded_nemesis(tmp_path, nemesis_seed,
                                                                                     nemesis_seconds):
    applied, ops, finals = run_bank(tmp_path, nemesis_seed, nemesis_seconds, [])
    final = leader_final(finals)
    verdict = check_bank(ops, range(ACCOUNTS), TOTAL, initial={a: BALANCE for a in range(ACCOUNTS)}, final=final)
    transfers = [op for op in ops if op.f == "transfer"]
    acked = [op for op in transfers if op.outcome == "ok"]
    reads = [op for op in ops if op.f == "read" and op.outcome == "ok"]
    unknown = [op for op in transfers if op.outcome != "ok" and op.outcome != "fail"]
    not_leader_at_commit = [op for op in unknown if (op.error or "").startswith("NotLeader at COMMIT")]
    listed = set(final["transfers"])
    writes = [dataclasses.replace(op, f="write") for op in transfers]          # unavailability counts writes
    print(f"seed {nemesis_seed}: {verdict}")
    print(f"transfers: {len(acked)} ok, {sum(op.outcome == 'fail' for op in transfers)} failed, {len(unknown)} "
          f"unknown ({sum(op.value['id'] in listed for op in unknown)} of them committed; NotLeader at COMMIT: "
          f"{len(not_leader_at_commit)}, committed {sum(op.value['id'] in listed for op in not_leader_at_commit)}); "
          f"reads: {len(reads)} ok ({sum(op.result['leader'] for op in reads)} on the leader)")
    print(f"unavailable s per fault: {unavailability(applied, writes)}")
    for op in not_leader_at_commit:
        print(f"  {op.value['id']} {'committed' if op.value['id'] in listed else 'not committed'}: {op.error}")
    assert verdict.valid, f"seed {nemesis_seed}: {verdict}"
    for node, other in finals.items():
        assert (other["balances"], other["transfers"]) == (final["balances"], final["transfers"]), \
            f"node {node}'s final read differs from the leader's"
    assert len(acked) > 50, len(acked)
    last_heal = max(fault.healed for fault in applied)
    assert any(op.complete_time > last_heal for op in acked), "no transfer was acknowledged after the last heal"


def test_the_checker_finds_the_stale_reads_of_a_node_that_trusts_its_role(tmp_path):
    seed = 3
    applied, ops, finals = run_bank(tmp_path, seed, 30, ["--trust-role"], kinds=("isolate-leader",),
                                    hold_s=(9.0, 10.0))
    verdict = check_bank(ops, range(ACCOUNTS), TOTAL, final=leader_final(finals))
    print(f"known-bad variant, seed {seed}: {verdict.checked} ops checked, {len(verdict.anomalies)} anomalies")
    print(str(verdict)[:3000])
    assert not verdict.valid, f"seed {seed}: the checker found no stale read from a node that trusts its role"
    assert any(text.startswith("lost commit") for text in verdict.anomalies), verdict
