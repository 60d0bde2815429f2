"""sqlite_bank_client is one node of a replicated SQLite bank, run on a host by the SQLite nemesis test.

    python sqlite_bank_client.py METADATA NAME NODE_ID FILE WORKDIR SEED [--trust-role]

The process embeds node NODE_ID of database NAME (walkit.adapters.sqlite.connect on FILE) and
is its own client: in SQLite the node and the application are one process. It records every
operation in WORKDIR/NODE_ID.history.jsonl (`JournaledHistory`), one line per invocation and one
per completion written at once, so a SIGKILL loses nothing recorded; a restarted process
appends to the same file under a new run id. `read_history` loads the file as walkit.testing.history Ops.

Start: whichever node leads first creates the accounts (ACCOUNTS of BALANCE each) in one
idempotent transaction (CREATE TABLE IF NOT EXISTS, INSERT OR IGNORE), so a node that leads
later, or this process restarted, changes nothing; others wait until their copy holds them.
Then it logs "bank ready" and runs TRANSFER_THREADS transfer threads and one read thread until
WORKDIR/STOP exists, logs "workload stopped", waits for WORKDIR/FINAL, makes one final read
(a read barrier, then the read; written to WORKDIR/NODE_ID.final.json with "leader") and exits.

Transfers (f "transfer", value {"id", "from", "to", "amount"}, ids NODE/RUN/THREAD/N): BEGIN
IMMEDIATE, two balance updates and the id inserted into `transfers`, COMMIT. Outcomes:

- an error before COMMIT (NotLeader at BEGIN IMMEDIATE on a follower, "database is locked",
  any statement's error) is a definite failure: statements run on the local copy only and
  nothing was submitted to the log (walkit.adapters.sqlite.connection);
- an error from COMMIT is an unknown outcome (info), whatever its class. CommitFailed says so
  itself. NotLeader from COMMIT does not always mean "never reached the log": the node fails
  appends still in flight when its writer closes with walkit.errors.NotLeader ("the record may
  be in the log", walkit.core.replica `_writer_closed`), and Database.submit turns every
  NotLeader of the future into one saying the transaction never reached the log (raised `from
  None`: the node's own NotLeader, its `__context__`, is kept in the op's error).

Reads (f "read", completion value {"balances", "transfers"}, plus "leader": whether this node
led before and after): `read_barrier()`, then the balances and every transfer id in one SQLite
read transaction. read_barrier returns once this copy applied every transaction acknowledged
before the call, on the leader (within its lease, or after proving it still leads) as on a
follower (once it applied the log's end as of the call), so every read that returns is checked
for currency, on any node; a read whose barrier fails (a partitioned node) failed and changes
nothing.

--trust-role is the known-bad variant for the broken-rule test: a read skips the barrier and
counts (ok) when `is_leader` said True before and after it, as if a node that believes it leads
were current; other reads fail. A leader cut off from ZooKeeper and the bookies goes on
believing it leads until its session is declared lost, while another node is elected and takes
transfers: the checker must find its stale reads.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import threading
import time

import walkit.adapters.sqlite as sqlite3      # the workload is written for the sqlite3 module
from walkit.testing.history import History, Op

ACCOUNTS = 5
BALANCE = 100
TRANSFER_THREADS = 2
#: A follower's transfer threads wait this long after NotLeader before they try again.
FOLLOWER_PACE_S = 0.1
#: How long a read waits for its barrier before it counts as failed.
BARRIER_S = 5.0
_FIELDS = ("index", "process", "f", "key", "value", "result", "invoke_time", "complete_time", "outcome", "error")


class JournaledHistory(History):
    """JournaledHistory is a History that appends each invocation and completion to `path` at once.

    Lines are JSON objects of an Op's fields plus `run`; a later line of the same (run, index)
    replaces the earlier one. A read's balances are written as [account, balance] pairs (JSON
    object keys would turn the account numbers into strings).
    """

    def __init__(self, path: str, run: str) -> None:
        super().__init__()
        self.run = run
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def invoke(self, process, f, key=None, value=None) -> Op:
        op = super().invoke(process, f, key, value)
        self._write(op)
        return op

    def ok(self, op: Op, value=None) -> None:
        super().ok(op, value)
        self._write(op)

    def fail(self, op: Op, error) -> None:
        super().fail(op, error)
        self._write(op)

    def info(self, op: Op, error) -> None:
        super().info(op, error)
        self._write(op)

    def _write(self, op: Op) -> None:
        record = {"run": self.run, **{name: getattr(op, name) for name in _FIELDS}}
        for name in ("value", "result"):
            if isinstance(record[name], dict) and "balances" in record[name]:
                record[name] = {**record[name], "balances": sorted(record[name]["balances"].items())}
        os.write(self._fd, (json.dumps(record) + "\n").encode())   # one write: whole lines under O_APPEND


def read_history(path: str) -> list[Op]:
    """read_history loads what JournaledHistory wrote to `path`: each op as last recorded
    (an op of a killed run that never completed stays pending: an unknown outcome)."""
    latest: dict[tuple[str, int], dict] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                latest[(record.pop("run"), record["index"])] = record
    ops = []
    for record in latest.values():
        for name in ("value", "result"):
            if isinstance(record[name], dict) and "balances" in record[name]:
                record[name] = {**record[name], "balances": {a: b for a, b in record[name]["balances"]}}
        ops.append(Op(**record))
    return ops


def bank_read(conn) -> dict:
    """bank_read reads the balances and every transfer id in one SQLite read transaction."""
    conn.execute("BEGIN")
    try:
        balances = dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
        transfers = [row[0] for row in conn.execute("SELECT id FROM transfers ORDER BY id")]
    finally:
        conn.rollback()
    return {"balances": balances, "transfers": transfers}


def create_accounts(conn) -> None:
    """create_accounts creates the bank once, whichever node runs it first (idempotent, one transaction)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS transfers(id TEXT PRIMARY KEY, src INTEGER, dst INTEGER, "
                     "amount INTEGER)")
        conn.executemany("INSERT OR IGNORE INTO accounts VALUES (?, ?)", [(i, BALANCE) for i in range(ACCOUNTS)])
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def has_accounts(conn) -> bool:
    """has_accounts is True once this copy holds every account."""
    try:
        return conn.execute("SELECT count(*) FROM accounts").fetchone()[0] == ACCOUNTS
    except sqlite3.OperationalError:               # no such table yet
        return False


