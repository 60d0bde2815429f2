"""walkit.replication is the WAL a database embeds: a replicated state machine on a walkit log.

The pattern: docs/internals/protocol.md#replicated-state-machines.

    class Counter(walkit.StateMachine):
        def __init__(self): self.value = 0
        def apply(self, record, position):
            self.value += int(record); return self.value
        def snapshot(self, out): out.write(str(self.value).encode())
        def restore(self, src): self.value = int(src.read())

    node = walkit.replicate(Counter(), client=client, name="counter", node_id="10.0.0.5:7000")
    node.submit(b"1")                 # leader: appended, acknowledged, applied -> apply's result
    node.read_barrier()               # everything acknowledged before this call is applied here

Each node runs an election, the single log writer on the leader (opening the log fences the
previous leader), followers that tail the log, snapshots kept in ledgers with the log truncated
behind them, and linearizable reads. See walkit.replication.node for how, and
docs/guides/replicate.md#guarantees for the guarantees.
"""

from __future__ import annotations

from walkit.replication.machine import StateMachine
from walkit.replication.node import ReplicatedNode
from walkit.replication.snapshots import SnapshotPointer

__all__ = ["ReplicatedNode", "SnapshotPointer", "StateMachine", "replicate"]


def replicate(machine: StateMachine, *, client, name: str, node_id: str, **options) -> ReplicatedNode:
    """replicate makes `machine` one node of replicated machine `name` and starts it.

    `client` is this node's own walkit.Client; `node_id` names the node to the others. Options:
    `password`; the log's `ensemble`, `write_quorum`, `ack_quorum`, `roll_bytes`, `roll_entries`, `roll_age_s`;
    snapshots every `snapshot_every_records` (100,000), `snapshot_every_bytes` (0: off) or
    `snapshot_every_s` (0: off); `retention_s` (0: keep only the latest snapshot and the log after
    it; otherwise keep what rebuilds any state of the last `retention_s` seconds); `lease_ms` (1000; 0: a leader proves it leads on every read
    barrier); `max_record_bytes`, the largest record `submit` takes (default and most: the
    client's `max_entry_bytes`, 60 MiB by default, less 9 bytes of entry framing; a larger record
    raises walkit.errors.RecordTooLarge at once and is refused, never split, and the leadership is
    untouched); group commit limits `max_batch_records`, `max_batch_bytes`, `max_entries_in_flight`,
    and `linger_ms` (0: off; at most 60,000), how long the batch after an acknowledged entry may
    wait for a record of each submitter that entry answered or that was queued behind it
    (`submit_async(record, submitter)` names them; by default each record is one); `explicit_lac_ms`,
    how long the leader stays idle before it tells the bookies how far the log is acknowledged
    (100): the longest a follower waits to see the last record when nothing follows it; `follow_linger_ms`,
    how long a follower that applied everything waits before it asks the bookies for more (10; 0: at
    once), so records that arrive together are read together, in one answer instead of one long poll
    each, at the cost of applying them up to that much later (a read_barrier on the follower does not
    wait for it); `poll_s`, how often failed reads are retried (0.2); `tail_poll_s`, how long
    an idle follower long-polls the bookies before it reads the ledger's metadata again (30; a
    watch of the log's metadata makes it look at once after a roll or a leader change); `on_role(role)`, called with
    "leader" or "follower" when this node's role changes; `campaign_when()`, asked before each
    campaign round (False: follow without campaigning for now); `keep_log_from()`, the earliest
    log position the application still reads (snapshots truncate the log only before it; None:
    nowhere). It returns the started
    ReplicatedNode: submit, submit_async, is_leader, leader, applied, lag, ready, wait_ready,
    read_barrier, wait_applied, snapshot_now, step_down, close.
    """
    return ReplicatedNode(machine, client=client, name=name, node_id=node_id, **options).start()
