"""Auto-recovery benchmark: a bookie SIGKILLed under 100,000 entries, until every entry is back on Qw.

    python benchmarks/recovery_bench.py [--entries 100000] [--ledgers 10] [--size 100] [--delay 0] [--json out.json]

Five bookies (files storage, SQLite metadata, auto-recovery in every bookie) hold E3/Qw2/Qa2
closed ledgers; the bookie in the most ledgers is SIGKILLed and never restarted. Reported:

- detection: SIGKILL -> first mark (registration expiry, 3 s on SQLite, + the lost bookie delay);
- replication: first mark -> no ledger names the dead bookie and no mark is left;
- entries copied (sum of every worker's walkit_replication_entries_copied_total) and entries/s;
- audit cost: the auditor's metadata reads, total and per second (peak over 1 s windows), and
  the idle cost (reads/s while nothing is lost);
- the in-process copy rate of `walkit recover` for a second bookie killed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.ops.helpers import auditor_http, fragments_on, scrape  # noqa: E402
from walkit.autorecovery import UnderReplication  # noqa: E402
from walkit.autorecovery.operations import recover_bookie  # noqa: E402
from walkit.client.api import Client  # noqa: E402
from walkit.local import LocalCluster  # noqa: E402


def write(client, ledgers: int, entries: int, size: int) -> list[int]:
    ids, per_ledger = [], entries // ledgers
    payload = b"x" * size
    for _ in range(ledgers):
        writer = client.create_ledger(3, 2, 2, password=b"pw")
        for future in [writer.append_async(payload) for _ in range(per_ledger)]:
            future.result()
        writer.close()
        ids.append(writer.ledger_id)
    return ids


def audit_reads(client) -> float:
    address = auditor_http(client)
    return scrape(address).get("walkit_audit_metadata_reads_total", 0.0) if address else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--ledgers", type=int, default=10)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--delay", type=float, default=0.0, help="lost bookie delay, seconds")
    parser.add_argument("--json", default=None, help="write the results to this file too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir, \
            LocalCluster(bookies=5, data_dir=data_dir, http=True,
                         bookie_args=("--lost-bookie-delay", str(args.delay), "--recovery-password", "pw",
                                      "--periodic-check-interval", "0")) as cluster, \
            Client(cluster.metadata_url) as client:
        started = time.monotonic()
        ids = write(client, args.ledgers, args.entries, args.size)
        write_s = time.monotonic() - started
        while auditor_http(client) is None:
            time.sleep(0.1)
        idle_before, idle_started = audit_reads(client), time.monotonic()
        time.sleep(5)
        idle_rate = (audit_reads(client) - idle_before) / (time.monotonic() - idle_started)
        counts = {b: sum(b in client.ledger_metadata(i).bookies for i in ids) for b in cluster.addresses}
        victim = max(counts, key=counts.get)
        marks = UnderReplication(client.store)
        reads_before = audit_reads(client)
        samples: list[tuple[float, float]] = []
        killed = time.monotonic()
        cluster.kill_bookie(cluster.addresses.index(victim))
        marked_at = None
        while True:
            now = time.monotonic()
            try:
                samples.append((now, audit_reads(client)))
            except OSError:
                pass                              # the auditor itself may have been the victim
            if marked_at is None and marks.ledger_ids():
                marked_at = now
            if marked_at is not None and not marks.ledger_ids() and not fragments_on(client, victim):
                break
            if now - killed > 600:
                raise SystemExit("not replicated within 600 s")
            time.sleep(0.05)
        done_at = time.monotonic()
        copied = sum(scrape(info.http).get("walkit_replication_entries_copied_total", 0)
                     for info in client.bookies().values())
        reads = audit_reads(client) - reads_before
        peak = 0.0
        for i, (t0, r0) in enumerate(samples):
            later = [(t, r) for t, r in samples[i:] if t - t0 >= 1.0]
            if later:
                t1, r1 = later[0]
                peak = max(peak, (r1 - r0) / (t1 - t0))
        # A second bookie, copied by `walkit recover` in this process (no delay, no expiry wait).
        second = max((b for b in counts if b != victim and b in client.bookies()),
                     key=lambda b: sum(b in client.ledger_metadata(i).bookies for i in ids))
        marks.set_enabled(False)                       # the bookies' workers stay out of it
        cluster.kill_bookie(cluster.addresses.index(second))
        report = recover_bookie(client, second, passwords=["pw"])
        marks.set_enabled(True)
        results = {
            "entries": args.ledgers * (args.entries // args.ledgers), "ledgers": args.ledgers, "size": args.size,
            "write_s": round(write_s, 2), "lost_bookie_delay_s": args.delay, "victim_ledgers": counts[victim],
            "sigkill_to_marked_s": round(marked_at - killed, 2), "marked_to_replicated_s": round(done_at - marked_at, 2),
            "sigkill_to_replicated_s": round(done_at - killed, 2), "entries_copied": int(copied),
            "copy_entries_per_s": round(copied / max(done_at - marked_at, 1e-9)),
            "audit_metadata_reads": int(reads), "audit_reads_per_s_peak": round(peak, 1),
            "audit_reads_per_s_idle": round(idle_rate, 2),
            "recover_command": {"entries_copied": report["entries_copied"], "seconds": report["seconds"],
                                "entries_per_s": round(report["entries_copied"] / max(report["seconds"], 1e-9))},
        }
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
