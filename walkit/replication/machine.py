"""walkit.replication.machine defines StateMachine, the whole contract a replicated service writes.

Like hashicorp/raft's FSM: `apply` one record, `snapshot` the state, `restore` it. Everything
else (election, fencing the previous leader, the log, followers, snapshots in ledgers,
truncation, step-down) is walkit.replicate's.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable

from walkit.core.loglist import Position


class StateMachine:
    """StateMachine is the state a database replicates through walkit.replicate.

    Subclass it and implement the three methods. They are called from one thread at a time (the
    node's apply thread), never concurrently with each other.
    """

    def apply(self, record: bytes, position: Position) -> Any:
        """apply applies one record and returns its result (handed to the leader's submitter).

        It must be deterministic: every node applies the same records in the same order and
        must reach the same state. Take time, randomness and configuration from the record, not
        from the machine running it. `position` is the log entry holding the record (records
        submitted together share an entry). An exception is the record's result too: the
        submitter gets it, and every node sees the same one.
        """
        raise NotImplementedError

    def snapshot(self, out: BinaryIO) -> Callable[[], None] | None:
        """snapshot writes the state to `out`, a binary file-like object.

        It is called between two entries, and records wait while it runs. A machine with a large
        state can capture a consistent view quickly and return a function that writes it to
        `out` afterwards, from another thread, while records are applied again (hashicorp/raft's
        FSMSnapshot.Persist); return None when everything is written already.
        """
        raise NotImplementedError

    def restore(self, src: BinaryIO) -> None:
        """restore replaces the state with one that `snapshot` wrote, read from `src`."""
        raise NotImplementedError
