"""tests.support.counter_node: a replicated counter node in its own process, driven over HTTP.

    python tests/support/counter_node.py METADATA_URL NODE_ID APPLIED_FILE [NAME]

The replication tests and benchmarks/replicate_bench.py start it to SIGKILL a leader for real.
It prints "listening PORT" once its HTTP server (127.0.0.1, a free port) is up, then serves:

    POST /submit   body: a record "<id>:<delta>"  -> 200 {"value": ...} | 409 {"leader", "maybe_in_log"} | 503 {"error": ...}
    GET  /state    -> {"node_id", "is_leader", "leader", "applied", "value", "ready"}
    POST /barrier  -> read_barrier, then /state

Every record it applies is appended to APPLIED_FILE as "<position> <id>", flushed per line, so a
test can read what a node applied even after the node was SIGKILLed.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import walkit
from walkit.errors import NotLeader, WalkitError


class Counter(walkit.StateMachine):
    """Counter adds each record's delta and writes what it applied to a file."""

    def __init__(self, path: str) -> None:
        self.value = 0
        self.out = open(path, "a", buffering=1)

    def apply(self, record: bytes, position):
        ident, _, delta = record.decode().rpartition(":")
        self.value += int(delta)
        self.out.write(f"{position} {ident}\n")
        return self.value

    def snapshot(self, out):
        out.write(str(self.value).encode())

    def restore(self, src) -> None:
        self.value = int(src.read())
        self.out.write("restored\n")


def main() -> None:
    url, node_id, path = sys.argv[1:4]
    name = sys.argv[4] if len(sys.argv) > 4 else "counter"       # the replicated machine's name
    client = walkit.Client(url, add_timeout=2.0, request_timeout=2.0)
    machine = Counter(path)
    node = walkit.replicate(machine, client=client, name=name, node_id=node_id, snapshot_every_records=0)

    def state() -> dict:
        return {"node_id": node_id, "is_leader": node.is_leader, "leader": node.leader,
                "applied": str(node.applied) if node.applied else None, "value": machine.value, "ready": node.ready}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def reply(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self.reply(200, state())

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                if self.path == "/submit":
                    self.reply(200, {"value": node.submit(body, timeout=10)})
                else:
                    node.read_barrier(timeout=10)
                    self.reply(200, state())
            except NotLeader as exc:
                self.reply(409, {"leader": exc.leader, "maybe_in_log": exc.maybe_in_log})
            except WalkitError as exc:
                self.reply(503, {"error": f"{type(exc).__name__}: {exc}"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
