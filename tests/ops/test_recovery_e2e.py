"""Auto-recovery, placement and decommission with real bookie processes (issue 18's must-show).

One cluster for the module: five bookies on racks a, a, b, b, c, each running auto-recovery
(lost bookie delay LOST_DELAY_S) and serving /metrics. The tests run in file order and each
uses the bookies alive at its start: the rack test first, then a bookie is SIGKILLed for good,
then another is decommissioned while a writer is writing to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.helpers import wait_until
from tests.ops.helpers import PASSWORD, BackgroundWriter, auditor_http, fragments_on, missing_replicas, scrape
from walkit.autorecovery import UnderReplication
from walkit.client.api import Client
from walkit.errors import LedgerFenced, NotEnoughBookies
from walkit.local import LocalCluster
from walkit.placement import write_set_racks

pytestmark = pytest.mark.slow

LOST_DELAY_S = 3.0
#: Beyond the delay: the registration's expiry (3 s on SQLite), the audit and the copying.
RECOVERY_BOUND_S = 90.0
RACKS = ["a", "a", "b", "b", "c"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("recovery")
    with LocalCluster(bookies=5, data_dir=str(data_dir), racks=RACKS, http=True,
                      bookie_args=("--lost-bookie-delay", str(LOST_DELAY_S), "--recovery-password", "pw",
                                   "--recovery-password", "",
                                   "--open-ledger-grace", "5", "--periodic-check-interval", "0")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster.metadata_url) as client:
        yield client


def live_racks(client) -> dict[str, str]:
    return {address: info.rack for address, info in client.bookies().items()}


def test_every_write_set_of_a_new_e3_qw2_ledger_spans_two_racks(cluster, client):
    racks = live_racks(client)
    assert sorted(racks.values()) == RACKS
    for _ in range(20):
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        ensemble = writer.metadata.ensembles[0]
        assert write_set_racks(ensemble, racks, 2) == 2, [racks[b] for b in ensemble]
        writer.close()
    with Client(cluster.metadata_url, min_racks=2) as strict:
        strict.create_ledger(3, 2, 2).close()                      # a, b, c: possible
        with pytest.raises(NotEnoughBookies, match="racks"):
            strict.create_ledger(4, 3, 2, min_racks=3)             # four write sets of three on a, a, b, b, c: no


def test_a_bookie_killed_for_good_has_all_its_entries_copied_back_to_write_quorum(cluster, client):
    """100,000 entries on E3/Qw2/Qa2 ledgers; one bookie SIGKILLed and never restarted."""
    acked: dict[int, dict[int, bytes]] = {}
    started = time.monotonic()
    for index in range(9):                                         # 9 closed ledgers of 11,000 entries
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        futures = {writer.append_async(f"{writer.ledger_id}:{e}:".encode() + b"x" * 90): e for e in range(11_000)}
        acked[writer.ledger_id] = {f.result(): f"{writer.ledger_id}:{e}:".encode() + b"x" * 90
                                   for f, e in futures.items()}
        writer.close()
    open_writer = client.create_ledger(3, 2, 2, password=PASSWORD)  # and one open ledger of 1,000, idle
    acked[open_writer.ledger_id] = {open_writer.append_async(b"open %d" % e).result(): b"open %d" % e
                                    for e in range(1_000)}
    assert sum(len(entries) for entries in acked.values()) == 100_000
    write_s = time.monotonic() - started
    # The victim: of the open ledger's bookies, the one in the most ledgers (the unclosed ledger
    # exercises the grace period, the others the copying).
    victim = max(open_writer.metadata.current_ensemble,
                 key=lambda b: sum(b in client.ledger_metadata(lid).bookies for lid in acked))
    victim_index = cluster.addresses.index(victim)
    held = [lid for lid in acked if victim in client.ledger_metadata(lid).bookies]
    marks = UnderReplication(client.store)
    seen_marks = threading.Event()
    killed = time.monotonic()
    cluster.kill_bookie(victim_index)

    def recovered():
        if marks.ledger_ids():
            seen_marks.set()
            return False
        return seen_marks.is_set() and not fragments_on(client, victim)
    wait_until(lambda: marks.ledger_ids(), timeout=LOST_DELAY_S + RECOVERY_BOUND_S, interval=0.05)
    marked_s = time.monotonic() - killed
    assert marked_s >= LOST_DELAY_S                 # nothing is marked before the lost bookie delay
    wait_until(recovered, timeout=LOST_DELAY_S + RECOVERY_BOUND_S, interval=0.1,
               message=lambda: f"marks {marks.ledger_ids()}, fragments on {victim}: {fragments_on(client, victim)}")
    recovery_s = time.monotonic() - killed
    live = set(client.bookies())
    assert victim not in live
    for ledger_id, entries in acked.items():
        assert missing_replicas(client, ledger_id, entries, live) == [], f"ledger {ledger_id}"
        reader = client.open_ledger(ledger_id, password=PASSWORD)
        assert reader.is_closed                 # the open ledger was recovered after its grace period
        assert {e.entry_id: e.payload for e in reader.read(0, max(entries))} == entries
    auditor = auditor_http(client)
    assert auditor is not None
    wait_until(lambda: scrape(auditor).get("walkit_underreplicated_ledgers") == 0, timeout=15,
               message="the auditor's walkit_underreplicated_ledgers gauge did not go back to 0")
    copied = sum(scrape(info.http).get("walkit_replication_entries_copied_total", 0)
                 for info in client.bookies().values())
    reads = scrape(auditor).get("walkit_audit_metadata_reads_total", 0)
    print(f"\n100,000 entries written in {write_s:.1f} s; {len(held)} ledgers on {victim}; marked {marked_s:.1f} s "
          f"and fully replicated {recovery_s:.1f} s after SIGKILL (lost bookie delay {LOST_DELAY_S:g} s + 3 s registration expiry); "
          f"{copied:.0f} entries copied; auditor metadata reads {reads:.0f}")
    with pytest.raises(LedgerFenced):
        open_writer.append(b"fenced", timeout=10)      # the idle writer was fenced by the recovery


def test_decommission_moves_a_live_bookies_data_while_its_writer_goes_on(cluster, client):
    live = sorted(client.bookies())
    writer = client.create_ledger(3, 2, 2, password=PASSWORD)
    target = writer.metadata.current_ensemble[1]
    closed = client.create_ledger(3, 2, 2, password=PASSWORD)
    expected_closed = {closed.append(b"closed %d" % e): b"closed %d" % e for e in range(2000)}
    closed.close()
    background = BackgroundWriter(writer, b"live", timeout=30)
    written = background.written
    try:
        wait_until(lambda: len(written) > 200, timeout=30)
        result = subprocess.run([sys.executable, "-m", "walkit", "bookies", "decommission", target, "--password",
                                 "pw", "--open-grace", "30", "--json", "--metadata", cluster.metadata_url],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["can_stop"] and report["bookie"] == target
        count = len(written)
        wait_until(lambda: len(written) > count + 100, timeout=30, message="the writer stopped writing")
    finally:
        background.stop()
    assert background.failures == []
    writer.close()
    assert fragments_on(client, target) == []
    info = client.registry.info(target)
    assert info is not None and info.draining and info.read_only        # still running, taking no writes
    movers = set(live) - {target}
    assert missing_replicas(client, writer.ledger_id, written, movers) == []
    assert missing_replicas(client, closed.ledger_id, expected_closed, movers) == []
    for _ in range(10):
        fresh = client.create_ledger(3, 2, 2)
        assert target not in fresh.metadata.ensembles[0]
        fresh.close()
