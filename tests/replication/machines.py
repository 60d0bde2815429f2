"""State machines the replication tests run."""

from __future__ import annotations

import json

import walkit


class Counter(walkit.StateMachine):
    """Counter adds each record's integer; it remembers which record ids it applied, in order.

    A record is ``<id>:<delta>`` (the id makes every submission distinguishable). `log` lists
    (position, id) in the order applied, so tests can check "exactly once, in log order".
    """

    def __init__(self) -> None:
        self.value = 0
        self.log: list[tuple[walkit.Position, str]] = []

    def apply(self, record: bytes, position: walkit.Position):
        ident, _, delta = record.decode().rpartition(":")
        self.value += int(delta)
        self.log.append((position, ident))
        return self.value

    def snapshot(self, out):
        state = json.dumps({"value": self.value, "log": [[str(p), i] for p, i in self.log]}).encode()

        def persist() -> None:               # captured now, written later from the snapshot thread
            out.write(state)
        return persist

    def restore(self, src) -> None:
        doc = json.loads(src.read())
        self.value = doc["value"]
        self.log = [(walkit.Position.parse(p), i) for p, i in doc["log"]]
