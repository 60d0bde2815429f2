"""walkit.adapters.sqlite.skips is `walkit sqlite skip NAME POSITION`: a record no node can apply, skipped through the log.

The leader applies every record before appending it (SqliteMachine.trial), so a record that
does not apply is rare: one appended before that rule, or by code that differs between nodes.
It stops every node that meets it (ReplicaStopped naming its position). The way out, after
inspecting the record (`inspect`):

1. `record_skip` joins the database as a node that applies nothing, waits to lead, and appends
   a skip record naming the position (records.SKIP). It leads only when no node does: a record
   that a running leader applied is never skipped (its copy has it; replace the stopped nodes'
   files instead), and a node whose published status shows it applied the record refuses too.
2. A node whose record at that position fails looks in the log after it (`skip_recorded`); it
   finds the skip, so it moves past the record without changing its file, and so does every
   node after it, a restore included. Stopped nodes find it when they are started again.

The skip record itself changes nothing where it is applied.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import walkit
from walkit.core.loglist import Position
from walkit.errors import NoSuchLog, WalkitError
from walkit.replication import batch

from walkit.adapters.sqlite.machine import _show as show
from walkit.adapters.sqlite.records import CHANGESET, RecordError, Transaction

#: How long `record_skip` waits to lead the database.
LEAD_WAIT_S = 30.0


class SkipRefused(WalkitError):
    """SkipRefused is raised when a skip is not recorded: the record applies somewhere, or it does not exist."""


def parse(text: str) -> tuple[int, int, int]:
    """parse reads a record position as ReplicaStopped names it: L:E (the entry's first record) or L:E#R."""
    try:
        entry, _, record = text.partition("#")
        ledger, entry_id = entry.split(":")
        return int(ledger), int(entry_id), int(record or 0)
    except ValueError:
        raise SkipRefused(f"{text!r} is not a record position: L:E or L:E#R, as the stopped node names it") from None


def _records(client, name: str, start: Position):
    """_records yields (record position, record) of the log of `name` from entry `start` to its last confirmed one."""
    for entry in client.read_log(f"replicated-{name}", start=start):
        for index, record in enumerate(batch.decode(entry.payload)):
            yield (entry.position.ledger_id, entry.position.entry_id, index), record


def skip_recorded(client, name: str, at: tuple[int, int, int]) -> bool:
    """skip_recorded is True if a skip record of the record at `at` follows it in the log of `name`."""
    try:
        for _, record in _records(client, name, Position(at[0], at[1] + 1)):
            try:
                if Transaction.decode(record).skipped == tuple(at):
                    return True
            except RecordError:
                continue
    except NoSuchLog:
        return False
    return False


@dataclass(frozen=True)
class Inspected:
    """Inspected is the record at a position: its decoded transaction and what it does, one line per step."""

    position: tuple[int, int, int]
    transaction: Transaction
    lines: list[str]


def inspect(client, name: str, at: tuple[int, int, int]) -> Inspected:
    """inspect reads the record at `at` of database `name` and describes it (SkipRefused if there is none)."""
    import apsw
    for position, record in _records(client, name, Position(at[0], at[1])):
        if position[:2] != tuple(at[:2]):
            break
        if position != tuple(at):
            continue
        txn = Transaction.decode(record)
        lines = [f"committed at {txn.commit_ms} ms by {txn.node or '?'}"]
        for kind, value in txn.steps:
            if kind == CHANGESET:
                tables: dict[str, int] = {}
                for change in apsw.Changeset.iter(value):
                    tables[change.name] = tables.get(change.name, 0) + 1
                lines.append("changes: " + ", ".join(f"{table} ({count})" for table, count in tables.items()))
            else:
                lines.append(f"{kind}: {value}")
        return Inspected(tuple(at), txn, lines)
    raise SkipRefused(f"the log of {name!r} holds no record at {show(at)}")


class NoState(walkit.StateMachine):
    """NoState is the state machine of a node that only appends (a skip, an adoption): it applies nothing."""

    def apply(self, record, position):
        return None

    def snapshot(self, out):
        raise WalkitError("a node that only appends keeps no state")

    def restore(self, src) -> None:
        return None


@contextlib.contextmanager
def lead_alone(client, name: str, node_id: str, refuse: Callable[[str | None], Exception]):
    """lead_alone joins database `name` as a node that applies nothing and yields it once it leads.

    It leads only when no node does: `refuse(leader)` is raised if node `leader` leads, and
    `refuse(None)` if leading takes over LEAD_WAIT_S. The node is closed on the way out.
    """
    node = walkit.replicate(NoState(), client=client, name=name, node_id=node_id, snapshot_every_records=0)
    try:
        deadline = time.monotonic() + LEAD_WAIT_S
        while not node.is_leader:
            if node.leader not in (None, node_id):
                raise refuse(node.leader)
            if time.monotonic() > deadline:
                raise refuse(None)
            time.sleep(0.05)
        yield node
    finally:
        node.close()


def record_skip(client, name: str, at: tuple[int, int, int], applied_by: list[str], node_id: str) -> Position:
    """record_skip appends the skip record of `at` as the leader of `name` (see the module doc); it returns its entry.

    `applied_by` names the running nodes that report having applied the record: then nothing is
    recorded. SkipRefused if another node leads.
    """
    if applied_by:
        raise SkipRefused(f"node(s) {', '.join(applied_by)} applied the record at {show(at)}: a record that applies "
                          f"is not skipped; replace the stopped nodes' files (delete them: a new file starts from the "
                          f"latest snapshot)")
    if skip_recorded(client, name, at):
        raise SkipRefused(f"the log of {name!r} skips the record at {show(at)} already; start the stopped nodes again")
    def refuse(leader: str | None) -> SkipRefused:
        if leader is None:
            return SkipRefused(f"could not lead {name!r} within {LEAD_WAIT_S:g} s to record the skip")
        return SkipRefused(f"node {leader!r} leads {name!r}: a leader applies every record it has, so the record at "
                           f"{show(at)} applies there and is not skipped; replace the stopped nodes' files instead")
    with lead_alone(client, name, node_id, refuse) as node:
        skip = Transaction(commit_ms=time.time_ns() // 1_000_000, node=node_id)
        skip.add_skip(at)
        node.submit(skip.encode())
        return node.applied
