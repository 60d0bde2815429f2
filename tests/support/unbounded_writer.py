"""A writer process that takes an unbounded ledger over on command (tests of unbounded ledgers).

The rules: docs/internals/protocol.md#unbounded-ledgers.

    python tests/support/unbounded_writer.py METADATA LEDGER_ID NAME

It reads commands from stdin, one per line, and answers on stdout:

- ``take``: reopen the ledger (a new term; the current writer is fenced), print ``took TERM``
  (or ``take failed ERROR: MESSAGE`` if another writer took it meanwhile), then append ``NAME-1``, ``NAME-2``, ... as fast as acknowledgements come, printing ``acked
  ENTRY_ID PAYLOAD`` for each, until the ledger is taken from it (``fenced``) or ``close``;
- ``close``: stop appending, close the ledger and print ``closed LAST_ENTRY_ID``;
- end of input: exit.

Every line is flushed at once, so a test reading stdout knows what was acknowledged even if it
kills this process the next moment.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future

import walkit
from walkit.errors import LedgerFenced, WalkitError

PASSWORD = b"unbounded"
WINDOW = 16                       # appends in flight at once


def say(line: str) -> None:
    print(line, flush=True)


class Writer:
    """Writer appends to the ledger in its term until fenced or told to stop."""

    def __init__(self, client: walkit.Client, ledger_id: int, name: str) -> None:
        self.client = client
        self.ledger_id = ledger_id
        self.name = name
        self.count = 0
        self.handle = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def take(self) -> None:
        self.finish()
        try:
            self.handle = self.client.reopen_ledger(self.ledger_id, password=PASSWORD, timeout=30)
        except WalkitError as exc:          # a writer taking it at the same moment won
            self.handle = None
            say(f"take failed {type(exc).__name__}: {exc}")
            return
        say(f"took {self.handle.metadata.term}")
        self.stop.clear()
        self.thread = threading.Thread(target=self._append, daemon=True)
        self.thread.start()

    def _append(self) -> None:
        pending: list[tuple[bytes, Future]] = []
        while not self.stop.is_set():
            while len(pending) < WINDOW:
                self.count += 1
                payload = f"{self.name}-{self.count}".encode()
                pending.append((payload, self.handle.append_async(payload)))
            payload, future = pending.pop(0)
            try:
                entry_id = future.result(timeout=30)
            except LedgerFenced:
                say("fenced")
                return
            except WalkitError as exc:
                say(f"failed {type(exc).__name__}: {exc}")
                return
            say(f"acked {entry_id} {payload.decode()}")
        for payload, future in pending:       # told to stop: report what still got acknowledged
            try:
                say(f"acked {future.result(timeout=30)} {payload.decode()}")
            except WalkitError:
                return

    def finish(self) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        self.finish()
        metadata = self.handle.close(timeout=30)
        say(f"closed {metadata.last_entry_id}")


def main() -> None:
    metadata, ledger_id, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with walkit.Client(metadata, add_timeout=2, request_timeout=3) as client:
        writer = Writer(client, ledger_id, name)
        for line in sys.stdin:
            command = line.strip()
            if command == "take":
                writer.take()
            elif command == "close":
                writer.close()
        writer.finish()


if __name__ == "__main__":
    main()
