"""A bank process for the SQLite replicator's failover test: one node of database NAME, driven over stdin.

    python tests/adapters/sqlite_bank_node.py METADATA NAME NODE_ID FILE ACKED_FILE

Commands (one per line; each answered by one JSON line on stdout): `state`; `init N BALANCE`
(accounts 0..N-1); `load THREADS` (transfer threads, each with its own connect(); they
transfer while this node leads and wait while it follows); `stop` (the threads end); `dump`
(position, balances and transfer ids, read in one transaction); `quit`. Every transfer whose
COMMIT returned is appended to ACKED_FILE at once, so what a SIGKILL interrupts is known.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

import walkit.adapters.sqlite as sqlite3      # the workload is written for the sqlite3 module


def main() -> None:
    metadata, name, node_id, path, acked_path = sys.argv[1:6]
    options = dict(name=name, metadata=metadata, node_id=node_id, snapshot_every_records=200, retention_s=3600)
    conn = sqlite3.connect(path, check_same_thread=False, **options)
    acked = os.open(acked_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop = threading.Event()
    workers: list[threading.Thread] = []
    counts = {"acked": 0, "refused": 0, "failed": 0}
    lock = threading.Lock()

    def transfer_loop(k: int) -> None:
        mine = sqlite3.connect(path, **options)
        rng = random.Random(f"{node_id}-{k}")
        i = 0
        try:
            while not stop.is_set():
                if not mine.is_leader:
                    time.sleep(0.01)              # a follower's threads wait to be promoted
                    continue
                ident = f"{node_id}-{k}-{i}"
                i += 1
                accounts = mine.execute("SELECT count(*) FROM accounts").fetchone()[0]
                src, dst = rng.sample(range(accounts), 2)
                amount = rng.randint(1, 50)
                try:
                    with mine:
                        (balance,) = mine.execute("SELECT balance FROM accounts WHERE id = ?", (src,)).fetchone()
                        amount = min(amount, balance)
                        mine.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (amount, src))
                        mine.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, dst))
                        mine.execute("INSERT INTO transfers(id, src, dst, amount, at) VALUES (?, ?, ?, ?, "
                                     "strftime('%Y-%m-%d %H:%M:%f', 'now'))", (ident, src, dst, amount))
                except sqlite3.NotLeader:
                    with lock:
                        counts["refused"] += 1
                    continue
                except sqlite3.Error:
                    with lock:
                        counts["failed"] += 1     # outcome unknown (CommitFailed) or a lost race
                    continue
                os.write(acked, f"{ident}\n".encode())
                with lock:
                    counts["acked"] += 1
        finally:
            mine.close()

    def reply(doc: dict) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    reply({"ready": True, "is_leader": conn.is_leader, "leader": conn.leader})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command = words[0]
        if command == "state":
            reply({"is_leader": conn.is_leader, "leader": conn.leader, "position": str(conn.position), **counts})
        elif command == "init":
            count, balance = int(words[1]), int(words[2])
            with conn:
                conn.execute("CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL "
                             "CHECK (balance >= 0))")
                conn.execute("CREATE TABLE transfers(id TEXT PRIMARY KEY, src, dst, amount, at)")
                conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(i, balance) for i in range(count)])
            reply({"initialized": True, "position": str(conn.position)})
        elif command == "load":
            for k in range(int(words[1])):
                worker = threading.Thread(target=transfer_loop, args=(k,), daemon=True)
                worker.start()
                workers.append(worker)
            reply({"loading": len(workers)})
        elif command == "stop":
            stop.set()
            for worker in workers:
                worker.join(60)
            reply({"stopped": True, **counts})
        elif command == "dump":
            conn.read_barrier()
            conn.execute("BEGIN")
            try:
                at = conn.execute("SELECT ledger, entry, record FROM _walkit_position").fetchone()
                balances = conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
                transfers = [row[0] for row in conn.execute("SELECT id FROM transfers ORDER BY id")]
            finally:
                conn.rollback()
            reply({"position": f"{at[0]}:{at[1]}", "record": at[2], "balances": balances, "transfers": transfers,
                   "is_leader": conn.is_leader})
        elif command == "quit":
            break
    conn.close()


if __name__ == "__main__":
    main()
