"""walkit.autorecovery brings every entry back to its write quorum after bookies are lost.

BookKeeper's AutoRecovery, in four parts:

- `marks` (UnderReplication): the metadata keys: under-replicated ledgers, their locks, the
  cluster-wide switch, the bookies an auditor has seen, decommissions;
- `auditor` (Auditor): the elected auditor notices lost bookies after `lost_bookie_delay_s`,
  marks the ledgers with fragments on them (paging through ledgers, throttled), and
  periodically checks that entries are on their bookies;
- `worker` (ReplicationWorker) and `replicator` (Replicator): every bookie takes marks under a
  lock, copies the entries from surviving replicas to a bookie chosen by the placement policy,
  and rewrites the ledger's metadata by compare-and-swap;
- `daemon` (AutoRecovery, RecoveryConfig): both in one process, as bookies run them.

    recovery = AutoRecovery("zk://127.0.0.1:2181/walkit", "10.0.0.7:3181", RecoveryConfig(lost_bookie_delay_s=30))
    recovery.start(); ...; recovery.close()
    UnderReplication(store).set_enabled(False)           # walkit auditor disable
"""

from walkit.autorecovery.auditor import Auditor
from walkit.autorecovery.daemon import AutoRecovery, RecoveryConfig
from walkit.autorecovery.marks import DECOMMISSION, LOST, MISSING, Mark, UnderReplication
from walkit.autorecovery.replicator import RepairError, ReplicationStats, Replicator
from walkit.autorecovery.worker import ReplicationWorker

__all__ = ["Auditor", "AutoRecovery", "DECOMMISSION", "LOST", "MISSING", "Mark", "RecoveryConfig", "RepairError",
           "ReplicationStats", "ReplicationWorker", "Replicator", "UnderReplication"]
