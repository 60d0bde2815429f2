"""walkit.core.distribution holds the quorum arithmetic of ledgers, as pure functions.

This is walkit's counterpart of BookKeeper's DistributionSchedule and etcd raft's `quorum/`:

- the write set of entry e in an ensemble of E bookies is ensemble[(e + i) % E] for i < Qw
  (docs/internals/protocol.md#write-sets); there are E distinct write sets, one if Qw == E;
- an entry is replicated once Qa bookies of its write set acknowledged it 
  (docs/internals/protocol.md#ack-quorum);
- a ledger is fenced once EC = (E - Qa) + 1 bookies of its last ensemble answered a fencing
  request: at most Qa - 1 bookies can then still accept the old writer's adds, too few for any
  write set to reach Qa (docs/internals/protocol.md#fencing);
- during recovery an entry is absent only when QC = (Qw - Qa) + 1 bookies of its write set said
  NO_SUCH_ENTRY: an entry acknowledged to a client sits on Qa of its Qw bookies, so at most
  Qw - Qa of them can lack it (docs/internals/protocol.md#recovery).
"""

from __future__ import annotations

from typing import Sequence


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """write_set returns the ensemble indices that store `entry_id`, in write order."""
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum))


def write_set_bookies(entry_id: int, ensemble: Sequence[str], write_quorum: int) -> tuple[str, ...]:
    """write_set_bookies returns the addresses that store `entry_id` in `ensemble`."""
    size = len(ensemble)
    return tuple(ensemble[(entry_id + i) % size] for i in range(write_quorum))


def ensemble_coverage(ensemble_size: int, ack_quorum: int) -> int:
    """ensemble_coverage is EC = (E - Qa) + 1, the answers that make a fence hold."""
    return ensemble_size - ack_quorum + 1


def absent_quorum(write_quorum: int, ack_quorum: int) -> int:
    """absent_quorum is QC = (Qw - Qa) + 1, the NO_SUCH_ENTRY answers that prove an entry absent."""
    return write_quorum - ack_quorum + 1


def is_replicated(acked: int, ack_quorum: int) -> bool:
    """is_replicated tells whether `acked` bookies of a write set reach the ack quorum."""
    return acked >= ack_quorum


def write_sets_of(ensemble: Sequence[str], write_quorum: int) -> list[tuple[str, ...]]:
    """write_sets_of lists the E write sets of an ensemble; entry e uses item e % E."""
    return [write_set_bookies(i, ensemble, write_quorum) for i in range(len(ensemble))]
