"""Auto-recovery under faults, with real processes: a worker killed mid-copy, the auditor killed
and re-elected, and a writer that goes on writing while the auditor repairs its ledger.

The first two run the auditor and the workers as standalone `walkit autorecovery` processes (the
bookies run none), so each can be stopped and killed on its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.helpers import wait_until
from tests.ops.helpers import PASSWORD, BackgroundWriter, fragments_on, missing_replicas, scrape
from walkit.autorecovery import UnderReplication
from walkit.autorecovery.auditor import ELECTION
from walkit.client.api import Client
from walkit.election import LeaderElection
from walkit.local import LocalCluster, free_port

pytestmark = pytest.mark.slow


class Daemons:
    """Daemons starts `walkit autorecovery` processes and stops every one of them at the end."""

    def __init__(self, metadata_url: str, log_dir) -> None:
        self.metadata_url = metadata_url
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen] = {}
        self.http: dict[str, str] = {}

    def start(self, name: str, *options: str) -> subprocess.Popen:
        port = free_port()
        command = [sys.executable, "-m", "walkit", "autorecovery", "--metadata", self.metadata_url, "--name", name,
                   "--http-port", str(port), "--recovery-password", "pw", *options]
        with open(os.path.join(self.log_dir, f"{name}.log"), "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes[name], self.http[name] = process, f"127.0.0.1:{port}"
        wait_until(lambda: _answers(self.http[name]) or process.poll() is not None, timeout=30)
        assert process.poll() is None, f"{name} exited: {self.log(name)}"
        return process

    def log(self, name: str) -> str:
        with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
            return f.read()[-3000:]

    def kill(self, name: str) -> None:
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answers(http: str) -> bool:
    try:
        scrape(http)
        return True
    except OSError:
        return False


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "cluster"), bookie_args=("--no-autorecovery",)) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with Client(cluster.metadata_url) as client:
        yield client


@pytest.fixture
def daemons(cluster, tmp_path):
    daemons = Daemons(cluster.metadata_url, str(tmp_path))
    yield daemons
    daemons.close()


def write_closed(client, ledgers: int, entries: int, size: int = 200) -> dict[int, dict[int, bytes]]:
    acked = {}
    for _ in range(ledgers):
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        payloads = [os.urandom(size) for _ in range(entries)]
        futures = [writer.append_async(p) for p in payloads]
        acked[writer.ledger_id] = {f.result(): p for f, p in zip(futures, payloads)}
        writer.close()
    return acked


def bookie_in_most(client, ledger_ids) -> str:
    counts: dict[str, int] = {}
    for ledger_id in ledger_ids:
        for bookie in client.ledger_metadata(ledger_id).bookies:
            counts[bookie] = counts.get(bookie, 0) + 1
    return max(counts, key=counts.get)


def wait_repaired(client, victim: str, timeout: float) -> None:
    marks = UnderReplication(client.store)
    wait_until(lambda: not marks.ledger_ids() and not fragments_on(client, victim), timeout=timeout, interval=0.1,
               message=lambda: f"marks {marks.ledger_ids()}, fragments on {victim}: {fragments_on(client, victim)}")


def test_a_worker_killed_mid_copy_leaves_its_ledger_to_another_worker(cluster, client, daemons):
    acked = write_closed(client, ledgers=6, entries=8000)
    victim = bookie_in_most(client, acked)
    daemons.start("auditor", "--no-worker", "--lost-bookie-delay", "1")
    first = daemons.start("w1", "--no-auditor")
    marks = UnderReplication(client.store)
    cluster.kill_bookie(cluster.addresses.index(victim))

    def copying():
        found = scrape(daemons.http["w1"])
        return found.get("walkit_replication_entries_copied_total", 0) > 0
    wait_until(copying, timeout=60, interval=0.01, message="w1 never started copying")
    first.send_signal(signal.SIGSTOP)                  # freeze it in the middle of its work, then look
    held = [lid for lid in marks.ledger_ids() if marks.lock_holder(lid) == "w1"]
    assert held, "w1 held no ledger's lock while copying"
    in_hand = held[0]
    assert victim in client.ledger_metadata(in_hand).bookies    # copied in part, metadata not rewritten yet
    daemons.kill("w1")
    wait_until(lambda: marks.lock_holder(in_hand) != "w1", timeout=15,
               message="w1's lock did not expire with its session")
    daemons.start("w2", "--no-auditor")
    wait_repaired(client, victim, timeout=120)
    assert scrape(daemons.http["w2"])["walkit_replication_ledgers_total"] >= 1
    assert victim not in client.ledger_metadata(in_hand).bookies
    live = set(client.bookies())
    for ledger_id, entries in acked.items():
        assert missing_replicas(client, ledger_id, entries, live) == [], f"ledger {ledger_id}"


def test_the_auditor_killed_after_noticing_a_loss_is_succeeded_and_the_delay_kept(cluster, client, daemons):
    delay_s = 6.0
    acked = write_closed(client, ledgers=4, entries=2000)
    for name in ("a1", "a2"):
        daemons.start(name, "--no-worker", "--lost-bookie-delay", str(delay_s))
    daemons.start("worker", "--no-auditor")
    election = LeaderElection(client.store, ELECTION, "test-observer")
    leader = wait_until(election.leader, timeout=30)
    assert leader in ("a1", "a2")
    successor = "a2" if leader == "a1" else "a1"
    marks = UnderReplication(client.store)
    wait_until(lambda: set(cluster.addresses) <= set(marks.known_bookies()), timeout=30)
    victim = bookie_in_most(client, acked)
    cluster.kill_bookie(cluster.addresses.index(victim))
    lost_since = wait_until(lambda: marks.known_bookies().get(victim), timeout=30,
                            message="the auditor did not notice the lost bookie")
    assert not marks.ledger_ids()                      # noticed, not marked: the delay runs
    daemons.kill(leader)
    wait_until(lambda: election.leader() == successor, timeout=30, message="no new auditor was elected")
    first_mark = wait_until(lambda: marks.marks(), timeout=60, message="the new auditor marked nothing")
    earliest = min(mark.marked_ms for mark in first_mark.values())
    assert earliest >= lost_since + delay_s * 1000     # the successor kept the first auditor's clock
    wait_repaired(client, victim, timeout=120)
    live = set(client.bookies())
    for ledger_id, entries in acked.items():
        assert missing_replicas(client, ledger_id, entries, live) == [], f"ledger {ledger_id}"


def test_a_writer_and_the_auditor_change_the_same_open_ledger_without_corrupting_it(tmp_path):
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "writing"), http=True,
                      bookie_args=("--lost-bookie-delay", "1", "--open-ledger-grace", "600",
                                   "--recovery-password", "pw")) as cluster, \
            Client(cluster.metadata_url, add_timeout=2) as client:
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        background = BackgroundWriter(writer)
        written, failures = background.written, background.failures
        dead = []
        try:
            for round_ in range(2):
                wait_until(lambda: len(written) > 500 * (round_ + 1), timeout=60)
                victim = next(b for b in writer.metadata.current_ensemble if b not in dead)
                dead.append(victim)
                cluster.kill_bookie(cluster.addresses.index(victim))
                # The writer replaces the bookie in its last fragment; the auditor marks the
                # ledger and a worker moves the earlier fragment, both by CAS on one key.
                wait_until(lambda: not fragments_on(client, victim) and not UnderReplication(client.store).ledger_ids(),
                           timeout=90, interval=0.1, message=lambda: f"fragments on {victim}: {fragments_on(client, victim)}")
                assert not failures, failures
            count = len(written)
            wait_until(lambda: len(written) > count + 200, timeout=30, message="the writer stopped")
        finally:
            background.stop()
        assert failures == []
        closed = writer.close()                       # its CAS may meet the workers' rewrites: re-read, close
        assert closed.state == "CLOSED" and closed.last_entry_id == max(written)
        metadata = client.ledger_metadata(writer.ledger_id)
        assert not set(dead) & metadata.bookies
        live = set(client.bookies())
        assert missing_replicas(client, writer.ledger_id, written, live) == []
        reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
        assert {e.entry_id: e.payload for e in reader.read()} == written
        conflicts = sum(scrape(info.http).get("walkit_replication_cas_conflicts_total", 0)
                        for info in client.bookies().values())
        print(f"\nwriter wrote {len(written)} entries through 2 bookie losses; fragments {sorted(metadata.ensembles)}; "
              f"worker CAS conflicts seen: {conflicts:.0f}")


def test_a_bookie_back_after_its_data_was_copied_away_gives_the_space_back(tmp_path):
    with LocalCluster(bookies=5, data_dir=str(tmp_path / "gc"), http=True,
                      bookie_args=("--lost-bookie-delay", "1", "--recovery-password", "pw", "--gc-interval", "1",
                                   "--periodic-check-interval", "0")) as cluster, \
            Client(cluster.metadata_url) as client:
        acked = write_closed(client, ledgers=4, entries=500)
        victim = bookie_in_most(client, acked)
        index = cluster.addresses.index(victim)
        held = [lid for lid in acked if victim in client.ledger_metadata(lid).bookies]
        cluster.kill_bookie(index)
        wait_repaired(client, victim, timeout=90)
        cluster.start_bookie(index)                        # back, with copies nobody reads any more
        http = cluster.http_address(index)

        def dropped():
            log = cluster.log_tail(index, lines=500)
            return all(f"ledger {lid} no longer names this bookie" in log for lid in held)
        wait_until(dropped, timeout=60, message=lambda: cluster.log_tail(index))
        wait_until(lambda: scrape(http).get("walkit_bookie_ledgers") == 0, timeout=30,
                   message="the returned bookie kept the ledgers re-replicated away from it")
        live = set(client.bookies()) - {victim}
        for ledger_id, entries in acked.items():
            assert missing_replicas(client, ledger_id, entries, live) == [], f"ledger {ledger_id}"
