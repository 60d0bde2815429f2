"""A node of a walkit.adapters.sqlite database in a process of its own, running SQL it is sent over stdin.

    python tests/adapters/sqlite_sql_node.py METADATA NAME NODE_ID FILE [CONNECT_OPTIONS_JSON]

Each line of stdin is a JSON request, answered by one JSON line on stdout (rows as lists):

- {"op": "state"}: is_leader, leader, position;
- {"op": "transaction", "statements": [[sql, params], ...], "then": sql}: runs the statements
  in one transaction (`with conn:`) and answers their rows, then runs `then` at once (no read
  barrier: what this node's file holds right after COMMIT returned) and answers its rows;
- {"op": "read", "sql": sql, "barrier": bool}: rows of a read (after a read barrier if asked);
- {"op": "time", "sql": sql, "count": n}: runs `sql` n times, one transaction each, and answers
  each COMMIT's latency in milliseconds;
- {"op": "stream", "sql": sql, "count": n}: runs `sql` with parameter NODE_ID-i n times, one
  transaction each, going on after errors; answers each one's outcome: "ok" (COMMIT returned),
  "unknown" (CommitFailed: it may or may not be in the log) or the class of any other error
  (nothing was committed);
- {"op": "quit"}.

An error is answered as {"error": class name, "message": text}.
"""

from __future__ import annotations

import json
import sys
import time

import walkit.adapters.sqlite as sqlite3      # the program is written for the sqlite3 module


def main() -> None:
    metadata, name, node_id, path = sys.argv[1:5]
    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    conn = sqlite3.connect(path, name=name, metadata=metadata, node_id=node_id, **options)

    def reply(doc: dict) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    reply({"ready": True, "is_leader": conn.is_leader})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request["op"]
        if op == "quit":
            break
        try:
            if op == "state":
                reply({"is_leader": conn.is_leader, "leader": conn.leader, "position": str(conn.position)})
            elif op == "transaction":
                results = []
                with conn:
                    for sql, params in request["statements"]:
                        results.append([list(row) for row in conn.execute(sql, params).fetchall()])
                then = [list(row) for row in conn.execute(request["then"]).fetchall()] if request.get("then") else None
                reply({"results": results, "then": then, "is_leader": conn.is_leader})
            elif op == "read":
                if request.get("barrier"):
                    conn.read_barrier()
                reply({"rows": [list(row) for row in conn.execute(request["sql"]).fetchall()]})
            elif op == "time":
                latencies = []
                for i in range(request["count"]):
                    started = time.perf_counter()
                    with conn:
                        conn.execute(request["sql"], (f"{node_id}-{i}",))
                    latencies.append((time.perf_counter() - started) * 1000)
                reply({"latencies_ms": latencies, "is_leader": conn.is_leader})
            elif op == "stream":
                outcomes = []
                for i in range(request["count"]):
                    ident = f"{node_id}-{i}"
                    try:
                        with conn:
                            conn.execute(request["sql"], (ident,))
                        outcomes.append([ident, "ok"])
                    except sqlite3.CommitFailed:
                        outcomes.append([ident, "unknown"])
                    except sqlite3.Error as exc:
                        outcomes.append([ident, type(exc).__name__])
                        time.sleep(0.05)           # paces retries while a new leader is elected
                reply({"outcomes": outcomes, "is_leader": conn.is_leader})
            else:
                reply({"error": "ValueError", "message": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001 - the test reads the error
            reply({"error": type(exc).__name__, "message": str(exc)})
    conn.close()


if __name__ == "__main__":
    main()
