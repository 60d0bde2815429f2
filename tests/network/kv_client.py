"""kv_client is a KV workload the nemesis tests run on a client host, recording a history.

    python kv_client.py [--healed-file H] OUT SEED SECONDS THREADS KEYS WRITES SERVER [SERVER ...]

Half the threads are patient (they wait long for an answer and stay with their server, as a
client that reconnects to the host it knows), half move to another server after a short wait.
Each thread is a client process of the history (a new process id after an op whose outcome is
unknown, as in Jepsen). It picks a key of KEYS and either writes (a WRITES fraction of its ops) a value no one else writes
(SET) or reads (ROLE, GET, ROLE pipelined on one connection: a read counts only if both ROLEs
say master, since a follower's reads are stale by design). Writes answered READONLY or LOADING
did not happen; a write whose connection failed or timed out may have. Threads follow a
READONLY answer to the leader it names, and move to another server after an error. The history
is written to OUT (walkit.testing.history JSONL) when the time is up: after SECONDS, or with
--healed-file, 3 s after the test wrote H once its nemesis was over (walkit.testing.nemesis.Deadline).
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from walkit.testing.history import History
from walkit.testing.nemesis import Deadline

#: Impatient threads give up on an answer after IMPATIENT_S and move to another server; patient
#: ones wait PATIENT_S and stay with their server (a client that reconnects to the host it knows).
IMPATIENT_S = 3.0
PATIENT_S = 15.0


def worker(history: History, rng: random.Random, servers: list[str], keys: int, writes: float, deadline: Deadline,
           name: str, patient: bool) -> None:
    generation = itertools.count()
    timeout = PATIENT_S if patient else IMPATIENT_S

    def another(current: str) -> str:
        return current if patient else rng.choice(servers)

    process = f"{name}.{next(generation)}"
    target = rng.choice(servers)
    conn = None
    written = 0
    while not deadline.passed():
        if conn is None:
            host, port = target.rsplit(":", 1)
            # No retries: redis-py retries a command after a timeout by default (10 times in 8.x), so
            # one SET of the history could take effect twice, at two points in time.
            conn = redis.Redis(host, int(port), socket_timeout=timeout, socket_connect_timeout=1.0,
                               retry=Retry(NoBackoff(), 0))
        key = f"k{rng.randrange(keys)}"
        if rng.random() < writes:
            written += 1
            value = f"{process}-{written}"
            op = history.invoke(process, "write", key, value)
            try:
                conn.set(key, value)
                history.ok(op)
            except redis.ResponseError as exc:
                text = str(exc)
                if text.startswith(("READONLY", "LOADING")) or "read only replica" in text:
                    history.fail(op, text)
                    leader = text.rpartition("Leader: ")[2].strip()
                    target = leader if leader in servers else rng.choice(servers)
                else:
                    history.info(op, text)
                    process = f"{name}.{next(generation)}"
                    target = another(target)
                conn = None
            except redis.RedisError as exc:
                history.info(op, repr(exc))
                process = f"{name}.{next(generation)}"
                target, conn = another(target), None
        else:
            op = history.invoke(process, "read", key)
            try:
                before, value, after = conn.pipeline(transaction=False).execute_command("ROLE") \
                    .get(key).execute_command("ROLE").execute()
                if before[0] == b"master" and after[0] == b"master":
                    history.ok(op, None if value is None else value.decode())
                else:
                    history.fail(op, "answered by a replica")
                    target, conn = rng.choice(servers), None
            except redis.RedisError as exc:
                history.fail(op, repr(exc))       # a read changes nothing: its outcome does not matter
                target, conn = another(target), None
        time.sleep(rng.uniform(0.005, 0.03))      # the workload's pace: a few dozen ops a second per thread


def main() -> None:
    args = sys.argv[1:]
    healed = None
    if args[0] == "--healed-file":
        healed, args = args[1], args[2:]
    out, seed, seconds, threads, keys, writes, *servers = args
    history = History()
    deadline = Deadline(float(seconds), healed)
    client = out.rsplit("/", 1)[-1].split(".")[0]
    runners = [threading.Thread(target=worker, args=(history, random.Random(f"{seed}-{client}-{i}"), servers,
                                                     int(keys), float(writes), deadline, f"{client}/{i}",
                                                     i % 2 == 0))
               for i in range(int(threads))]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    history.to_jsonl(out)
    print(f"done {len(history)}", flush=True)


if __name__ == "__main__":
    main()