def transfer_loop(connect, history: History, name: str, seed: str, stop: threading.Event) -> None:
    conn = connect()
    rng = random.Random(seed)
    n = 0
    try:
        while not stop.is_set():
            src, dst = rng.sample(range(ACCOUNTS), 2)
            n += 1
            move = {"id": f"{name}/{n}", "from": src, "to": dst, "amount": rng.randint(1, 20)}
            op = history.invoke(name, "transfer", value=move)
            try:
                conn.execute("BEGIN IMMEDIATE")       # NotLeader here on a follower: nothing was sent
                conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (move["amount"], src))
                conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (move["amount"], dst))
                conn.execute("INSERT INTO transfers VALUES (?, ?, ?, ?)", (move["id"], src, dst, move["amount"]))
            except Exception as exc:  # noqa: BLE001 - nothing was submitted: a definite failure
                if conn.in_transaction:
                    conn.rollback()
                history.fail(op, exc)
                stop.wait(FOLLOWER_PACE_S if isinstance(exc, sqlite3.NotLeader) else 0.01)
                continue
            try:
                conn.commit()
            except Exception as exc:  # noqa: BLE001 - whatever COMMIT raised, the log may hold the transaction
                original = exc.__context__ if isinstance(exc, sqlite3.NotLeader) else None   # raised `from None`
                history.info(op, f"{type(exc).__name__} at COMMIT: {exc}"
                                 + (f" [the node said {type(original).__name__}: {original}]" if original else ""))
                continue
            history.ok(op)
            stop.wait(rng.uniform(0.005, 0.02))   # the workload's pace
    finally:
        conn.close()


