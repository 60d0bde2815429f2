"""A walkit cluster across hosts (Linux network namespaces): ZooKeeper, bookies and clients each on
an address of their own, with the network cut between them.

- One bookie listens on 0.0.0.0 and registers the address given by --advertise; a ledger whose
  ensemble holds it is written from another host, a bookie of that ensemble is cut off mid-stream
  (the writer replaces it and goes on), the writer is SIGKILLed, and a reader on a third host
  recovers the ledger: every acknowledged entry is there, and the cut bookie is back after heal.
- A bookie whose address changes (its storage moved to a new host) keeps its id, and a reader on
  another host reads its ledger from it when no other bookie holds the entries.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from walkit.testing.multihost import Deployment
from walkit.testing.network import Network, network_available

pytestmark = pytest.mark.network

AGENT = os.path.join(os.path.dirname(__file__), "agent.py")


@pytest.fixture(scope="module", autouse=True)
def _machine_can_run_networks():
    reason = network_available()
    if reason is not None:
        pytest.fail(f"{reason}: run scripts/test.sh as root", pytrace=False)


class Writer:
    """Writer is tests/network/agent.py's `write` on a host, its acknowledged entry ids read as they come."""

    def __init__(self, deployment: Deployment, host, quorums: tuple[int, int, int], include: str) -> None:
        self.process = host.popen([sys.executable, AGENT, "write", deployment.metadata_url, *map(str, quorums),
                                   include], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=deployment.env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.next_line(60)
        assert first.startswith("ledger "), first
        _, ledger, ensemble = first.split()
        self.ledger_id, self.ensemble = int(ledger), ensemble.split(",")
        self.acked: list[int] = []

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the writer said nothing for {timeout:g} s") from None

    def until_acked(self, count: int, timeout: float = 60.0) -> None:
        """until_acked reads acknowledgements until `count` more arrived (errors fail the test)."""
        goal = len(self.acked) + count
        while len(self.acked) < goal:
            line = self.next_line(timeout)
            assert not line.startswith("error"), line
            self.acked.append(int(line))

    def close(self) -> int:
        """close has the writer close its ledger and returns the last entry id it closed it at."""
        self.process.stdin.write("close\n")
        self.process.stdin.flush()
        while not (line := self.next_line(60)).startswith("closed"):
            assert line.isdigit(), line
            self.acked.append(int(line))
        self.process.wait()
        last = int(line.split()[1])
        assert last == self.acked[-1] and self.acked == list(range(last + 1))
        return last

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        while not self.lines.empty():           # acknowledgements printed before the kill count too
            line = self.lines.get()
            if line.isdigit():
                self.acked.append(int(line))


def ledger_info(deployment: Deployment, host, ledger_id: int) -> dict:
    """ledger_info is `walkit ledger info --json` of the ledger, as `host` reads it."""
    return json.loads(deployment.walkit(host, "ledger", "info", str(ledger_id), "--json", "--metadata",
                                        deployment.metadata_url).stdout)


def read_ledger(deployment: Deployment, host, ledger_id: int, recover: bool = False) -> tuple[int, int]:
    """read_ledger reads the whole ledger on `host`; it returns (last add confirmed, entries read)."""
    out = deployment.python(host, AGENT, "read", deployment.metadata_url, str(ledger_id),
                            "recover" if recover else "", timeout=120).stdout.split("\n")
    assert "payloads OK" in out, out
    _, lac, count = next(line for line in out if line.startswith("read ")).split()
    return int(lac), int(count)


def test_a_wildcard_bookie_with_advertise_serves_writes_failover_and_recovery_across_hosts(tmp_path):
    with Network() as net, Deployment(net, str(tmp_path)) as d:
        d.zookeeper(net.add_host("meta"))
        bookie_hosts = [net.add_host(f"b{i}") for i in range(5)]
        for host in bookie_hosts[:4]:
            d.bookie(host, args=("--no-autorecovery",))
        wildcard = d.bookie(bookie_hosts[4], listen="0.0.0.0:3181", args=("--no-autorecovery",))
        writer_host, reader_host = net.add_host("writer"), net.add_host("reader")

        wildcard_id = f"{bookie_hosts[4].address}:3181"
        live = d.live_bookies(reader_host)
        assert live[wildcard_id]["endpoint"] == wildcard_id and len(live) == 5
        assert "0.0.0.0" not in wildcard.log()

        writer = Writer(d, writer_host, (4, 3, 2), include=wildcard_id)
        writer.until_acked(200)
        victim = next(b for b in bookie_hosts if f"{b.address}:3181" in writer.ensemble and b is not bookie_hosts[4])
        victim_id = f"{victim.address}:3181"
        net.isolate(victim)                      # cut off mid-stream (no RST): the writer must replace it
        deadline = time.monotonic() + 60
        while victim_id in ledger_info(d, reader_host, writer.ledger_id)["fragments"][-1]["bookies"]:
            assert time.monotonic() < deadline, "the writer never replaced the bookie that was cut off"
            writer.until_acked(20)
        writer.until_acked(100)                  # and goes on writing on the new ensemble
        writer.kill()
        net.heal()

        lac, count = read_ledger(d, reader_host, writer.ledger_id, recover=True)
        assert writer.acked == list(range(len(writer.acked)))
        assert lac >= writer.acked[-1] and count == lac + 1          # every acknowledged entry, none lost
        info = ledger_info(d, reader_host, writer.ledger_id)
        fragments = [set(f["bookies"]) for f in info["fragments"]]
        assert victim_id in fragments[0] and victim_id not in fragments[-1] and wildcard_id in fragments[-1]
        assert info["metadata"]["state"] == "CLOSED" and info["metadata"]["last_entry_id"] == lac


def test_a_bookie_whose_address_changes_keeps_its_id_and_serves_its_ledger(tmp_path):
    with Network() as net, Deployment(net, str(tmp_path)) as d:
        d.zookeeper(net.add_host("meta"))
        hosts = [net.add_host(f"b{i}") for i in range(3)]
        bookies = [d.bookie(host, args=("--no-autorecovery",)) for host in hosts]
        client = net.add_host("client")
        moved_id = f"{hosts[0].address}:3181"

        writer = Writer(d, client, (3, 3, 3), include=moved_id)
        writer.until_acked(100)
        last = writer.close()

        bookies[0].stop()
        new_home = net.add_host("b0moved")          # the same storage, on another host and address
        d.bookie(new_home, storage=f"files://{tmp_path}/b0-bookie-data", args=("--no-autorecovery",), name="moved")
        for bookie in bookies[1:]:
            bookie.stop()                            # the entries now exist only on the moved bookie

        live = d.live_bookies(client)
        assert list(live) == [moved_id] and live[moved_id]["endpoint"] == f"{new_home.address}:3181"
        assert read_ledger(d, client, writer.ledger_id) == (last, last + 1)
