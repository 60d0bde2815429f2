"""Runs KV commands on a State as records would run them, for the key-value store's unit tests."""

from __future__ import annotations

from walkit.adapters.kv import commands  # noqa: F401 - registers every command
from walkit.adapters.kv.execute import run
from walkit.adapters.kv.state import State
from walkit.adapters.kv.table import Context


def as_bytes(args) -> list[bytes]:
    """as_bytes turns a command's arguments into bytes (str and int as their text)."""
    return [a if isinstance(a, bytes) else str(a).encode() for a in args]


class StateApplier:
    """StateApplier applies each write as its own record (the next index) at a stamp, and reads at a clock.

    The test modules wrap it in the calling convention they read best in."""

    def __init__(self, state: State | None = None) -> None:
        self.state = state or State()
        self.index = 0

    def write(self, stamp: int, args):
        """write runs one write command as the next record, at `stamp`; its reply."""
        self.index += 1
        self.state.applying = self.index
        return run(Context(self.state, stamp, writing=True), as_bytes(args))

    def read_at(self, now: int, args):
        """read_at runs a command as a read, at a server's clock `now`, outside any record."""
        return run(Context(self.state, now), as_bytes(args))