def read_loop(connect, history: History, name: str, seed: str, stop: threading.Event, trust_role: bool) -> None:
    conn = connect()
    rng = random.Random(seed)
    try:
        while not stop.is_set():
            op = history.invoke(name, "read")
            try:
                before = conn.is_leader
                if not trust_role:
                    conn.read_barrier(BARRIER_S)
                state = bank_read(conn)
                after = conn.is_leader
            except Exception as exc:  # noqa: BLE001 - a read changes nothing: any error is a failed read
                if conn.in_transaction:
                    conn.rollback()
                history.fail(op, exc)
            else:
                if trust_role and not (before and after):
                    history.fail(op, "not the leader throughout")
                else:
                    history.ok(op, {**state, "leader": before and after})
            stop.wait(rng.uniform(0.02, 0.05))
    finally:
        conn.close()


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


def main() -> None:
    metadata, name, node_id, path, workdir, seed, *flags = sys.argv[1:]
    trust_role = "--trust-role" in flags
    run = secrets.token_hex(3)
    # forward_writes=False: a follower's transfer fails at BEGIN IMMEDIATE, before anything is sent
    # (the history's "definite failure"); forwarded writes are tested in tests/adapters
    options = dict(name=name, metadata=metadata, node_id=node_id, isolation_level=None, forward_writes=False)

    def connect():
        return sqlite3.connect(path, **options)

    conn = connect()
    print(f"node {node_id} run {run}: connected; leader {conn.leader!r}", flush=True)
    while not has_accounts(conn):
        if conn.is_leader:
            try:
                create_accounts(conn)
            except sqlite3.Error as exc:
                print(f"creating the accounts failed ({type(exc).__name__}: {exc}); again", flush=True)
        time.sleep(0.1)
    print(f"bank ready: {bank_read(conn)['balances']}", flush=True)

    history = JournaledHistory(os.path.join(workdir, f"{node_id}.history.jsonl"), run)
    stop = threading.Event()
    prefix = f"{node_id}/{run}"
    threads = [threading.Thread(target=transfer_loop, args=(connect, history, f"{prefix}/t{k}",
                                                            f"{seed}-{prefix}-{k}", stop))
               for k in range(TRANSFER_THREADS)]
    threads.append(threading.Thread(target=read_loop, args=(connect, history, f"{prefix}/r",
                                                            f"{seed}-{prefix}-r", stop, trust_role)))
    for thread in threads:
        thread.start()
    wait_for_file(os.path.join(workdir, "STOP"))
    stop.set()
    for thread in threads:
        thread.join()
    print(f"workload stopped: {len(history)} ops", flush=True)

    wait_for_file(os.path.join(workdir, "FINAL"))
    while True:                                   # the final read: current as of now, on every node
        try:
            before = conn.is_leader
            conn.read_barrier(BARRIER_S)
            final = {**bank_read(conn), "leader": before and conn.is_leader}
            break
        except Exception as exc:  # noqa: BLE001 - walkit.errors.Timeout from the barrier, NotLeader, ...
            print(f"final read failed ({type(exc).__name__}: {exc}); again", flush=True)
            if conn.in_transaction:
                conn.rollback()
    out = os.path.join(workdir, f"{node_id}.final.json")
    with open(out + ".tmp", "w") as f:
        json.dump({**final, "balances": sorted(final["balances"].items())}, f)
    os.rename(out + ".tmp", out)
    print(f"final read: {len(final['transfers'])} transfers, leader {final['leader']}", flush=True)
    conn.close()


if __name__ == "__main__":
    main()
